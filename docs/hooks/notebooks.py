"""MkDocs hook: the tutorials, executed, so the site shows each one with its outputs.

Each ``tutorials/NN_*.py`` (jupytext percent format) runs top to bottom in a Jupyter kernel at
full size on the packaged model and prompts, and the site renders the executed notebook
(``tutorials/NN_*/``): printed tables, plots and the HTML views, as a reader would see them
after running it. A tutorial that raises fails the build.

An executed notebook is kept in a cache (``$TPC_HOOKS_DOCS_CACHE``, default
``~/.cache/tpc-hooks/docs-notebooks``), keyed by a hash of the tutorial, its shared helper and
every source file of the package, so ``mkdocs serve`` re-runs a tutorial only when something
it runs has changed. ``tests/test_tutorials.py`` runs the same :func:`execute` on small inputs.

``TPC_HOOKS_DOCS_SMALL=1`` (``make docs TUTORIALS=small``, what CI builds) executes the tutorials
on those small inputs instead: the same cells and pages, in minutes rather than half an hour;
the published site is built at full size. Where ``TPC_HOOKS_DOCS_CACHE`` is set (CI sets it), the
test run's small notebooks are kept there too, and the small build shows those very runs.
"""

import hashlib
import logging
import os
from pathlib import Path

try:
    from mkdocs.plugins import event_priority
except ImportError:  # the tests import execute() without MkDocs installed

    def event_priority(priority: int):
        return lambda f: f


ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
log = logging.getLogger("mkdocs.hooks.notebooks")


def small_inputs() -> bool:
    """Whether the site is built from the tutorials' small runs (``TPC_HOOKS_DOCS_SMALL=1``)."""
    return os.environ.get("TPC_HOOKS_DOCS_SMALL") == "1"


def small_folder() -> Path:
    """Where the small runs are cached, apart from the full ones: neither evicts the other."""
    return cache_dir() / "small"


def cache_dir() -> Path:
    return Path(os.environ.get("TPC_HOOKS_DOCS_CACHE", Path.home() / ".cache" / "tpc-hooks" / "docs-notebooks"))


def fingerprint(path: Path, small: bool = False) -> str:
    """What a tutorial's outputs depend on: its source, the shared helper, the package's sources."""
    digest = hashlib.sha256(b"small" if small else b"full")
    for source in [path, TUTORIALS / "_common.py", *sorted((ROOT / "tpc_hooks").rglob("*.py"))]:
        digest.update(source.relative_to(ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def execute(path: Path, out: Path, *, small: bool = False, timeout: int = 1800) -> Path:
    """Runs the tutorial ``path`` in a fresh kernel (cwd: the tutorials folder; plots inline) and
    writes the executed notebook to ``out``; ``small`` runs it on the small inputs the tests use.
    What the kernel writes to stderr (warnings, progress bars) is dropped from the page."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "TPC_TUTORIAL_SMALL")}
    if small:
        env["TPC_TUTORIAL_SMALL"] = "1"
    env["TQDM_DISABLE"] = "1"
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute(env=env)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    nb.metadata["tpc_hooks"] = {"fingerprint": fingerprint(path, small), "small": small}
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def executed(path: Path, folder: Path) -> Path:
    """The executed notebook of ``path`` in ``folder``: the cached one if its fingerprint matches."""
    import nbformat

    out = folder / "tutorials" / f"{path.stem}.ipynb"
    if out.exists():
        try:
            if nbformat.read(out, as_version=4).metadata.get("tpc_hooks", {}).get("fingerprint") == fingerprint(
                path, small_inputs()
            ):
                return out
        except Exception:  # a truncated or foreign file: run the tutorial again
            pass
    log.info("executing %s (the site shows its outputs)", path.relative_to(ROOT))
    return execute(path, out, small=small_inputs())


@event_priority(100)  # before mkdocs-jupyter wraps notebook files in on_files
def on_files(files, config):
    from mkdocs.structure.files import File

    folder = small_folder() if small_inputs() else cache_dir()
    for path in sorted(TUTORIALS.glob("[0-9][0-9]_*.py")):
        executed(path, folder)
        # src_dir is the cache (not docs/): mkdocs-jupyter reads a notebook through src_dir
        files.append(
            File(
                f"tutorials/{path.stem}.ipynb",
                src_dir=str(folder),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
