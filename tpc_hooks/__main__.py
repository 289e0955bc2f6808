"""``python -m tpc_hooks`` runs the ``tpc-hooks`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
