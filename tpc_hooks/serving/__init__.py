"""What runs inside vLLM: the worker extension that scores every request each step, and
``tpc-hooks serve`` (vLLM's OpenAI-compatible server with monitors on every request).

Imports vLLM only inside functions: importing this package never needs vLLM.
"""

from collections.abc import Callable

from ._saes import read_sae as read_sae


def server() -> Callable[[list[str]], int]:
    """``tpc-hooks serve``'s entry, ``main(argv)``. Its module needs the ``serve`` extra (vLLM,
    prometheus-client) and is imported here, when asked for: an ``ImportError`` says the extra is
    missing."""
    from ._vllm_serve import main

    return main
