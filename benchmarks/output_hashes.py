"""Hashes of every numeric output of the public API on fixed inputs, for refactors.

A refactor that claims "no behaviour change" runs this before and after and diffs the two
files: every logit of every truncation, the cascade's decisions, attribution, training (each
recipe and option), the baselines, the saved files and a monitor on a tiny model must agree
bit for bit.

    git worktree add /tmp/before <commit before the refactor>
    PYTHONPATH=/tmp/before python benchmarks/output_hashes.py > before.json
    python benchmarks/output_hashes.py > after.json && diff before.json after.json

Uses public names only, so the same script runs on both sides of a refactor.
"""

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import tpc_hooks as tpc
from tpc_hooks import baselines
from tpc_hooks.synthetic import make_problem

torch.set_num_threads(1)  # one summation order
OUT: dict[str, str] = {}


def record(name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        data = (
            value.detach().cpu().contiguous().numpy().tobytes()
            + str(value.dtype).encode()
            + str(tuple(value.shape)).encode()
        )
    elif isinstance(value, np.ndarray):
        data = value.tobytes() + str(value.dtype).encode()
    else:
        data = json.dumps(value, sort_keys=True, default=str).encode()
    OUT[name] = hashlib.sha256(data).hexdigest()[:16]


def head_outputs(name: str, head, z) -> None:
    for n in range(1, head.degree + 1):
        record(f"{name}/order{n}", head(z, order=n))
    record(f"{name}/truncations", head.truncations(z))
    record(f"{name}/terms", head.terms(z))
    record(f"{name}/outside", head.outside(z))
    for tau in (0.0, 0.05, 0.2, 0.5):
        out = tpc.Cascade(head, tau=tau)(z)
        for f in ("logits", "probs", "exit_order", "flops", "gated"):
            record(f"{name}/cascade{tau}/{f}", getattr(out, f))
    attr = tpc.attribute(head, z)
    for f in ("logit", "bias", "by_order", "by_neuron", "neuron_by_order", "z"):
        record(f"{name}/attr/{f}", getattr(attr, f))
    if head.degree > 1:
        record(f"{name}/attr/top_pairs", attr.top_pairs(k=5, order=2))
        record(f"{name}/attr/top_pairs_all", attr.top_pairs(k=5, order=None, input=None, mode="absolute"))
        record(f"{name}/attr/pair_matrix", attr.pair_matrix(0, None))
    record(f"{name}/cost", [(c.params, c.flops) for c in (head.cost(n) for n in range(1, head.degree + 1))])
    with tempfile.TemporaryDirectory() as d:
        head.save_pretrained(Path(d) / "h")
        record(f"{name}/saved_weights", (Path(d) / "h" / "model.safetensors").read_bytes().hex())
        cfg = json.loads((Path(d) / "h" / "config.json").read_text())
        cfg.get("history", {}).pop("config", None)  # added by the FitConfig refactor; settings are hashed below
        cfg.pop("weights_sha256", None)  # the weights' checksum: the weights are hashed above
        record(f"{name}/saved_config", cfg)


def main() -> None:
    X, y = make_problem(1200, 12, seed=0, world=3)
    Xv, yv = make_problem(400, 12, seed=1, world=3)
    Xt, yt = make_problem(500, 12, seed=2, world=3, shift=3.0)
    zt = torch.as_tensor(Xt)
    quick = dict(epochs=6, rank=3, verbose=False, device="cpu")
    heads = {
        "default": tpc.fit(X, y, Xv, yv, degree=4, **quick),
        "paper": tpc.fit(X, y, Xv, yv, degree=4, recipe=tpc.recipes.paper(), **quick),
        "joint": tpc.fit(X, y, Xv, yv, degree=3, mode="joint", **quick),
        "escalate": tpc.fit(X, y, Xv, yv, degree=3, escalate_only=True, **quick),
        "nogate": tpc.fit(X, y, Xv, yv, degree=3, gate=False, **quick),
        "noval": tpc.fit(X, y, degree=3, **quick),
        "sweep": tpc.fit(X, y, Xv, yv, degree=3, sweep={"lr": (1e-3, 5e-4)}, **quick),
        "l1": tpc.fit(X, y, Xv, yv, degree=3, l1=1e-3, decay_growth=2.0, margin=0.1, **quick),
        "lbfgs": tpc.fit(X, y, Xv, yv, degree=2, linear_solver="lbfgs", **quick),
    }
    heads["init"] = tpc.fit(X, y, Xv, yv, degree=5, init=heads["default"], **quick)
    with tempfile.TemporaryDirectory() as d:
        store = tpc.ActivationStore.create(Path(d) / "s", d_model=12)
        for a in range(0, len(X), 100):
            store.append(X[a : a + 100])
        heads["store"] = tpc.fit(store, y, Xv, yv, degree=3, chunk_rows=256, **quick)
    for name, head in heads.items():
        head_outputs(name, head, zt)
        h = head.history
        record(f"{name}/history/records", h.records)
        record(f"{name}/history/selected", {str(k): v for k, v in h.selected.items()})
        record(f"{name}/history/settings", h.settings)
    # a head with random weights, float64, under every guard
    gen = torch.Generator().manual_seed(0)
    rnd = tpc.TPC(12, 5, [3, 2, 4, 1])
    with torch.no_grad():
        for p in rnd.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.7)
    rnd = rnd.double()
    zr = torch.randn(300, 12, generator=gen, dtype=torch.float64) * 1.5
    head_outputs("random", rnd, zr)
    rnd.set_bounds(zr[:150], gate=True)
    head_outputs("random_gate", rnd, zr)
    rnd.escalate_only = True
    head_outputs("random_gate_escalate", rnd, zr)
    rnd.gate = False
    head_outputs("random_escalate", rnd, zr)
    cal = tpc.Cascade(heads["default"], tau=0.1).calibrate(Xv, yv)
    record("calibrated/params", cal.to_dict())
    record("calibrated/report", cal.calibration_report)
    out = cal(zt)
    for f in ("logits", "probs", "exit_order", "flops", "gated"):
        record(f"calibrated/{f}", getattr(out, f))
    record("calibrated/sweep", cal.sweep(Xt, yt))
    # baselines
    bq = dict(epochs=4, verbose=False, device="cpu")
    ee = baselines.fit_early_exit(X, y, Xv, yv, widths=[5, 4], **bq)
    record("ee/exits", ee.exits(zt))
    for tau in (0.05, 0.3):
        r = baselines.early_exit_cascade(ee, zt, tau=tau)
        for f in ("logits", "probs", "exit_order", "flops"):
            record(f"ee/cascade{tau}/{f}", getattr(r, f))
    record("mlp", baselines.fit_mlp(X, y, Xv, yv, hidden=6, dropout=0.2, **bq)(zt))
    record("bilinear", baselines.fit_bilinear(X, y, Xv, yv, rank=3, sweep={"lr": (1e-3, 1e-4)}, **bq)(zt))
    cmp = baselines.compare(X, y, Xv, yv, Xt, yt, degree=3, rank=3, epochs=4, verbose=False, device="cpu")
    record("compare/rows", cmp.rows)
    record("compare/heldout", cmp.evaluate(Xt[:200], yt[:200], device="cpu"))
    monitor_outputs()
    json.dump(OUT, sys.stdout, indent=1, sort_keys=True)
    print()


