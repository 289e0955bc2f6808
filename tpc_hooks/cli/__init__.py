"""The ``tpc-hooks`` command line (``main``) and the demo it runs.

What is in the folder: the verbs' bodies (``_verbs``), what each verb accepts (``_grammar``), the
checks its inputs pass before a model loads (``_checks``), the one way it reads a user's labelled
prompts (``_data``), what it prints (``_output``), and the demo (``_demo``) with its report
(``_demo_report``). The folder imports the package's other folders and faces; nothing imports it
but ``tpc_hooks.__main__``.
"""

from ._verbs import main as main

__all__ = ["main"]
