"""The package's public surface is declared: every public module has an ``__all__`` whose names
exist, the tutorials and the README use declared names only, and the benchmarks and tutorials
import public modules only (read from their source, so the toolkit adapter modules are checked
without importing their toolkit)."""

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import tpc_hooks

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tpc_hooks"


def public_modules() -> list[str]:
    """Every module of the package whose dotted path has no part starting with an underscore."""
    names = []
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(parts))
    return names


def declared(module: str) -> list[str]:
    """The module's ``__all__``, read from its source."""
    path = PKG.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module} declares no __all__")


def defined(module: str) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports), from its source."""
    path = PKG.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # NAME: type = value
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


FOLDERS = (
    "head",
    "saving",
    "activations",
    "monitoring",
    "training",
    "sae",
)  # private workshops
FACES = [m for m in public_modules() if m.removeprefix("tpc_hooks.") not in FOLDERS]


def test_the_public_modules_are_the_documented_ones():
    # a new public module is a new promise: it gets an API page (docs/api/) and a line here
    assert set(FACES) == {
        "tpc_hooks",
        "tpc_hooks.adapters",
        "tpc_hooks.adapters.nnsight",
        "tpc_hooks.adapters.transformer_lens",
        "tpc_hooks.adapters.transformers",
        "tpc_hooks.adapters.vllm",
        "tpc_hooks.baselines",
        "tpc_hooks.cli",
        "tpc_hooks.data",
        "tpc_hooks.metrics",
        "tpc_hooks.offline",
        "tpc_hooks.pooling",
        "tpc_hooks.recipes",
        "tpc_hooks.synthetic",
        "tpc_hooks.views",
    }


def test_the_public_names_are_the_recorded_ones():
    """Every public module's ``__all__`` is the one recorded in ``tests/public_api.json``: moving code
    between folders leaves the API where it was, and a name added or removed is a decision that updates
    the record (and the changelog) in the same change."""
    recorded = json.loads((ROOT / "tests" / "public_api.json").read_text())
    assert sorted(recorded) == sorted(FACES)
    changed = {
        m: sorted(set(declared(m)) ^ set(names)) for m, names in recorded.items() if sorted(declared(m)) != names
    }
    assert changed == {}


@pytest.mark.parametrize("module", FACES)
def test_every_public_module_declares_its_names(module):
    names = declared(module)
    assert len(names) == len(set(names)), f"{module}.__all__ repeats a name"
    assert set(names) <= defined(module), (
        f"{module}.__all__ names what it does not define: {set(names) - defined(module)}"
    )


def test_the_workshop_folders_promise_nothing():
    """The workshop folders are private: their ``__init__`` hands on what the package's other folders
    use of them (the import-linter contract has every crossing go through it), and declares no
    ``__all__``, so that every public name has one documented path (the faces')."""
    for folder in FOLDERS:
        body = ast.parse((PKG / folder / "__init__.py").read_text()).body
        assert isinstance(body[0], ast.Expr), f"{folder}/__init__.py opens with its docstring"
        assert "__all__" not in {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets}, folder


@pytest.mark.parametrize(
    "module",
    [
        "tpc_hooks",
        "tpc_hooks.adapters",
        "tpc_hooks.baselines",
        "tpc_hooks.cli",
        "tpc_hooks.data",
        "tpc_hooks.metrics",
        "tpc_hooks.offline",
        "tpc_hooks.pooling",
        "tpc_hooks.recipes",
        "tpc_hooks.synthetic",
        "tpc_hooks.views",
    ],
)
def test_declared_names_import(module):
    mod = importlib.import_module(module)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == []


_FROM = re.compile(r"^\s*from (tpc_hooks(?:\.[a-z_]+)*) import ([^\n#]+)", re.MULTILINE)
_ATTR = re.compile(r"\btpc\.([A-Za-z_]+)\b")


def imported_names(text: str) -> list[tuple[str, str]]:
    """(module, name) for every ``from tpc_hooks... import name`` and ``tpc.name`` in ``text``."""
    out = []
    for module, names in _FROM.findall(text):
        for name in names.strip("() ").split(","):
            if name.strip():
                out.append((module, name.split(" as ")[0].strip()))
    out += [("tpc_hooks", name) for name in _ATTR.findall(text)]
    return out


SOURCES = sorted((ROOT / "tutorials").glob("[0-9]*.py")) + [
    ROOT / "README.md",
    ROOT / "docs" / "tours.md",
    ROOT / "docs" / "getting-started.md",
]


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_examples_use_declared_names_only(path):
    undeclared = []
    for module, name in imported_names(path.read_text()):
        if module == "tpc_hooks" and name in (
            "baselines",
            "data",
            "metrics",
            "offline",
            "pooling",
            "recipes",
            "synthetic",
            "views",
            "adapters",
            "cli",
        ):
            continue  # a public module, imported by name
        if name not in declared(module):
            undeclared.append(f"{module}.{name}")
    assert undeclared == []


# Studies of the package's own internals import private modules on purpose and live apart, in
# benchmarks/internals/ (its README.md says why); every other benchmark and every tutorial is held here.
USERS_CODE = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "tutorials").glob("*.py"))
FOLDER_MODULES = set(public_modules()) - set(FACES)  # the layer folders (and any module in one without a "_")


