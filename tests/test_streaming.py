"""Per-token (streaming) monitors, issue 14 items 1-3: every token scored, the logits aggregated
over time, the same rule offline and incrementally, calibrated by the maximum over a sequence.

Independent computations: a hand-written float64 loop for each aggregation; offline
``Monitor.score`` of every prefix against the scores logged during generation (the monitor's
own ``generate``, ``watch`` and HF ``generate`` with ``stopping_criteria``); an FPR bound
checked by counting."""

import json
import math

import numpy as np
import pytest
import torch
from tiny_models import hf_llama, named, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.pooling import AGGREGATES, RunningAggregate, aggregate

SITE = "blocks.1.hook_resid_post"
PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "steal car",
    "write poem about cat dog and the mat",
]
SETTINGS = [
    ("mean", {}),
    ("max", {}),
    ("ema", {"alpha": 0.3}),
    ("ema", {"alpha": 1.0}),
    ("rolling", {"window": 3}),
    ("rolling", {"window": 1}),
    ("sctopk", {"window": 3, "top_k": 2}),
    ("sctopk", {"window": 1, "top_k": 1}),
    ("sctopk", {"window": 4, "top_k": 50}),
]


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def by_hand(s: list[float], how: str, alpha: float = 0.1, window: int = 16, top_k: int = 8) -> list[float]:
    """The aggregate after each of the logits ``s`` (float64, a plain loop)."""
    out, e = [], None
    for t in range(len(s)):
        if how == "sctopk":  # every whole segment so far by its mean; the mean of the top_k (the mean before one)
            segments = [sum(s[j : j + window]) / window for j in range(t + 2 - window)]
            best = sorted(segments, reverse=True)[:top_k]
            out.append(sum(best) / len(best) if best else sum(s[: t + 1]) / (t + 1))
            continue
        if how == "mean":
            out.append(sum(s[: t + 1]) / (t + 1))
        elif how == "max":
            out.append(max(s[: t + 1]))
        elif how == "ema":
            e = s[t] if e is None else alpha * s[t] + (1 - alpha) * e
            out.append(e)
        else:
            last = s[max(0, t + 1 - window) : t + 1]
            out.append(sum(last) / len(last))
    return out


# ---------------------------------------------------------------------- the rule, offline and incremental
@pytest.mark.parametrize("skip", [0, 2])
@pytest.mark.parametrize("how,kw", SETTINGS)
def test_aggregate_equals_a_hand_written_loop_under_padding(how, kw, skip):
    """Each row's first ``skip`` tokens are not scored: the hand loop starts after them, and the
    aggregate is -inf (nothing seen, never flagged) until the first scored token."""
    gen = torch.Generator().manual_seed(0)
    lengths = [7, 1, 12, 4]
    rows = [torch.randn(n, generator=gen) * 3 for n in lengths]
    T = max(lengths)
    for side in ("left", "right"):
        logits = torch.full((len(rows), T), 123.0)  # padding holds garbage: it must not count
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for b, r in enumerate(rows):
            sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
            logits[b, sl], mask[b, sl] = r, 1
        got = aggregate(logits, mask, how, **kw, skip=skip)
        for b, r in enumerate(rows):
            want = by_hand(r[skip:].double().tolist(), how, **kw)
            at = torch.arange(T)[mask[b].bool()]
            np.testing.assert_allclose(got[b, at[skip:]].double().numpy(), want, rtol=1e-6, atol=1e-6)
            assert torch.equal(got[b, at[:skip]], torch.full((len(at[:skip]),), -math.inf))  # skipped: no score yet
            if side == "right":  # padding after the end carries the last value
                assert torch.equal(got[b, len(r) :], got[b, len(r) - 1].expand(T - len(r)))
            else:  # before the first token there is no score yet
                assert torch.equal(got[b, : T - len(r)], torch.full((T - len(r),), -math.inf))


