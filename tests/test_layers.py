"""The package's layers (pyproject.toml's import-linter contracts) hold: no module imports one
above it, so no import cycle; and the core imports no interpretability toolkit."""

import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")
ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_every_folder_has_a_layer():
    """A new folder or top-level module cannot slip past the contract: the layers contract is
    exhaustive over the package's children, and its layers name exactly the folders and modules
    that are there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")
    assert layers["containers"] == ["tpc_hooks"] and layers["exhaustive"] is True
    named = {m.strip() for layer in layers["layers"] for m in layer.replace("|", ":").split(":")}
    pkg = ROOT / "tpc_hooks"
    children = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    children |= {p.parent.name for p in pkg.glob("*/__init__.py")}
    assert children == named


def test_every_folder_is_a_package():
    """Every folder of the package that holds code has an ``__init__.py`` (a folder without one would
    be a namespace package that the contracts, and setuptools, could miss); a folder of data files
    alone (the pretrained monitors) is package data that pyproject.toml ships."""
    pkg = ROOT / "tpc_hooks"
    folders = {p for p in pkg.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    code = {f for f in folders if any(f.rglob("*.py"))}
    assert {f.relative_to(pkg).as_posix() for f in code if not (f / "__init__.py").exists()} == set()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tpc_hooks"]
    for data in folders - code:
        files = [f.relative_to(pkg).as_posix() for f in data.iterdir() if f.is_file()]
        assert all(any(fnmatch.fnmatch(f, g) for g in shipped) for f in files), f"{data} is not shipped: {files}"


def _crossings(pkg: Path) -> list[str]:
    """Every ``from <module> import _name`` inside the package whose module lies in another folder
    (or at the top level) than the importing file: ``file:line: module._name``. Importing a module
    named ``_x`` is fine; reaching into another folder for its private names is not."""
    import ast

    out = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = list(rel.parent.parts)
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = base + (node.module.split(".") if node.module else [])
            into = target[0] if target and (pkg / target[0]).is_dir() else ""
            if into == folder:
                continue
            for alias in node.names:
                as_module = pkg.joinpath(*target, alias.name)
                if alias.name.startswith("_") and not (as_module.is_dir() or as_module.with_suffix(".py").exists()):
                    out.append(f"{rel.as_posix()}:{node.lineno}: {'.'.join(target)}.{alias.name}")
    return out


def test_no_private_name_crosses_a_folder(tmp_path):
    """A folder's ``_``-prefixed names are its own: another folder imports its modules' public
    names (a module may be ``_x.py``), so a folder can be reworked without reading the others."""
    assert _crossings(ROOT / "tpc_hooks") == []
    # the check itself: a crossing planted in a copy of two folders is found, a module import is not
    pkg = tmp_path / "pkg"
    for folder, text in (
        ("a", "from ..b._m import _hidden, shown\nfrom ..b import _m\n"),
        ("b", "_hidden = shown = 1\n"),
    ):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "_m.py").write_text(text)
    assert _crossings(pkg) == ["a/_m.py:1: b._m._hidden"]


def test_a_module_holds_one_idea():
    """A module holds one idea a reader opens one file for: at most 600 lines, or one class (an object
    whose parts are one thing, ``Monitor``) with at most 100 lines beside it (imports, constants, the
    helpers only it uses). Past that, split it before it lands."""
    import ast

    big = {}
    for path in (ROOT / "tpc_hooks").rglob("*.py"):
        text = path.read_text()
        n = len(text.splitlines())
        if n <= 600:
            continue
        classes = [c for c in ast.parse(text).body if isinstance(c, ast.ClassDef)]
        beside = n - sum(c.end_lineno - c.lineno + 1 for c in classes)
        if len(classes) != 1 or beside > 100:
            big[path.relative_to(ROOT).as_posix()] = (n, len(classes), beside)
    assert big == {}, "(lines, classes, lines beside them)"


def test_no_function_body_grows_past_100_lines():
    """A function longer than 100 lines (its docstring aside) does several things: name them as
    functions a reader can open alone (``train_monitor`` and ``cli.main`` read as their steps)."""
    import ast

    long = {}
    for path in (ROOT / "tpc_hooks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
                    body = body[1:]
                lines = body[-1].end_lineno - body[0].lineno + 1
                if lines > 100:
                    long[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    assert long == {}


def test_the_contributing_page_names_the_contracts_layers():
    """docs/contributing.md's table of layers names every folder of the contract, lowest first, so the
    map a newcomer reads is the one the linter holds."""
    tomllib = pytest.importorskip("tomllib")
    import re

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    folders = [
        m.strip() for layer in reversed(layers) for m in layer.split("|") if (ROOT / "tpc_hooks" / m.strip()).is_dir()
    ]
    page = (ROOT / "docs" / "contributing.md").read_text()
    table = re.findall(r"^\| `(\w+)/` \|", page, re.MULTILINE)
    assert table == folders
