"""The tutorials run top to bottom as notebooks, on small inputs (TPC_TUTORIAL_SMALL=1), through
the same function that executes them for the docs site (docs/hooks/notebooks.py), and each shows
the outputs its page promises: printed results, plots, the coloured HTML views."""

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import tpc_hooks as tpc
from tpc_hooks import offline

try:
    offline.gguf_path()
    from tpc_hooks.data import default_prompt_set  # noqa: F401
except tpc.TPCHooksError as err:
    pytest.skip(str(err), allow_module_level=True)
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("jupytext")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).parent.parent
TUTORIALS = sorted(p for p in (ROOT / "tutorials").glob("[0-9]*.py"))
_spec = importlib.util.spec_from_file_location("docs_notebooks", ROOT / "docs" / "hooks" / "notebooks.py")
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)

# what each page shows: stdout (printed results), image/png (a plot), text/html (a coloured view)
SHOWS = {
    "01": {"stdout", "text/html", "text/markdown", "image/png"},
    "02": {"stdout", "image/png"},
    "03": {"stdout", "image/png", "text/html"},
    "04": {"stdout", "text/html"},
    "05": {"stdout", "text/html"},
    "06": {"stdout", "text/html"},
    "07": {"stdout", "text/html", "image/png"},
}


def has_vllm_environment() -> bool:
    """Whether the serving tutorial can start its server: ``tutorials/_common.vllm_python`` finds one."""
    spec = importlib.util.spec_from_file_location("tutorials_common", ROOT / "tutorials" / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    try:
        common.vllm_python()
    except RuntimeError:
        return False
    return True


def shown(nb) -> set[str]:
    kinds = set()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                kinds.add(out["name"])
            kinds |= set(out.get("data", {}))
    return kinds


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_and_shows_its_outputs(path, tmp_path):
    if "sae" in path.stem:
        pytest.importorskip("sae_lens")
    if "serving" in path.stem:
        pytest.importorskip("openai")
        if not has_vllm_environment():
            pytest.skip("no environment with vLLM for the server (make vllm-env, or TPC_HOOKS_VLLM_PYTHON)")
    out = notebooks.execute(path, tmp_path / f"{path.stem}.ipynb", small=True, timeout=900)
    nb = nbformat.read(out, as_version=4)
    kinds = shown(nb)
    assert SHOWS[path.stem[:2]] <= kinds, kinds
    assert "stderr" not in kinds and "error" not in kinds  # warnings and progress bars stay off the page
    assert nb.metadata["tpc_hooks"] == {"fingerprint": notebooks.fingerprint(path, small=True), "small": True}
    if os.environ.get("TPC_HOOKS_DOCS_CACHE"):  # CI: `make docs TUTORIALS=small` then shows this very run
        (notebooks.small_folder() / "tutorials").mkdir(parents=True, exist_ok=True)
        shutil.copy(out, notebooks.small_folder() / "tutorials" / out.name)


def test_there_are_seven_tutorials():
    assert len(TUTORIALS) == 7 == len(SHOWS)


def test_the_fingerprint_tells_tutorials_and_sizes_apart():
    """The docs' cache keys an executed notebook by its tutorial and its size (and the package's
    sources): a small run never stands in for the full one."""
    path = TUTORIALS[0]
    assert notebooks.fingerprint(path) == notebooks.fingerprint(path)
    assert notebooks.fingerprint(path) != notebooks.fingerprint(path, small=True)
    assert notebooks.fingerprint(path) != notebooks.fingerprint(TUTORIALS[1])