@pytest.mark.parametrize("skip", [0, 5])
@pytest.mark.parametrize("how,kw", SETTINGS)
def test_incremental_equals_offline_on_every_prefix(how, kw, skip):
    """A prompt chunk, then one token per step with some rows ended (mask 0): the running value
    after each step equals the offline aggregate at that position."""
    gen = torch.Generator().manual_seed(1)
    B, P, steps = 4, 6, 9
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :4] = 0  # left padding
    prompt_mask[3, :1] = 0
    logits = torch.randn(B, P + steps, generator=gen)
    step_mask = (torch.rand(B, steps, generator=gen) > 0.2).long()
    mask = torch.cat([prompt_mask, step_mask], 1)
    offline = aggregate(logits, mask, how, **kw, skip=skip)
    run = RunningAggregate(how, **kw, skip=skip)
    got = [run.update(logits[:, :P], prompt_mask)]
    for t in range(steps):
        got.append(run.update(logits[:, P + t : P + t + 1], step_mask[:, t : t + 1]))
    want = [offline[:, P - 1]] + [offline[:, P + t] for t in range(steps)]
    for g, w in zip(got, want, strict=True):  # float32 running state against the float64 offline formulas
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("skip", [0, 3])
@pytest.mark.parametrize("how,kw", SETTINGS)
def test_incremental_in_chunks_of_any_length_equals_offline(how, kw, skip):
    """Chunks of 0-40 positions with holes (a long prompt, speculative or multi-token steps):
    the whole-chunk update (no per-position loop) equals the offline aggregate after each chunk."""
    gen = torch.Generator().manual_seed(2)
    B, T = 3, 200
    logits = torch.randn(B, T, generator=gen) * 2
    mask = (torch.rand(B, T, generator=gen) > 0.3).long()
    offline = aggregate(logits, mask, how, **kw, skip=skip)
    run, at = RunningAggregate(how, **kw, skip=skip), 0
    assert torch.equal(run.update(logits[:, :0], mask[:, :0]), torch.full((B,), -math.inf))  # an empty chunk
    while at < T:
        n = int(torch.randint(0, 41, (), generator=gen))
        got = run.update(logits[:, at : at + n], mask[:, at : at + n])
        at += n
        if at:
            torch.testing.assert_close(got, offline[:, min(at, T) - 1], rtol=1e-5, atol=1e-5)


def test_bad_aggregation_settings_are_clear_errors():
    head = tiny_head()
    for kw, match in [
        ({"aggregate": "median"}, "aggregate must be one of"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"window": 0}, "window"),
        ({"window": -3}, "window"),
    ]:
        with pytest.raises(tpc.TPCHooksError, match=match):
            tpc.Monitor(head, SITE, pooling="token", **kw)
    with pytest.raises(tpc.TPCHooksError, match="pooling must be one of"):
        tpc.Monitor(head, SITE, pooling="tokens")


# ---------------------------------------------------------------------- generation = offline, per prefix
def streaming_monitor(how="rolling", threshold=0.9999, **kw):
    kw = {"alpha": 0.3, "window": 3, **kw}
    return tpc.Monitor(tiny_head(), SITE, pooling="token", aggregate=how, threshold=threshold, **kw)


