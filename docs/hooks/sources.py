"""MkDocs hook: pages whose single source lives outside docs/.

``benchmarks/results/*.md`` (what the benchmark scripts record) become ``benchmarks/results/*/``,
so the benchmark pages link to the full output. Nothing is copied into docs/: each page is read
from its file in place at build time. (The tutorials, executed, come from ``notebooks.py``.)
"""

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# paths relative to the repository root, which are also their paths in the site
SOURCES = ("benchmarks/results/*.md",)


@event_priority(100)  # before mkdocs-jupyter wraps notebook files in on_files
def on_files(files: Files, config) -> Files:
    for pattern in SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            # src_dir is the repository root (not docs/): mkdocs-jupyter finds a notebook's
            # source through src_dir, which a File.generated(...) would leave unset
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
