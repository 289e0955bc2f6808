"""The tutorials run top to bottom on small inputs (TPC_TUTORIAL_SMALL=1)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tpc_hooks as tpc
from tpc_hooks import offline

try:
    offline.gguf_path()
    from tpc_hooks.data import default_prompt_set  # noqa: F401
except tpc.TPCHooksError as err:
    pytest.skip(str(err), allow_module_level=True)

TUTORIALS = sorted(p for p in (Path(__file__).parent.parent / "tutorials").glob("[0-9]*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    if "sae" in path.stem:
        pytest.importorskip("sae_lens")
    env = {**os.environ, "TPC_TUTORIAL_SMALL": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, path.name], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_there_are_five_tutorials():
    assert len(TUTORIALS) == 5
