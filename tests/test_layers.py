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


def test_every_module_has_a_layer():
    """A new module cannot slip past the contract: each module of the package (the adapters as one
    subpackage) is named in a layer."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    modules = {f"tpc_hooks.{p.stem}" for p in (ROOT / "tpc_hooks").glob("*.py") if p.stem != "__init__"}
    assert modules | {"tpc_hooks.adapters"} == named


def test_no_module_grows_past_600_lines():
    """A module past 600 lines holds more than one idea: split it before it lands."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "tpc_hooks").rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}
