"""The vocabulary of tpc-hooks' contract with vLLM (the table is ``surface``): a row per vLLM
name the plugin uses (:class:`Row`), the static checks a row carries (:class:`Check`: parameters,
fields, abstract methods, properties, source text where nothing better exists), and what a check
finds (:class:`Finding`). Imports no vLLM: a check imports what it inspects when it runs, and a
module that does not import marks its rows MISSING with the error, without stopping the others.
"""

import ast
import dataclasses
import hashlib
import importlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OK, MISSING, CHANGED, SKIPPED = "OK", "MISSING", "CHANGED", "SKIPPED"
# how the plugin uses a name: imports it; subclasses it; overrides a method of it; calls it; reads or
# writes an attribute; replaces a module attribute while vLLM builds a model; relies on a signature it
# does not call or override itself; relies on a behaviour
KINDS = ("import", "subclass", "override", "call", "read", "write", "patch", "signature", "behaviour")
# static: introspection of the installed vLLM, without an engine; runtime: a live engine's worker; both
WHEN = ("static", "runtime", "both")
_ABSENT = object()


@dataclass(frozen=True)
class Finding:
    """What a check found for one row: OK, MISSING (it does not import or has no such attribute),
    CHANGED (it is there but not as the plugin uses it), or SKIPPED (a runtime check for the model
    runner that does not run here), with what differs."""

    name: str
    status: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.status:<8} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class Target:
    """What a check inspects: ``owner.attr`` (``obj``, or ``_ABSENT``), or a module (``attr`` None)."""

    owner: Any
    attr: str | None
    obj: Any


@dataclass(frozen=True)
class Check:
    """A static check: ``test(target)`` returns None when vLLM is as the plugin uses it, else what
    differs. ``at``: the object it inspects, when that is not the row's own name (an instance
    attribute is checked where its class declares or sets it). ``parts``: several checks, all held.
    ``any_part``: one of ``parts`` holds, not all. ``on_owner``: it inspects the attribute's class
    (a field, a property), not the attribute's value."""

    what: str
    test: Callable[[Target], str | None] | None = None
    at: str | None = None
    parts: tuple["Check", ...] = ()
    any_part: bool = False
    on_owner: bool = False


@dataclass(frozen=True)
class Row:
    """One vLLM name the plugin uses.

    ``name``: ``module:qualname`` in vLLM, then for a behaviour ``(what is relied on)``; ``ours``:
    the functions of ours that need it, ``module:qualname`` under ``tpc_hooks``; ``check``: the
    static check (``when`` static or both); ``live``: the runtime check's key in ``recorder.CHECKS``
    (``when`` runtime or both; ``v1.`` / ``v2.`` keys run on that model runner only), or the test of a
    live server that covers it (``tests/...::test_...``); ``also``: other spellings by which our
    source reaches the same name (an attribute of a call's result)."""

    name: str
    kind: str
    ours: tuple[str, ...]
    when: str
    check: Check | None = None
    live: str | None = None
    also: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The dotted path, without the behaviour's words: ``vllm.x.y.Cls.attr``."""
        return self.name.split(" (")[0].replace(":", ".")


def row(
    name: str,
    kind: str,
    ours: str | tuple[str, ...],
    check: Check | None = None,
    live: str | None = None,
    also: tuple[str, ...] = (),
) -> Row:
    """A row; ``when`` follows from which checks it has (a static check, a runtime one, or both)."""
    when = "both" if check and live else "static" if check else "runtime"
    return Row(name, kind, (ours,) if isinstance(ours, str) else ours, when, check, live, also)


# ---------------------------------------------------------------------------------------------- checks
def exists(at: str | None = None) -> Check:
    """It imports, and the attribute is there."""
    return Check("exists", lambda t: None, at)


def params(*names: str, more: bool = False, at: str | None = None) -> Check:
    """Its parameters are ``names`` in this order (``more``: these first, then any others)."""

    def test(t: Target) -> str | None:
        got = list(inspect.signature(t.obj).parameters)
        same = got[: len(names)] == list(names) if more else got == list(names)
        return None if same else f"parameters {got}, expected {list(names)}{' first' if more else ''}"

    return Check(f"parameters ({', '.join(names)}{', ...' if more else ''})", test, at)


