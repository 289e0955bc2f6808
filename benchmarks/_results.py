"""Keeps a copy of what a benchmark prints: ``benchmarks/results/<script>.md``.

Each ``bench_*.py`` wraps its work in :func:`recording`: everything the script writes to
stdout still goes to the terminal, and is also written, under a short header (the command
line, the date, the exit), to the results file the benchmark pages of the docs link to. Progress on stderr is not
recorded. The file is replaced only when the run finishes, so an interrupted or failed run
leaves the previous record in place.

    ap = argparse.ArgumentParser(...)
    add_results_argument(ap, "bench_claims")
    args = ap.parse_args(argv)
    with recording(results_path(args), argv):
        ...
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def default_path(name: str) -> Path:
    """``benchmarks/results/<name>.md``, wherever the script is run from."""
    return RESULTS_DIR / f"{name}.md"


def add_results_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """``--results PATH`` (default ``benchmarks/results/<name>.md``, except under ``--quick``,
    whose smoke-test figures must not replace a real run's record; ``--results ''`` records
    nothing). Read it with :func:`results_path`."""
    parser.add_argument(
        "--results",
        default=None,
        metavar="PATH",
        help=f"also write everything printed to stdout here, as Markdown "
        f"(default: benchmarks/results/{name}.md, none with --quick; '' to disable)",
    )
    parser.set_defaults(results_name=name)


def results_path(args: argparse.Namespace) -> Path | None:
    """Where :func:`recording` writes for parsed ``args`` (see :func:`add_results_argument`)."""
    if args.results is not None:
        return Path(args.results) if args.results else None
    return None if getattr(args, "quick", False) else default_path(args.results_name)


class Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and keeps a copy of everything written."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    def getvalue(self) -> str:
        return self.copy.getvalue()


def command_line(argv: Sequence[str] | None = None) -> str:
    """``python benchmarks/<script>.py ARGS``, as it would be typed from the repository root."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", str(script), *args])


@contextmanager
def recording(path: str | os.PathLike | None, argv: Sequence[str] | None = None) -> Iterator[Tee | None]:
    """Copies stdout into ``path`` (Markdown) while the block runs; ``path`` empty or None: no copy.

    The file is written when the block ends normally (a ``return`` included); an exception,
    ``SystemExit`` or Ctrl-C leaves any earlier file untouched.
    """
    if not path:
        yield None
        return
    path = Path(path)
    started = datetime.datetime.now(datetime.timezone.utc)
    original = sys.stdout
    tee = Tee(original)
    sys.stdout = tee
    try:
        yield tee
    finally:
        sys.stdout = original
    finished = datetime.datetime.now(datetime.timezone.utc)
    minutes = (finished - started).total_seconds() / 60
    header = (
        f"# {path.stem}\n\n"
        f"Command: `{command_line(argv)}`  \n"
        f"Run: {started:%Y-%m-%d %H:%M} UTC, {minutes:.1f} min.  \n"
        "Everything below is the script's standard output, verbatim (progress on stderr is not "
        "recorded); rerunning the script overwrites this file.\n\n---\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + tee.getvalue().lstrip("\n"), encoding="utf-8")
    os.replace(tmp, path)
    print(f"recorded stdout in {path}", file=sys.stderr)
