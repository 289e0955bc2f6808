"""CI's stages, run by ``.ci/run``: every suite of the repository as a stage, the stages in lanes that run
side by side, and the table CI ends with (one row a stage: its wall time and its tests).

A lane runs its stages one after the other; a stage also waits for the stages it ``needs`` in other
lanes, and is not run when one of them failed. The two lanes that run tests are each pinned to half the
cores, their thread pools sized to it (OpenMP, MKL, vLLM's CPU worker): `make test` and `make test-vllm`
each keep about one core busy, and two torch processes whose thread pools share the cores slow each
other down several-fold (``docs/contributing.md``, "CI's time"). On a machine with one core nothing is
pinned.

Each pytest run of a stage appends its counts to ``.ci-out/<stage>.jsonl`` (``TPC_CI_COUNTS``, read by
the root ``conftest.py``); a stage's output goes to ``.ci-out/<stage>.log`` and is printed whole when the
stage ends, so the lanes' outputs do not interleave. The running total is printed after each stage, a
line every five minutes names what runs, and a warning is printed once the run passes 60 minutes.

    python3 .ci/stages.py            # what .ci/run runs
    python3 .ci/stages.py --plan     # the stages, their lanes and what each needs, without running them
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

LIMIT = 90 * 60  # what CI allows
WARN_AT = 60 * 60  # a warning, not a failure: the budget is visible before CI stops a run
HEARTBEAT = 5 * 60
OUT = Path(".ci-out")

# A browser for tests/test_views_html.py and the demo's screenshot: the system's Chromium and chromedriver.
# Never fails the run: without root or apt-get the browser tests skip, saying why.
BROWSER = """
if command -v chromedriver >/dev/null 2>&1; then echo "chromedriver is installed"; exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "no chromedriver and no root apt-get: the browser tests will skip"; exit 1
fi
apt=.ci-out/browser-apt.txt
if ! { timeout 600 apt-get update -q && DEBIAN_FRONTEND=noninteractive timeout 900 \\
        apt-get install -y -q chromium chromium-driver; } >"$apt" 2>&1; then
    tail -n 30 "$apt"; echo "could not install chromium: the browser tests will skip"; exit 1
fi
chromium --version
"""


@dataclass
class Stage:
    """One step of CI: a shell command, the lane it runs in and the stages it waits for."""

    name: str
    command: str
    lane: str
    needs: tuple[str, ...] = ()
    optional: bool = False  # a failure is reported in the table, and does not fail the run
    shown: str = ""  # how the log names the command (default: the command)
    status: str = "waiting"  # waiting | running | passed | FAILED | not run
    start: float | None = None
    end: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def seconds(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    def counts(self) -> dict[str, int]:
        """The stage's pytest counts, summed over its pytest runs (empty for a stage that runs none)."""
        total: dict[str, int] = {}
        path = OUT / f"{self.name}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                for k, v in json.loads(line).items():
                    if isinstance(v, int) and k != "exit":
                        total[k] = total.get(k, 0) + v
        return total


# Lanes: "setup" installs and converts the models on every core; then "a" and "b" part, each pinned to a core of
# its own: "a" trains the quick SAE (single-threaded) and runs `make test` (the README's test command: make lint,
# then every test) and the docs build, "b" installs the vLLM venv and runs its suite, then the newest releases'.
# `make test` waits for vllm-env so that it also runs the serving tutorial, which the docs build then shows from
# the cache TPC_HOOKS_DOCS_CACHE names. Only `make test` (the demo, the SAE tutorial) reads the trained SAE.
STAGES = [
    Stage("browser", BROWSER, "browser", optional=True, shown="apt-get install chromium chromium-driver"),
    Stage("install", "make install install-docs", "setup"),
    Stage("models", "make models", "setup", needs=("install",)),
    Stage("sae", "make sae", "a", needs=("models",)),
    Stage("make test", "make test", "a", needs=("sae", "vllm-env", "browser")),
    # the site with every tutorial executed on the small inputs (the full-size build is `make docs`)
    Stage("docs", "make docs TUTORIALS=small", "a", needs=("make test",)),
    Stage("tl4-env", "make tl4-env", "a", needs=("install",)),
    Stage("test-tl4", "make test-tl4", "a", needs=("tl4-env",)),
    Stage("vllm-env", "make vllm-env", "b", needs=("models",)),
    Stage("test-vllm", "make test-vllm", "b", needs=("vllm-env",)),
    Stage("latest-env", "make latest-env", "b", needs=("install",)),
    Stage("test-latest", "make -o latest-env test-latest", "b", needs=("latest-env",)),
]