def has_params(*names: str, at: str | None = None) -> Check:
    """Among its parameters, in any order."""

    def test(t: Target) -> str | None:
        got = list(inspect.signature(t.obj).parameters)
        lost = [n for n in names if n not in got]
        return None if not lost else f"no parameter {lost} (parameters {got})"

    return Check(f"has parameters {', '.join(names)}", test, at)


def declared(cls: Any) -> set[str]:
    """The fields a class declares: a dataclass's (pydantic's too), a NamedTuple's, a msgspec
    Struct's, a pydantic model's, else its annotations along the MRO."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    for attr in ("_fields", "__struct_fields__", "model_fields"):
        if isinstance(getattr(cls, attr, None), (tuple, dict)):
            return set(getattr(cls, attr))
    return {n for c in getattr(cls, "__mro__", ()) for n in getattr(c, "__annotations__", {})}


def field(*names: str, at: str | None = None) -> Check:
    """Declared fields of a class: ``names``, or (none given) the row's own attribute of its class."""

    def test(t: Target) -> str | None:
        cls, want = (t.obj, names) if names else (t.owner, (t.attr,))
        got = declared(cls)
        lost = [n for n in want if n not in got]
        return None if not lost else f"{getattr(cls, '__name__', cls)} declares no {lost} (fields: {sorted(got)})"

    return Check(f"field {', '.join(names)}" if names else "field", test, at, on_owner=not names)


def _static(t: Target) -> Any:
    return inspect.getattr_static(t.owner, t.attr or "")


def prop() -> Check:
    """A property of its class (read as an attribute, computed)."""
    return Check(
        "property",
        lambda t: None if isinstance(_static(t), property) else f"not a property: {_static(t)!r}",
        on_owner=True,
    )


def classmethod_() -> Check:
    return Check(
        "classmethod",
        lambda t: None if isinstance(_static(t), classmethod) else f"not a classmethod: {_static(t)!r}",
        on_owner=True,
    )


def abstract(*names: str) -> Check:
    """Its abstract methods are exactly ``names`` (one more makes our subclass uninstantiable)."""

    def test(t: Target) -> str | None:
        got = set(getattr(t.obj, "__abstractmethods__", ()))
        return None if got == set(names) else f"abstract methods {sorted(got)}, expected {sorted(names)}"

    return Check(f"abstract methods {', '.join(names)}", test)


def attrs(*names: str, at: str | None = None) -> Check:
    """Has these attributes (a class's methods, a module's names)."""

    def test(t: Target) -> str | None:
        lost = [n for n in names if not hasattr(t.obj, n)]
        return None if not lost else f"no attribute {lost}"

    return Check(f"has {', '.join(names)}", test, at)


def source(*snippets: str, at: str | None = None) -> Check:
    """Its source contains each snippet (for what no signature or field shows: a message's format,
    an id's shape, a name looked up when a model is built)."""

    def test(t: Target) -> str | None:
        text = inspect.getsource(t.obj)
        lost = [s for s in snippets if s not in text]
        return None if not lost else f"its source no longer contains {lost}"

    return Check(f"source has {', '.join(map(repr, snippets))}", test, at)


def text(module: str, *snippets: str) -> Check:
    """The file of ``module`` contains each snippet, read without importing it (for a module that
    needs what the environment leaves out: the multimodal models need torchvision)."""

    def test(t: Target) -> str | None:
        import importlib.util

        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return f"no module {module}"
        with open(spec.origin, encoding="utf-8") as f:
            body = f.read()
        lost = [s for s in snippets if s not in body]
        return None if not lost else f"{module} no longer contains {lost}"

    return Check(f"{module} has {', '.join(map(repr, snippets))}", test, module.rpartition(".")[0])


