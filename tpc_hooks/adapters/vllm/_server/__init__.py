"""``tpc-hooks serve``: vLLM's OpenAI-compatible server with monitors on every request, in the
server's process: which monitors it runs (``_monitors``), what it counts in ``/metrics``
(``_metrics``, ``_drift``), and the server itself (``_serve``), which needs the ``serve`` extra.
"""

from collections.abc import Callable


def server() -> Callable[[list[str]], int]:
    """``tpc-hooks serve``'s entry, ``main(argv)``. Its module needs the ``serve`` extra (vLLM,
    prometheus-client) and is imported here, when asked for: an ``ImportError`` says the extra is
    missing."""
    from .serve import main

    return main