def check_against_offline(mon, hf, sequences, prompt_lengths, logits, exits, flops):
    for b, seq in enumerate(sequences):
        n0 = prompt_lengths[b]
        prefixes = [seq[: n0 + t] for t in range(len(logits[b]))]
        off = mon.score(hf, tokens=prefixes)
        torch.testing.assert_close(logits[b], off.logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(exits[b], off.exit_order) and torch.equal(flops[b], off.flops)


@pytest.mark.parametrize("skip", [0, 4])
@pytest.mark.parametrize("how", AGGREGATES)
def test_monitor_generate_step_scores_equal_offline_scores(how, skip):
    """With ``skip`` 4, "hello world" (BOS + 2 tokens) has no scored token until its second
    generated token: -inf offline and in generation, no FLOPs, and never flagged."""
    hf = named(hf_llama())
    mon = streaming_monitor(how, cascade=None, skip=skip, threshold=1e-6)  # every scored step is flagged
    run = mon.generate(hf, PROMPTS, max_new_tokens=6, action="flag")
    assert all(len(s) == 7 for s in run.scores)
    check_against_offline(mon, hf, run.sequences, run.prompt_lengths, run.logits, run.exit_orders, run.flops)
    for b, n0 in enumerate(run.prompt_lengths):
        unscored = max(0, skip - n0 + 1)  # steps whose prefix holds no token after the first `skip`
        assert torch.equal(run.logits[b][:unscored], torch.full((unscored,), -math.inf))
        assert run.first_flagged[b] == unscored and not run.flops[b][:unscored].any()
    assert max(skip - n0 + 1 for n0 in run.prompt_lengths) > 0 or skip == 0


def test_cascade_streaming_monitor_in_hf_generate_equals_offline():
    hf, tok = named(hf_llama()), tokenizer()
    head = tiny_head()
    mon = tpc.Monitor(
        head,
        SITE,
        pooling="token",
        aggregate="ema",
        alpha=0.5,
        threshold=0.9999,
        skip=2,
        cascade=tpc.Cascade(head, lower=0.61, upper=0.62),
    )
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    sc = mon.stopping_criteria(hf)
    out = hf.generate(**enc, max_new_tokens=5, do_sample=False, stopping_criteria=[sc])
    seqs, lengths = [], []
    for b in range(len(PROMPTS)):
        row = out[b][enc["attention_mask"][b].bool().tolist() + [True] * (out.shape[1] - enc["input_ids"].shape[1])]
        seqs.append(row.tolist())
        lengths.append(int(enc["attention_mask"][b].sum()))
    log = sc.log
    assert len({int(e) for r in log.exit_orders for e in r}) > 1  # the cascade exits at several orders
    check_against_offline(mon, hf, seqs, lengths, log.logits, log.exit_orders, log.flops)


def test_watch_scores_a_streaming_monitor_as_offline():
    hf, tok = named(hf_llama()), tokenizer()
    mon = streaming_monitor("max", skip=2)
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with mon.watch(hf, tokenizer=tok) as log:
        with torch.no_grad():
            hf(**enc)
    for b in range(2):
        n = int(enc["attention_mask"][b].sum())
        off = mon.score(hf, tokens=[enc["input_ids"][b, :n].tolist()])
        torch.testing.assert_close(log.results[0].logits[b : b + 1], off.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("skip", [0, 2])
def test_token_scores_are_the_aggregate_after_each_token(skip):
    hf = named(hf_llama())
    mon = streaming_monitor("ema", skip=skip)
    tokens, res = mon.token_scores(hf, PROMPTS[4])
    head = mon.head
    ids = tokenizer()(PROMPTS[4], add_special_tokens=False)["input_ids"]
    ids = [tokenizer().bos_token_id] + ids
    assert len(tokens) == len(ids) == len(res.logits)
    from tpc_hooks.adapters import get_adapter, pad  # the per-token logits by hand, then the EMA by hand

    adapter = get_adapter(hf)
    x, m = pad([ids], 0, "right")
    s = head(adapter.forward_sites(x, m, [adapter.site(SITE)])[SITE][0]).double().tolist()
    np.testing.assert_allclose(
        res.logits[skip:].double().numpy(), by_hand(s[skip:], "ema", alpha=0.3), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(res.logits[:skip], torch.full((skip,), -math.inf))
    off = mon.score(hf, tokens=[ids[: t + 1] for t in range(len(ids))])
    torch.testing.assert_close(res.logits, off.logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(res.flops, (torch.arange(1, len(ids) + 1) - skip).clamp_min(0) * head.cost().flops)
    page = str(
        tpc.TokenScores(tokens, res, 1e-6, skip).to_html()
    )  # the skipped tokens are shown unscored, never flagged
    assert page.count("data-score=") == len(ids) - skip and page.count('class="tok first') == 1


# ---------------------------------------------------------------------- operating point: max over the sequence
def test_calibration_bounds_the_share_of_benign_sequences_flagged_at_any_token():
    gen = torch.Generator().manual_seed(3)
    head = tiny_head(d_model=16)
    mon = tpc.Monitor(head, SITE, pooling="token", aggregate="rolling", window=4, skip=2)
    seqs = [torch.randn(int(n), 16, generator=gen) for n in torch.randint(3, 40, (200,), generator=gen)]
    for fpr in (0.0, 0.05, 0.2):
        mon.calibrate_activations(seqs, fpr)
        peaks = [
            aggregate(head(z[2:])[None], torch.ones(1, len(z) - 2), "rolling", window=4)[0].max() for z in seqs
        ]  # by hand: the skipped tokens dropped; flagged: logit >= logit(threshold)
        flagged = sum(bool(p >= logit(mon.threshold)) for p in peaks)
        assert flagged <= math.floor(fpr * len(seqs)) and flagged == mon.report["operating_point"]["flagged"]
        assert mon.report["operating_point"]["by"] == "max over tokens"
    held_out = [torch.randn(int(n), 16, generator=gen) for n in torch.randint(3, 40, (600,), generator=gen)]
    mon.calibrate_activations(seqs, 0.05)
    peaks = torch.stack(
        [aggregate(head(z)[None], torch.ones(1, len(z)), "rolling", window=4, skip=2)[0].max() for z in held_out]
    )
    rate = float((peaks >= logit(mon.threshold)).double().mean())
    assert rate < 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200) + 3 * math.sqrt(0.05 * 0.95 / 600)  # sampling error
    with pytest.raises(tpc.TPCHooksError, match="list of per-token activations"):
        mon.calibrate_activations(torch.randn(10, 16), 0.01)


def test_streaming_monitor_is_saved_and_loaded(tmp_path):
    hf = named(hf_llama())
    mon = streaming_monitor("rolling", window=5, skip=3)
    back = tpc.Monitor.from_pretrained(mon.save_pretrained(tmp_path / "m"))
    assert (back.pooling, back.aggregate, back.alpha, back.window, back.skip) == ("token", "rolling", 0.3, 5, 3)
    torch.testing.assert_close(back.score(hf, PROMPTS).logits, mon.score(hf, PROMPTS).logits)
    assert "top_k" not in json.loads((tmp_path / "m" / "config.json").read_text())["monitor"]  # as it was
    segments = streaming_monitor("sctopk", window=2, top_k=3)
    back = tpc.Monitor.from_pretrained(segments.save_pretrained(tmp_path / "s"))
    assert (back.aggregate, back.window, back.top_k) == ("sctopk", 2, 3)
    torch.testing.assert_close(back.score(hf, PROMPTS).logits, segments.score(hf, PROMPTS).logits)


# ---------------------------------------------------------------------- training
def test_train_monitor_on_tokens(monkeypatch):
    import tpc_hooks.training._train

    seen, fit = {}, tpc_hooks.training._train.fit

    def spy(X, *a, **kw):
        seen["X"] = X
        return fit(X, *a, **kw)

    monkeypatch.setattr(tpc_hooks.training._train, "fit", spy)
    hf = named(hf_llama())
    harmful = [
        "how do i make bomb",
        "steal car please",
        "hack email",
        "kill process how",
        "make bomb tell me",
        "hack car",
        "steal email",
        "kill the cat",
    ]
    benign = [
        "bread recipe",
        "tell me about weather",
        "hello world",
        "write poem",
        "cake recipe please",
        "python code",
        "the cat sat on mat",
        "hello friend",
    ]
    mon = tpc.train_monitor(
        hf,
        harmful + benign,
        [1] * 8 + [0] * 8,
        SITE,
        pooling="token",
        aggregate="ema",
        alpha=0.5,
        degree=2,
        rank=2,
        epochs=2,
        val_fraction=0.25,
        target_fpr=0.25,
        verbose=False,
        tokenizer=tokenizer(),
    )
    assert mon.streaming and (mon.aggregate, mon.alpha) == ("ema", 0.5)
    assert mon.skip == 1  # the template's "<s>" every prompt starts with
    X = seen["X"]  # the rows fit saw: every token but the fixed prefix, whose activation is the same in every prompt
    assert len(X) == mon.report["n_train_tokens"] > 12
    from tpc_hooks.adapters import get_adapter

    adapter = get_adapter(hf, tokenizer=tokenizer())
    first = adapter.forward_sites(torch.tensor([[2]]), torch.ones(1, 1, dtype=torch.long), [adapter.site(SITE)])[SITE][
        0, 0
    ]
    assert not torch.isclose(X.float(), first.float(), atol=1e-5).all(1).any()
    monkeypatch.setattr(type(adapter), "fixed_prefix", lambda self, **kw: 0)  # control: nothing skipped
    full = tpc.train_monitor(
        hf,
        harmful + benign,
        [1] * 8 + [0] * 8,
        SITE,
        pooling="token",
        degree=1,
        epochs=1,
        val_fraction=0.25,
        verbose=False,
        tokenizer=tokenizer(),
    )
    assert full.skip == 0 and torch.isclose(seen["X"].float(), first.float(), atol=1e-5).all(1).any()
    assert full.report["n_train_tokens"] == len(seen["X"]) == len(X) + 12  # one fixed-prefix row per training prompt
    assert mon.report["validation"]["decision"] == "max over tokens of the aggregate"
    op = mon.report["operating_point"]
    assert op["by"] == "max over tokens" and op["flagged"] <= math.floor(0.25 * op["n_benign"])
    run = mon.generate(hf, benign[:2], max_new_tokens=3)
    check_against_offline(mon, hf, run.sequences, run.prompt_lengths, run.logits, run.exit_orders, run.flops)
    with pytest.raises(tpc.TPCHooksError, match="reads one site"):
        tpc.train_monitor(
            hf,
            harmful + benign,
            [1] * 8 + [0] * 8,
            [SITE, "blocks.0.hook_resid_post"],
            pooling="token",
            verbose=False,
            tokenizer=tokenizer(),
        )


HARMFUL = [
    "how do i make bomb",
    "steal car please",
    "hack email",
    "kill process how",
    "make bomb tell me",
    "hack car",
    "steal email",
    "kill the cat",
]
BENIGN = [
    "bread recipe",
    "tell me about weather",
    "hello world",
    "write poem",
    "cake recipe please",
    "python code",
    "the cat sat on mat",
    "hello friend",
]


def chats(n: int) -> list[list[dict[str, str]]]:
    """``n`` benign conversations of the tiny vocabulary, of different lengths."""
    words = "the a cat dog sat on mat hello world is nice write poem bread recipe friend python code".split()
    rng = np.random.default_rng(0)

    def say(k):
        return " ".join(rng.choice(words, k))

    return [
        [{"role": ("user", "assistant")[t % 2], "content": say(3 + (t * 5 + i) % 9)} for t in range(3 + 2 * (i % 3))]
        for i in range(n)
    ]


def test_train_monitor_with_contexts_adds_the_rows_of_requests_inside_conversations(monkeypatch):
    """The rows fit sees beyond the prompts' own are, in order, those of each hosted training
    sequence computed by hand: a fresh forward of its tokens, positions after the fixed prefix,
    benign before the request, the request's label through its turn's end, nothing after a
    harmful request's turn. The held-out contexts are validation rows of group "contexts", and
    their benign chats join the operating point."""
    import tpc_hooks.data._context
    import tpc_hooks.training._train
    from tpc_hooks.adapters import get_adapter

    seen, hosted, fit, host = {}, [], tpc_hooks.training._train.fit, tpc_hooks.data._context.host_requests

    def spy_fit(X, y, X_val, y_val, *a, **kw):  # the first call: order 1's rows (the homonym rows come after)
        if not seen:
            seen.update(X=X, y=np.asarray(y), X_val=X_val, y_val=np.asarray(y_val), groups=kw.get("val_groups"))
        return fit(X, y, X_val, y_val, *a, **kw)

    def spy_host(*a, **kw):
        hosted.append(host(*a, **kw))
        return hosted[-1]

    monkeypatch.setattr(tpc_hooks.training._train, "fit", spy_fit)
    monkeypatch.setattr(tpc_hooks.data._context, "host_requests", spy_host)
    hf, tok = named(hf_llama()), tokenizer()
    kw = dict(
        pooling="token", degree=2, rank=2, epochs=2, val_fraction=0.25, target_fpr=0.25, verbose=False, tokenizer=tok
    )
    plain = tpc.train_monitor(hf, HARMFUL + BENIGN, [1] * 8 + [0] * 8, SITE, **kw)
    n_plain, n_plain_val = len(seen["y"]), len(seen["y_val"])
    seen.clear()
    mon = tpc.train_monitor(
        hf,
        HARMFUL + BENIGN,
        [1] * 8 + [0] * 8,
        SITE,
        contexts=chats(8),
        context_tokens=(24, 40),
        sources=["mine", "theirs"] * 8,
        **kw,
    )
    assert (plain.aggregate, mon.aggregate) == ("rolling", "max")  # the defaults without and with contexts
    val, train = hosted  # validation contexts are hosted first: 2 of 8 at val_fraction 0.25
    assert (len(val.sequences), len(train.sequences)) == (2, 6)
    assert sorted(val.labels) == [0, 1] and sorted(train.labels) == [0, 0, 0, 1, 1, 1]

    def requests(h):
        return {tok.decode(q.ids[q.start : q.stop]) for q in h.sequences}

    assert not requests(val) & requests(train)  # validation prompts host validation contexts only
    adapter = get_adapter(hf, tokenizer=tok)
    expected_X, expected_y = [], []
    for q, c in zip(train.sequences, train.labels, strict=True):
        acts = adapter.forward_sites(
            torch.tensor([q.ids]), torch.ones(1, len(q.ids), dtype=torch.long), [adapter.site(SITE)]
        )[SITE][0]
        for p in range(mon.skip, len(q.ids)):
            if c == 1 and p >= q.stop + train.tail:
                break
            expected_X.append(acts[p])
            expected_y.append(int(c) if p >= q.start else 0)
    assert len(seen["y"]) == n_plain + len(expected_y)
    torch.testing.assert_close(seen["X"][n_plain:].float(), torch.stack(expected_X).float(), atol=1e-5, rtol=1e-4)
    assert seen["y"][n_plain:].tolist() == expected_y
    assert seen["groups"][n_plain_val:].tolist() == ["contexts"] * (len(seen["y_val"]) - n_plain_val)
    report = mon.report["contexts"]
    assert (report["n_train"], report["n_val"], report["lengths"]) == (6, 2, [24, 40])
    assert len(report["per_order"]) == mon.head.degree
    n_benign_val_prompts = plain.report["operating_point"]["n_benign"]
    assert mon.report["operating_point"]["n_benign"] == n_benign_val_prompts + 1  # + the benign validation chat
    by_source = mon.report["operating_point"]["by_source"]  # the chat under its own name, the prompts under theirs
    assert by_source["contexts"]["n"] == 1 and set(by_source) <= {"mine", "theirs", "contexts"}
    assert sum(v["n"] for k, v in by_source.items() if k != "contexts") == n_benign_val_prompts


def test_train_monitor_contexts_errors():
    hf, tok = named(hf_llama()), tokenizer()
    args = (hf, HARMFUL + BENIGN, [1] * 8 + [0] * 8, SITE)
    kw = dict(verbose=False, tokenizer=tok, degree=1, epochs=1)
    cases = [
        (dict(pooling="mean", contexts=chats(4)), "pass pooling='token'"),
        (dict(pooling="mean", aggregate="sctopk"), "scores the pooled prefix: pass pooling='token' with it"),
        (dict(pooling="token", contexts=chats(3)), "at least 4 non-empty conversations"),
        (dict(pooling="token", contexts=chats(3) + [[]]), "one is empty"),
        (dict(pooling="token", contexts=2), "at least 4"),
        (dict(pooling="token", contexts="hello"), "list of conversations"),
        (dict(pooling="token", contexts=chats(4), context_tokens=0), "context_tokens must be"),
        (dict(pooling="token", contexts=chats(4), chat_template=False), "needs chat_template=True"),
        (dict(pooling="token", contexts=chats(3) + [[{"role": "assistant", "content": "hi"}]]), "turns alternate"),
    ]
    for extra, message in cases:
        with pytest.raises(tpc.TPCHooksError, match=message):
            tpc.train_monitor(*args, **extra, **kw)


def test_every_run_says_when_each_sequence_was_first_flagged():
    """Detection latency: the step of the first flag, the same in the monitor's own generate,
    HF generate's log and watch, and equal to the first prefix whose offline score is flagged."""
    hf, tok = named(hf_llama()), tokenizer()
    mon = streaming_monitor("mean", threshold=0.5)
    probe = mon.generate(hf, PROMPTS, max_new_tokens=6)
    mon.threshold = float(torch.cat(probe.scores).median())  # about half the steps are flagged
    run = mon.generate(hf, PROMPTS, max_new_tokens=6)
    assert any(f not in (None, 0) for f in run.first_flagged) and None in run.first_flagged
    for b, f in enumerate(run.first_flagged):
        n0 = run.prompt_lengths[b]
        off = mon.score(hf, tokens=[run.sequences[b][: n0 + t] for t in range(7)]).probs
        want = next((t for t in range(7) if off[t] >= mon.threshold), None)
        assert f == want
    from tpc_hooks.adapters import pad  # the prompts exactly as the monitor tokenised them

    x, m = pad([run.sequences[b][: run.prompt_lengths[b]] for b in range(len(PROMPTS))], 0, "left")
    enc = {"input_ids": x, "attention_mask": m}
    with mon.watch(hf, tokenizer=tok) as log:
        hf.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    sc = mon.stopping_criteria(hf)
    hf.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False, stopping_criteria=[sc])
    assert log.first_flagged == run.first_flagged == sc.log.first_flagged


def test_attribution_of_a_streaming_monitor_is_per_token():
    mon = streaming_monitor("mean")
    acts = torch.randn(2, 5, 32)
    with pytest.raises(tpc.TPCHooksError, match="attribute the tokens themselves"):
        tpc.attribute(mon, acts)
    attr = tpc.attribute(mon, acts[0])  # one row per token: each token's own logit, exactly
    torch.testing.assert_close(attr.logit.float(), mon.head(acts[0]).detach(), rtol=1e-5, atol=1e-5)
