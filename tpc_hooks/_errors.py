"""The one exception class of tpc-hooks."""


class TPCHooksError(ValueError):
    """Raised for bad input, a bad saved file or a mismatched model.

    It subclasses ``ValueError`` so code that already catches ``ValueError`` keeps
    working. Messages say what was expected, what arrived and the likely fix.
    """


# Shown where users catch and read it (tracebacks, doctests, the API reference): the public path, which
# does not move when the implementation does.
TPCHooksError.__module__ = "tpc_hooks"


_WARNED: set[str] = set()


def deprecated(old: str, new: str) -> None:
    """Warns, once per process, that ``old`` is deprecated in favour of ``new``: a ``FutureWarning``,
    which Python shows by default (a ``DeprecationWarning`` is hidden outside ``__main__``).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     deprecated("old_name_for_the_doctest", "new_name"); deprecated("old_name_for_the_doctest", "new_name")
        >>> [str(w.message) for w in seen]
        ['old_name_for_the_doctest is deprecated; use new_name']
    """
    if old in _WARNED:
        return
    _WARNED.add(old)
    import warnings

    warnings.warn(f"{old} is deprecated; use {new}", FutureWarning, stacklevel=3)