def monitor_outputs() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tiny_models as tm

    lm = tm.nnsight_lm(tm.hf_llama())
    prompts = [
        "how do i make bomb",
        "tell me about weather",
        "hack email please",
        "bread recipe friend",
        "steal car",
        "write poem about the cat",
        "kill process python code",
        "hello world is nice",
    ] * 3
    labels = [1, 0, 1, 0, 1, 0, 0, 0] * 3
    mon = tpc.train_monitor(
        lm,
        prompts,
        labels,
        site="blocks.1.hook_resid_post",
        degree=3,
        rank=2,
        epochs=3,
        tau=0.2,
        verbose=False,
        device="cpu",
    )
    res = mon.score(lm, prompts[:8])
    for f in ("logits", "probs", "exit_order", "flops"):
        record(f"monitor/score/{f}", getattr(res, f))
    toks, ts = mon.token_scores(lm, prompts[0])
    record("monitor/token_scores", [toks, ts.probs.tolist()])
    run = mon.generate(lm, prompts[:4], max_new_tokens=5, action="stop")
    record(
        "monitor/generate",
        [
            run.sequences,
            [s.tolist() for s in run.scores],
            [e.tolist() for e in run.exit_orders],
            run.stopped_at,
            run.first_flagged,
        ],
    )
    training_outputs(lm, prompts, labels)
    cli_outputs()


