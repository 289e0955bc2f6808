"""The package's layers (pyproject.toml's import-linter contracts) hold: no module imports one
above it, so no import cycle; and the core imports no interpretability toolkit."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")
ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    run = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                          "sys.exit(lint_imports(no_cache=True))"], cwd=ROOT, capture_output=True, text=True)
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
    """Every folder of the package has an ``__init__.py`` (a folder without one would be a namespace
    package that the contracts, and setuptools, could miss)."""
    pkg = ROOT / "tpc_hooks"
    folders = {p for p in pkg.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert {f.relative_to(pkg).as_posix() for f in folders if not (f / "__init__.py").exists()} == set()


def test_no_module_grows_past_600_lines():
    """A module past 600 lines holds more than one idea: split it before it lands."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "tpc_hooks").rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


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
    folders = [m.strip() for layer in reversed(layers) for m in layer.split("|")
               if (ROOT / "tpc_hooks" / m.strip()).is_dir()]
    page = (ROOT / "docs" / "contributing.md").read_text()
    table = re.findall(r"^\| `(\w+)/` \|", page, re.MULTILINE)
    assert table == folders