def package_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every absolute ``import tpc_hooks...`` (name None) and
    ``from tpc_hooks... import name`` in ``path``, read with ``ast`` (nothing is imported)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module, a.name) for a in node.names]
    return [(line, module, name) for line, module, name in out if module.split(".")[0] == "tpc_hooks"]


def private(module: str, name: str | None) -> bool:
    """Whether the import reaches past the public faces: a module path that is not a face (a layer
    folder, ``FOLDERS``, or a ``_``-prefixed part), a ``_``-prefixed name, or a name that is itself
    one of the package's private modules (``from tpc_hooks import training``)."""
    return module not in FACES or (name is not None and (name.startswith("_") or f"{module}.{name}" in FOLDER_MODULES))


def test_benchmarks_and_tutorials_import_public_modules_only():
    imports = {path: package_imports(path) for path in USERS_CODE}
    benchmarks = [path for path in imports if path.parent.name == "benchmarks"]
    assert benchmarks and len(imports) > len(benchmarks)  # both folders were globbed ...
    assert sum(len(imports[path]) for path in benchmarks) > 0  # ... and read
    bad = [
        f"{path.relative_to(ROOT)}:{line}: " + (f"from {module} import {name}" if name else f"import {module}")
        for path, found in imports.items()
        for line, module, name in found
        if private(module, name)
    ]
    if bad:
        pytest.fail(
            "benchmarks and tutorials import the public modules of tpc_hooks only (a study of the package's "
            "internals goes to benchmarks/internals/); these imports reach private ones:\n  " + "\n  ".join(bad),
            pytrace=False,
        )


@pytest.mark.parametrize(
    ("module", "name", "is_private"),
    [
        ("tpc_hooks", None, False),
        ("tpc_hooks", "offline", False),
        ("tpc_hooks.data", "outside_sets", False),
        ("tpc_hooks.adapters", "nnsight", False),
        ("tpc_hooks.adapters.nnsight", None, False),
        ("tpc_hooks", "training", True),
        ("tpc_hooks.training", None, True),
        ("tpc_hooks.training", "_train_monitor", True),
        ("tpc_hooks.data._sources", "tense_rewrites", True),
        ("tpc_hooks.data", "_x", True),
        ("tpc_hooks.cli._demo", None, True),
    ],
)
def test_the_rule_tells_a_private_import(module, name, is_private):
    assert private(module, name) is is_private


def test_the_error_reads_as_its_public_path():
    assert f"{tpc_hooks.TPCHooksError.__module__}.{tpc_hooks.TPCHooksError.__qualname__}" == "tpc_hooks.TPCHooksError"


def test_monitor_settings_are_declared_and_validate():
    """Every MonitorConfig field is a typed ``Setting`` written out in the Monitor class (so IDEs and
    type checkers see it, not one added by setattr at import), reading config and validating on
    assignment; the list is MonitorConfig's fields, no more and no fewer."""
    from dataclasses import fields

    from tpc_hooks.monitoring._settings import Setting

    tree = ast.parse((ROOT / "tpc_hooks" / "monitoring" / "_monitor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Monitor")
    declared = {
        f.target.id
        for f in cls.body
        if isinstance(f, ast.AnnAssign)
        and isinstance(f.annotation, ast.Subscript)
        and getattr(f.annotation.value, "id", None) == "Setting"
    }
    names = {f.name for f in fields(tpc_hooks.MonitorConfig)}
    assert declared == names
    assert all(isinstance(vars(tpc_hooks.Monitor)[n], Setting) for n in names)
    mon = tpc_hooks.Monitor(tpc_hooks.TPC(4, 2, 2), "blocks.0.hook_resid_post", threshold=0.3)
    for name in names:
        assert getattr(mon, name) == getattr(mon.config, name)
    mon.threshold = 0.7
    assert mon.config.threshold == 0.7
    with pytest.raises(tpc_hooks.TPCHooksError, match="threshold must be a number"):
        mon.threshold = float("nan")
    assert mon.threshold == 0.7  # the monitor is left as it was


@pytest.mark.parametrize(
    "module",
    [
        "tpc_hooks",
        "tpc_hooks.adapters",
        "tpc_hooks.baselines",
        "tpc_hooks.cli",
        "tpc_hooks.data",
        "tpc_hooks.metrics",
        "tpc_hooks.offline",
        "tpc_hooks.pooling",
        "tpc_hooks.recipes",
        "tpc_hooks.synthetic",
        "tpc_hooks.views",
    ],
)
def test_the_api_reference_lists_every_public_name(module):
    """docs/api/index.md names every name of each public module's ``__all__`` (its pages render
    them from ``__all__``; tests/test_docs_site.py checks the built pages)."""
    index = (ROOT / "docs" / "api" / "index.md").read_text()
    missing = [n for n in importlib.import_module(module).__all__ if f"`{n}`" not in index]
    assert missing == [], f"{module}: {missing}"