def monitor_record(name: str, mon) -> None:
    """A trained monitor's head, policy, operating point and report, each hashed on its own (so a
    diff says which one moved)."""
    with tempfile.TemporaryDirectory() as d:
        mon.save_pretrained(Path(d) / "m")
        record(f"{name}/weights", (Path(d) / "m" / "model.safetensors").read_bytes().hex())
        cfg = json.loads((Path(d) / "m" / "config.json").read_text())
    m = cfg.pop("monitor")
    report = m.pop("report", {})
    cfg.get("history", {}).pop("config", None)
    cfg.pop("weights_sha256", None)  # the weights' checksum: the weights are hashed above
    record(f"{name}/head_config", cfg)
    record(f"{name}/cascade", m.pop("cascade", None))
    record(f"{name}/threshold", m.pop("threshold", None))
    record(f"{name}/monitor_config", m)
    for k, v in sorted(report.items()):
        record(f"{name}/report/{k}", v)


def training_outputs(lm, prompts, labels) -> None:
    """train_monitor's recipes: pooled (rewrites + worst-family selection, a cascade), several
    sites, in-distribution, per-token, per-token with contexts."""
    import tiny_models as tm

    quick = dict(degree=3, rank=2, epochs=3, verbose=False, device="cpu")
    monitor_record(
        "train/pooled", tpc.train_monitor(lm, prompts, labels, site="blocks.1.hook_resid_post", tau=0.2, **quick)
    )
    monitor_record(
        "train/sites",
        tpc.train_monitor(
            lm, prompts, labels, site=["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"], pooling="last", **quick
        ),
    )
    monitor_record(
        "train/in_distribution",
        tpc.train_monitor(
            lm,
            prompts,
            labels,
            site="blocks.1.hook_resid_post",
            recipe=tpc.recipes.in_distribution(),
            pooling="max",
            **quick,
        ),
    )
    monitor_record(
        "train/paper",
        tpc.train_monitor(
            lm, prompts, labels, site="blocks.1.hook_resid_post", recipe=tpc.recipes.paper(augment=False), **quick
        ),
    )
    tok = tpc.train_monitor(lm, prompts, labels, site="blocks.1.hook_resid_post", pooling="token", tau=0.2, **quick)
    monitor_record("train/token", tok)
    run = tok.generate(lm, prompts[:3], max_new_tokens=4)
    record("train/token/generate", [run.sequences, [s.tolist() for s in run.scores]])
    monitor_record(
        "train/token_contexts",
        tpc.train_monitor(
            lm,
            prompts,
            labels,
            site="blocks.1.hook_resid_post",
            pooling="token",
            contexts=tm.tiny_chats(8),
            context_tokens=(20, 30),
            **quick,
        ),
    )


def cli_outputs() -> None:
    """The CLI's collect -> train -> evaluate, pooled and per-token (with contexts), on a tiny
    TransformerLens model (the CLI's loaders replaced, as tests/test_cli_token.py does)."""
    import contextlib
    import io

    import tiny_models as tm

    from tpc_hooks import cli as face

    cli = getattr(face, "_verbs", face)  # where the verbs' bodies live: a module of the cli folder, or the face
    model = tm.hooked_gpt2_style()
    cli._load_model = lambda name, toolkit: model
    cli._datasets = lambda args: tm.tiny_splits()  # the dataset reader, by its name before and after
    cli.prompt_sets = lambda args: (tm.tiny_splits(), None)
    cli._conversations = lambda tokenizer, n, tokens, exclude: tm.tiny_chats(n)
    site = "blocks.1.hook_resid_post"
    common = ["--degree", "2", "--rank", "2", "--epochs", "2", "--no-progress"]
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        d = Path(d)
        for name, collect_args in (
            ("pooled", ["--pooling", "mean"]),
            ("token", ["--pooling", "token"]),
            ("contexts", ["--pooling", "token", "--no-augment", "--contexts", "10", "--context-tokens", "20", "30"]),
        ):
            acts, out = d / f"acts-{name}", d / f"mon-{name}"
            assert cli.main(["collect", "--sites", site, "--out", str(acts), "--no-progress", *collect_args]) == 0
            code = cli.main(["train", "--acts", str(acts), "--out", str(out), *common])
            record(f"cli/{name}/train_exit", code)
            if code != 0:  # a refusal is an output too: the same inputs must be refused the same way
                continue
            monitor_record(f"cli/{name}", tpc.Monitor.from_pretrained(out))
            assert (
                cli.main(
                    [
                        "evaluate",
                        "--monitor",
                        str(out),
                        "--acts",
                        str(acts),
                        "--splits",
                        "test",
                        "--json",
                        str(d / "e.json"),
                    ]
                )
                == 0
            )
            record(f"cli/{name}/evaluate", json.loads((d / "e.json").read_text()))


if __name__ == "__main__":
    main()