def cores() -> dict[str, list[int] | None]:
    """The cores each lane is pinned to: "a" the first half, "b" the rest; None: unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or not shutil.which("taskset"):
        return {}
    half = len(cpus) // 2
    return {"a": cpus[:half], "b": cpus[half:]}


class Run:
    def __init__(self, stages: list[Stage]):
        self.stages = {s.name: s for s in stages}
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.warned = False
        self.pinned = cores()

    def clock(self) -> str:
        s = int(time.time() - self.t0)
        return f"{s // 60:d}m{s % 60:02d}s"

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            self._warn()

    def _warn(self) -> None:
        if not self.warned and time.time() - self.t0 > WARN_AT:
            self.warned = True
            print(
                f"WARNING: CI has run {self.clock()} of its {LIMIT // 60} minutes: the next suite needs a margin "
                "found first (docs/contributing.md, 'CI's time')",
                flush=True,
            )

    def env(self, stage: Stage) -> dict[str, str]:
        env = {**os.environ, "TPC_CI_COUNTS": str((OUT / f"{stage.name}.jsonl").resolve())}
        cpus = self.pinned.get(stage.lane)
        if cpus:
            n = str(len(cpus))
            env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, cpus)))
        return env

    def run_stage(self, stage: Stage) -> None:
        for need in stage.needs:
            self.stages[need].done.wait()
        failed = [n for n in stage.needs if self.stages[n].status != "passed" and not self.stages[n].optional]
        if failed:
            stage.status = "not run"
            self.say(f"[{self.clock()}] {stage.name}: not run ({', '.join(failed)} did not pass)")
            stage.done.set()
            return
        cpus = self.pinned.get(stage.lane)
        where = f", cores {cpus}" if cpus else ""
        self.say(f"[{self.clock()}] {stage.name}: started (lane {stage.lane}{where}): {stage.shown or stage.command}")
        log = OUT / f"{stage.name}.log"
        stage.status, stage.start = "running", time.time()
        pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []  # the stage and every process it starts
        with open(log, "w") as f:
            proc = subprocess.run(
                [*pin, "bash", "-c", "set -euo pipefail\n" + stage.command],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env(stage),
            )
        stage.end = time.time()
        stage.status = "passed" if proc.returncode == 0 else "FAILED"
        with self.lock:
            print(f"\n{'=' * 30} {stage.name}: {stage.shown or stage.command} {'=' * 30}", flush=True)
            sys.stdout.write(log.read_text(errors="replace"))
            print(
                f"[{self.clock()}] {stage.name}: {stage.status} in {stage.seconds:.0f} s "
                f"(exit {proc.returncode}); running total {self.clock()}",
                flush=True,
            )
            self._warn()
        stage.done.set()

    def lane(self, name: str) -> None:
        for stage in self.stages.values():
            if stage.lane == name:
                self.run_stage(stage)

    def heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT):
            running = [
                f"{s.name} ({(time.time() - s.start) / 60:.0f} min)"
                for s in self.stages.values()
                if s.status == "running" and s.start
            ]
            self.say(f"[{self.clock()}] running: {', '.join(running) or 'nothing'}")

    def go(self) -> int:
        OUT.mkdir(exist_ok=True)
        for old in OUT.iterdir():
            old.unlink()
        lanes = list(dict.fromkeys(s.lane for s in self.stages.values()))
        threads = [threading.Thread(target=self.lane, args=(name,)) for name in lanes]
        stop = threading.Event()
        beat = threading.Thread(target=self.heartbeat, args=(stop,), daemon=True)
        beat.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        print(self.table(), flush=True)
        bad = [s for s in self.stages.values() if s.status != "passed" and not s.optional]
        return 1 if bad else 0

    def table(self) -> str:
        rows = [
            "",
            f"CI's stages (lanes a and b pinned to cores {self.pinned.get('a')} and {self.pinned.get('b')}):",
            "",
            "| stage | lane | started | wall | status | tests | passed | skipped | failed |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for s in self.stages.values():
            c = s.counts()
            tests = sum(c.get(k, 0) for k in ("passed", "skipped", "failed", "error", "xfailed", "xpassed"))
            started = f"{(s.start - self.t0) / 60:.1f} min" if s.start else ""
            wall = f"{s.seconds / 60:.1f} min" if s.seconds is not None else ""
            nums = (
                [
                    str(tests),
                    str(c.get("passed", 0)),
                    str(c.get("skipped", 0)),
                    str(c.get("failed", 0) + c.get("error", 0)),
                ]
                if c
                else ["", "", "", ""]
            )
            rows.append(f"| {s.name} | {s.lane} | {started} | {wall} | {s.status} | " + " | ".join(nums) + " |")
        total = time.time() - self.t0
        rows.append("")
        rows.append(f"total: {total:.0f} s ({total / 60:.1f} min) of CI's {LIMIT // 60} min")
        return "\n".join(rows)


def plan() -> str:
    pinned = cores()
    lines = []
    for s in STAGES:
        cpus = pinned.get(s.lane)
        lines.append(f"{s.name:12s} lane {s.lane:7s} cores {str(cpus or 'any'):8} needs {', '.join(s.needs) or '-'}")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--plan" in sys.argv:
        print(plan())
        sys.exit(0)
    sys.exit(Run(STAGES).go())