def code_digest(obj: Any) -> str:
    """A digest of a function's code, blind to comments and layout (its AST)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def digest(*known: str, at: str | None = None) -> Check:
    """Its code is one of the versions ``known`` (for a body of vLLM's that ours copies)."""

    def test(t: Target) -> str | None:
        got = code_digest(t.obj)
        return None if got in known else f"its code changed (digest {got}; known {list(known)}): compare ours"

    return Check("code as known", test, at)


def subclass(of: str) -> Check:
    """A subclass of ``of`` (``module:qualname``)."""

    def test(t: Target) -> str | None:
        module, _, qual = of.partition(":")
        base: Any = importlib.import_module(module)
        for part in qual.split("."):
            base = getattr(base, part)
        return None if isinstance(t.obj, type) and issubclass(t.obj, base) else f"not a subclass of {of}"

    return Check(f"subclass of {of}", test)


def holds(test: Callable[[Any], str | None], what: str, at: str | None = None) -> Check:
    """Any other check: ``test(obj)`` returns None, or what differs."""
    return Check(what, lambda t: test(t.obj), at)


def either(*checks: Check) -> Check:
    """One of these holds (a name vLLM moved: its place in each supported release)."""
    return Check(" or ".join(c.what for c in checks), parts=checks, any_part=True)


def every(*checks: Check) -> Check:
    return Check("; ".join(c.what for c in checks), parts=checks)


def ours(name: str) -> Any:
    """An object of ours, ``module:qualname`` under ``tpc_hooks`` (imported: in vLLM's environment)."""
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(f"tpc_hooks.{module}")
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------- running
class _Missing(Exception):
    pass


def resolve(name: str, modules: dict[str, Any]) -> Target:
    """``module:qualname`` -> the object (``modules`` caches each import, or the error it raised)."""
    module, _, qual = name.split(" (")[0].partition(":")
    if module not in modules:
        try:
            modules[module] = importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - whatever stops a module importing is its finding
            modules[module] = _Missing(f"{module} does not import: {type(err).__name__}: {err}")
    obj = modules[module]
    if isinstance(obj, _Missing):
        raise obj
    parts = [p for p in qual.split(".") if p]
    owner, attr = obj, None
    for k, part in enumerate(parts):
        owner, attr, obj = obj, part, getattr(obj, part, _ABSENT)
        if obj is _ABSENT and k < len(parts) - 1:
            raise _Missing(f"{module}:{'.'.join(parts[:k])} has no attribute {part!r}".replace(":.", ":"))
    return Target(owner, attr, obj)


def _has_static(t: Target) -> bool:
    """A declared field may have no class attribute (no default), but a property always has one."""
    try:
        inspect.getattr_static(t.owner, t.attr or "")
        return True
    except AttributeError:
        return t.attr in declared(t.owner)


def _run(check: Check, name: str, modules: dict[str, Any]) -> tuple[str, str]:
    if check.parts:
        found = [_run(part, name, modules) for part in check.parts]
        if check.any_part:
            return (OK, "") if any(st == OK for st, _ in found) else (found[0][0], "; ".join(d for _, d in found))
        return next(((st, d) for st, d in found if st != OK), (OK, ""))
    try:
        target = resolve(check.at or name, modules)
    except _Missing as err:
        return MISSING, str(err)
    if target.obj is _ABSENT and not (check.on_owner and _has_static(target)):
        module, _, qual = (check.at or name).split(" (")[0].partition(":")
        owner = f"{module}:{qual.rpartition('.')[0]}" if "." in qual else module
        return MISSING, f"{owner} has no attribute {target.attr!r}"
    try:
        diff = check.test(target) if check.test is not None else None
    except Exception as err:  # noqa: BLE001 - a changed API fails the check in its own way: that is the finding
        diff = f"{type(err).__name__}: {err}"
    return (OK, "") if diff is None else (CHANGED, diff)


def run_static(rows: tuple[Row, ...]) -> list[Finding]:
    """Each row's static check against the installed vLLM, in the table's order."""
    modules: dict[str, Any] = {}
    out = []
    for r in rows:
        if r.check is not None:
            status, detail = _run(r.check, r.name, modules)
            out.append(Finding(r.name, status, detail))
    return out
