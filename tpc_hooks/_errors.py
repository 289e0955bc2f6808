"""The one exception class of tpc-hooks."""


class TPCHooksError(ValueError):
    """Raised for bad input, a bad saved file or a mismatched model.

    It subclasses ``ValueError`` so code that already catches ``ValueError`` keeps
    working. Messages say what was expected, what arrived and the likely fix.
    """
