"""MkDocs hook: the picture of the package's layers on the contributing page.

Drawn at build time from the import-linter layers contract in ``pyproject.toml`` (one row per
layer, highest first; independent layers side by side) and from the package's own imports (each
box lists the layers it imports), so the picture cannot drift from the code. An import that ran
back up a layer would be listed in red; ``lint-imports`` fails the build before that. Written as
``contributing/layers.svg``.
"""

import ast
import html
from collections import Counter
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tpc_hooks"
SVG_PATH = "contributing/layers.svg"


def layers() -> list[list[str]]:
    """The contract's layers, highest first, each a list of the package's children in it."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in contracts if c["type"] == "layers")
    return [[m.strip() for m in layer.replace(":", "|").split("|")] for layer in contract["layers"]]


def _child(path: Path) -> str:
    """The package's child (top-level module or folder) a source file belongs to."""
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _resolve(path: Path, node: ast.ImportFrom) -> list[str]:
    """The package modules an import statement names, as dotted paths under ``tpc_hooks``."""
    if node.level:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        base = parts[: -node.level] if path.name != "__init__.py" else parts[: len(parts) - node.level]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if not module.startswith("tpc_hooks"):
        return []
    return [f"{module}.{a.name}" for a in node.names] if node.module is None else [module]


def imports() -> Counter:
    """(importer, imported) children of the package, with how many import statements join them."""
    counts: Counter = Counter()
    for path in PKG.rglob("*.py"):
        if path.parent == PKG and path.name == "__init__.py":
            continue  # the package's face re-exports every layer
        src = _child(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                _resolve(path, node)
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names if a.name.startswith("tpc_hooks")]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                parts = name.split(".")
                if len(parts) > 1 and parts[1] != src:
                    counts[src, parts[1]] += 1
    return counts


def _lines(child: str) -> tuple[int, int]:
    """(modules, lines of code) of a child of the package."""
    folder = PKG / child
    files = list(folder.rglob("*.py")) if folder.is_dir() else [PKG / f"{child}.py"]
    return len(files), sum(len(f.read_text().splitlines()) for f in files)


def svg() -> str:
    """One row per layer, highest first; each box names the layers it imports, read from the code:
    every one stands in a row below it (a box that imported one above or beside it turns red)."""
    rows, counts = layers(), imports()
    width, box_h, gap, margin = 760, 58, 10, 6
    rank = {c: i for i, row in enumerate(rows) for c in row}
    height = margin * 2 + len(rows) * box_h + (len(rows) - 1) * gap
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" font-family="sans-serif" '
        'role="img" aria-label="The layers of tpc_hooks, highest first, and what each imports">'
    ]
    for i, row in enumerate(rows):
        y = margin + i * (box_h + gap)
        boxes = []
        for child in row:
            modules, lines = _lines(child)
            folder = (PKG / child).is_dir()
            targets = sorted((b for (a, b), n in counts.items() if a == child and b in rank), key=lambda b: rank[b])
            back = [b for b in targets if rank[b] <= rank[child]]
            line = ("imports " + ", ".join(targets)) if targets else "no imports"
            line += f" (runs back up: {', '.join(back)})" if back else ""
            label = f"{child}/" if folder else f"{child}.py"
            sub = f"{modules} modules, {lines:,} lines" if folder else f"{lines:,} lines"
            need = max(6.3 * len(line), 9 * len(label), 6.3 * len(sub)) + 12  # a box as wide as its text needs
            boxes.append((child, folder, label, sub, line, back, need))
        spare = width - 2 * margin - (len(row) - 1) * 8 - sum(b[-1] for b in boxes)
        x = margin
        for _child, folder, label, sub, line, back, need in boxes:
            w = need + spare / len(boxes)
            out.append(
                f'<rect x="{x:.0f}" y="{y}" width="{w:.0f}" height="{box_h}" rx="6" '
                f'fill="{"#e8eaf6" if folder else "#ffffff"}" stroke="#3949ab"/>'
                f'<text x="{x + w / 2:.0f}" y="{y + 18}" text-anchor="middle" font-size="14" '
                f'font-weight="bold">{html.escape(label)}</text>'
                f'<text x="{x + w / 2:.0f}" y="{y + 34}" text-anchor="middle" font-size="11" fill="#555">{sub}'
                "</text>"
                f'<text x="{x + w / 2:.0f}" y="{y + 50}" text-anchor="middle" font-size="11" '
                f'fill="{"#c62828" if back else "#3949ab"}">{html.escape(line)}</text>'
            )
            x += w + 8
    out.append("</svg>")
    return "\n".join(out)


def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, SVG_PATH, content=svg()))
    return files
