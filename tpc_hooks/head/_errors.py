"""The one exception class of tpc-hooks."""


class TPCHooksError(ValueError):
    """Raised for bad input, a bad saved file or a mismatched model.

    It subclasses ``ValueError`` so code that already catches ``ValueError`` keeps
    working. Messages say what was expected, what arrived and the likely fix.
    """


# Shown where users catch and read it (tracebacks, doctests, the API reference): the public path, which
# does not move when the implementation does.
TPCHooksError.__module__ = "tpc_hooks"
