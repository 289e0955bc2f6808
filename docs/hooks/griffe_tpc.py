"""Griffe extension for the API reference: reads tpc-hooks' docstrings as they are written.

The docstrings follow Google style with two habits from Sphinx that mkdocstrings does not read
by itself; this extension translates them at build time, leaving the source untouched:

* ``Example:`` sections hold doctests: they become ``Examples:`` sections, which Griffe
  renders as code (an ``Example:`` admonition would render ``>>>`` lines as quotes);
* ``:func:`name```-style roles become inline code, linked to the documented object when the
  name resolves to a public one (an unresolved name stays plain code, never a broken link);
* reStructuredText simple tables (``====  ====`` borders) become Markdown tables.

It also marks names re-exported with a redundant alias (``from ._x import f as f``, the
package's convention for its public face) as public in modules without an ``__all__``.
"""

import ast
import html
import re
from typing import Any

import griffe

PUBLIC_MODULES = (
    "tpc_hooks",
    "tpc_hooks.adapters",
    "tpc_hooks.baselines",
    "tpc_hooks.data",
    "tpc_hooks.metrics",
    "tpc_hooks.offline",
    "tpc_hooks.pooling",
    "tpc_hooks.synthetic",
    "tpc_hooks.views",
)

_ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|exc|obj):`(~?)([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_BORDER = re.compile(r"^=+(?: +=+)+ *$")


class TPCDocstrings(griffe.Extension):
    """Rewrites roles and ``Example:`` sections; publishes redundant aliases."""

    def __init__(self) -> None:
        super().__init__()
        self._redundant: set[tuple[str, str]] = set()

    def on_alias_instance(self, *, node: Any, alias: griffe.Alias, agent: Any, **kwargs: Any) -> None:
        if isinstance(node, ast.ImportFrom):
            for name in node.names:
                if name.asname is not None and name.asname == name.name == alias.name:
                    self._redundant.add((alias.parent.path, alias.name))

    def on_package(self, *, pkg: griffe.Module, loader: Any, **kwargs: Any) -> None:
        if pkg.path != "tpc_hooks":
            return
        for module_path, name in self._redundant:
            module = _lookup(pkg, module_path)
            if module is not None and module.exports is None and not name.startswith("_"):
                module.members[name].public = True
        index = _public_index(pkg)
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj.docstring.value, obj, index)


def _lookup(pkg: griffe.Module, path: str) -> Any:
    try:
        return pkg if path == pkg.path else pkg[path[len(pkg.path) + 1 :]]
    except (KeyError, griffe.AliasResolutionError):
        return None


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias and member.parent is obj:
            yield from _walk(member)


def _public_index(pkg: griffe.Module) -> dict[str, list[str]]:
    """Short names ("fit", "Monitor.score") to the public paths that document them."""
    index: dict[str, list[str]] = {}

    def add(key: str, path: str) -> None:
        if path not in index.setdefault(key, []):
            index[key].append(path)

    for module_path in PUBLIC_MODULES:
        module = _lookup(pkg, module_path)
        if module is None:
            continue
        for name, member in module.members.items():
            try:
                if not member.is_public or member.is_module:
                    continue
                path = f"{module_path}.{name}"
                add(name, path)
                add(path, path)
                if member.is_class:
                    for sub in member.all_members:
                        if not sub.startswith("_"):
                            add(f"{name}.{sub}", f"{path}.{sub}")
                            add(f"{path}.{sub}", f"{path}.{sub}")
            except griffe.AliasResolutionError:
                continue
    return index


def _resolve(target: str, obj: griffe.Object, index: dict[str, list[str]]) -> str | None:
    candidates = []
    owner = obj.parent if (obj.is_function or obj.is_attribute) and obj.parent is not None else None
    if owner is not None and owner.is_class and "." not in target:
        candidates.append(f"{owner.name}.{target}")
    if obj.is_class and "." not in target:
        candidates.append(f"{obj.name}.{target}")
    candidates.append(target)
    for key in candidates:
        paths = index.get(key, [])
        if len(paths) == 1:
            return paths[0]
        if f"tpc_hooks.{key}" in paths:  # a top-level name that a namespace re-exports too
            return f"tpc_hooks.{key}"
    return None


def _rst_tables(text: str) -> str:
    """Simple tables (top border, header, border, rows, bottom border) as Markdown tables.

    A row whose first column is blank continues the row above it, as in reStructuredText.
    """
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        borders = [j for j in range(i, len(lines)) if _BORDER.match(lines[j])][:3]
        if len(borders) < 3 or borders[0] != i or len({lines[j].rstrip() for j in borders}) != 1:
            out.append(lines[i])
            i += 1
            continue
        spans = [m.span() for m in re.finditer(r"=+", lines[i])]
        spans[-1] = (spans[-1][0], None)

        def cells(line: str, spans: list = spans) -> list[str]:
            return [line[a:b].strip() for a, b in spans]

        header = [cells(line) for line in lines[borders[0] + 1 : borders[1]]]
        rows: list[list[str]] = []
        for line in lines[borders[1] + 1 : borders[2]]:
            row = cells(line)
            if rows and not row[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], row, strict=False)]
            elif any(row):
                rows.append(row)
        out.append("| " + " | ".join(" ".join(h[k] for h in header).strip() for k in range(len(spans))) + " |")
        out.append("|" + "---|" * len(spans))
        out.extend("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)
        i = borders[2] + 1
    return "\n".join(out)


def _rewrite(text: str, obj: griffe.Object, index: dict[str, list[str]]) -> str:
    text = _EXAMPLE.sub(r"\1Examples:", text)
    if "==" in text:
        text = _rst_tables(text)

    def role(match: re.Match) -> str:
        short, target = match.group(1), match.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        path = _resolve(target, obj, index)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{html.escape(path)}" optional><code>{html.escape(shown)}</code></autoref>'

    return _ROLE.sub(role, text)
