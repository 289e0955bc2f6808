"""A MonitorSet runs its members on the same forward passes: each member's steps equal the same
monitor run alone, in every adapter; one member's "stop" ends rows while another only flags. Its
members stacked or apart (stacked=False) give the same bits; score_activations scores pooled rows
as each member's own policy does, at its own threshold."""

import math

import numpy as np
import pytest
import torch
from tiny_models import (
    assert_steps_score_as_offline,
    bridge,
    hf_gpt2,
    hf_llama,
    hooked_gpt2_style,
    named,
    nnsight_lm,
    random_head,
    tiny_head,
    tokenizer,
)

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter, pad
from tpc_hooks.monitoring import _generation

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "write poem about cat dog and the mat",
    "steal car",
]
SITE, SHALLOW = "blocks.1.hook_resid_post", "blocks.0.hook_resid_post"
N_NEW = 6
FIELDS = ("scores", "logits", "decision_logits", "exit_orders", "flops")

MODELS = {
    "hooked-gpt2": lambda: hooked_gpt2_style(),
    "bridge-llama": lambda: bridge(hf_llama()),
    "nnsight-llama": lambda: nnsight_lm(hf_llama()),
    "nnsight-gpt2": lambda: nnsight_lm(hf_gpt2()),
    "transformers-llama": lambda: named(hf_llama()),
    "transformers-gpt2": lambda: named(hf_gpt2()),
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    return request.param, MODELS[request.param]()


def members(threshold: float = 0.5) -> dict[str, tpc.Monitor]:
    """Three monitors, two sharing a site: a prefix-pooled one (last), one with a cascade (mean),
    and a per-token one at another layer (max over the tokens' logits)."""
    mean_head = tiny_head(seed=1)
    return {
        "harm": tpc.Monitor(tiny_head(seed=0), SITE, pooling="last", threshold=threshold),
        "mean": tpc.Monitor(mean_head, SITE, pooling="mean", cascade=tpc.Cascade(mean_head, 0.2)),
        "tok": tpc.Monitor(tiny_head(seed=2), SHALLOW, pooling="token", aggregate="max"),
    }


def assert_same_steps(got: tpc.GenerationRun, alone: tpc.GenerationRun, rows: list[int] | None = None) -> None:
    """``got``'s steps equal ``alone``'s, bit for bit, on each row's first ``len(got)`` steps (a row that
    another member stopped has fewer steps than the same monitor's run alone)."""
    for f in FIELDS:
        for b, (g, a) in enumerate(zip(getattr(got, f), getattr(alone, f), strict=True)):
            assert len(g) <= len(a)
            assert torch.equal(g, a[: len(g)]), (f, b)
            if rows is None or b not in rows:
                assert len(g) == len(a), (f, b)


def test_a_set_scores_each_member_as_it_scores_alone(case):
    name, model = case
    mons = members()
    run = tpc.MonitorSet(mons).generate(model, PROMPTS, max_new_tokens=N_NEW)
    assert isinstance(run, tpc.MonitorSetRun) and list(run) == list(mons)
    for member, mon in mons.items():
        alone = mon.generate(model, PROMPTS, max_new_tokens=N_NEW)
        assert run[member].sequences == alone.sequences
        assert_same_steps(run[member], alone)
        assert run[member].stopped_at == [None] * len(PROMPTS)
    assert run.stopped_at == [None] * len(PROMPTS) and run.stopped_by == [None] * len(PROMPTS)
    assert run.flagged_by == [[m for m in mons if run[m].flagged[b]] for b in range(len(PROMPTS))]


def split_threshold(run: tpc.GenerationRun) -> float:
    """A threshold between the rows' peak scores: three rows reach it at some step, two never."""
    peaks = sorted(float(s.max()) for s in run.scores)
    assert peaks[1] < peaks[2]
    return (peaks[1] + peaks[2]) / 2


def test_one_member_stops_rows_another_only_flags(case):
    name, model = case
    mons = members()
    alone_flag = {m: mon.generate(model, PROMPTS, max_new_tokens=N_NEW) for m, mon in mons.items()}
    mons["harm"].threshold = split_threshold(alone_flag["harm"])
    mons["mean"].threshold = split_threshold(alone_flag["mean"])
    monitors = tpc.MonitorSet(mons, actions={"harm": "stop"})
    run = monitors.generate(model, PROMPTS, max_new_tokens=N_NEW)
    harm_alone = mons["harm"].generate(model, PROMPTS, max_new_tokens=N_NEW, action="stop")
    # the stopping member: exactly its run alone with action="stop"
    assert run["harm"].sequences == harm_alone.sequences
    assert_same_steps(run["harm"], harm_alone)
    assert run["harm"].stopped_at == harm_alone.stopped_at
    stopped = [b for b, s in enumerate(harm_alone.stopped_at) if s is not None]
    assert len(stopped) == 3
    assert run.stopped_at == harm_alone.stopped_at
    assert run.stopped_by == ["harm" if b in stopped else None for b in range(len(PROMPTS))]
    # the flagging members: their steps alone, cut where "harm" ended the row; they stop nothing
    for m in ("mean", "tok"):
        assert_same_steps(run[m], mons[m].generate(model, PROMPTS, max_new_tokens=N_NEW), rows=stopped)
        assert run[m].stopped_at == [None] * len(PROMPTS)
    assert run.flagged_by == [[m for m in mons if run[m].flagged[b]] for b in range(len(PROMPTS))]
    assert any("mean" in f for f in run.flagged_by)
    # the call's action overrides the set's: every member only flags, nothing is stopped
    quiet = monitors.generate(model, PROMPTS, max_new_tokens=N_NEW, action="flag")
    assert quiet.stopped_by == [None] * len(PROMPTS)
    assert quiet["harm"].sequences == alone_flag["harm"].sequences


def test_each_site_is_hooked_once(case, monkeypatch):
    """Four members on two sites: two hooks per pass. HookedTransformer's own loop hooks its sites
    through ``model.hooks``; every other adapter through ``observe``."""
    name, model = case
    seen = []
    if name == "hooked-gpt2":
        original = type(model).hooks

        def counting(self, fwd_hooks=(), *args, **kwargs):
            seen.extend(n for n, _ in fwd_hooks)
            return original(self, fwd_hooks, *args, **kwargs)

        monkeypatch.setattr(type(model), "hooks", counting)
    else:
        cls = type(get_adapter(model))
        original = cls.observe

        def counting(self, site, fn):
            seen.append(site.name)
            return original(self, site, fn)

        monkeypatch.setattr(cls, "observe", counting)
    mons = members()
    mons["again"] = tpc.Monitor(tiny_head(seed=3), SHALLOW, pooling="mean")
    tpc.MonitorSet(mons).generate(model, PROMPTS[:2], max_new_tokens=2)
    assert sorted(seen) == [SHALLOW, SITE]


# ---------------------------------------------------------------------- inside Hugging Face generate, and watch
@pytest.fixture(scope="module", params=["transformers", "nnsight", "bridge"])
def gen_case(request):
    if request.param == "transformers":
        hf = hf_llama()
        return "transformers", hf, hf, {"tokenizer": tokenizer()}
    if request.param == "nnsight":
        lm = nnsight_lm(hf_llama())
        return "nnsight", lm, lm._module, {}
    br = bridge(hf_llama())
    return "bridge", br, br.original_model, {}


def batch(model, kw):
    ids, _ = get_adapter(model, **kw).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    x, mask = pad(ids, tokenizer().pad_token_id, "left")
    return x, mask


def hf_generate(hf, x, mask, **kw):
    with torch.no_grad():
        return hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False, **kw)


@pytest.mark.parametrize("hook", ["stopping_criteria", "logits_processor"])
def test_the_generate_hooks_run_a_set(gen_case, hook):
    name, model, hf, kw = gen_case
    x, mask = batch(model, kw)
    mons = members()
    mons["harm"].threshold = split_threshold(mons["harm"].generate(model, PROMPTS, max_new_tokens=N_NEW, **kw))
    monitors = tpc.MonitorSet(mons, actions={"harm": "stop"})
    with getattr(mons["harm"], hook)(model, **kw) as alone:
        want = hf_generate(hf, x, mask, **{hook: [alone]})
    with getattr(monitors, hook)(model, **kw) as both:
        got = hf_generate(hf, x, mask, **{hook: [both]})
    assert torch.equal(got, want)  # the same rows stopped at the same tokens
    log = both.log
    assert isinstance(log, tpc.MonitorSetRun) and monitors.last_run is not None
    assert_same_steps(log["harm"], alone.log)
    assert log.stopped_at == alone.log.stopped_at
    assert log.stopped_by == ["harm" if s is not None else None for s in alone.log.stopped_at]
    assert any(s is not None for s in log.stopped_at)
    if hook == "stopping_criteria":  # the flagging members score every prefix as offline, and stop nothing
        for m in ("mean", "tok"):
            assert_steps_score_as_offline(mons[m], model, log[m], **kw)
            assert log[m].stopped_at == [None] * len(PROMPTS)


def test_watch_runs_a_set(gen_case):
    name, model, hf, kw = gen_case
    x, mask = batch(model, kw)
    mons = {m: mon for m, mon in members().items()}
    for mon in mons.values():  # every row flagged at every call: the callback sees each member
        mon.threshold = 1e-9
    events = []
    with tpc.MonitorSet(mons).watch(model, on_flag=events.append, **kw) as logs:
        hf_generate(hf, x, mask)
    assert list(logs) == list(mons)
    for m, mon in mons.items():
        with mon.watch(model, **kw) as alone:
            hf_generate(hf, x, mask)
        assert len(logs[m]) == len(alone) > 1
        for a, b in zip(logs[m].results, alone.results, strict=True):
            assert torch.equal(a.logits, b.logits)
    assert {e.monitor for e in events} == set(mons)
    assert len(events) == sum(len(log) for log in logs.values()) * len(PROMPTS)


# ---------------------------------------------------------------------- bad input
def test_a_set_refuses_bad_input_clearly():
    mons = members()
    with pytest.raises(tpc.TPCHooksError, match="non-empty dict"):
        tpc.MonitorSet({})
    with pytest.raises(tpc.TPCHooksError, match="not a tpc_hooks.Monitor"):
        tpc.MonitorSet({"harm": mons["harm"].head})
    for bad in ("", "a=b", "a:b", " a"):
        with pytest.raises(tpc.TPCHooksError, match="name must be"):
            tpc.MonitorSet({bad: mons["harm"]})
    with pytest.raises(tpc.TPCHooksError, match="not members of this set"):
        tpc.MonitorSet(mons, actions={"pii": "stop"})
    with pytest.raises(tpc.TPCHooksError, match="must be 'flag' or 'stop'"):
        tpc.MonitorSet(mons, actions={"harm": "halt"})
    other = tpc.Monitor(tiny_head(), SITE, chat_template=True)
    with pytest.raises(tpc.TPCHooksError, match="chat_template"):
        tpc.MonitorSet({"harm": mons["harm"], "chat": other})
    model = named(hf_llama())
    monitors = tpc.MonitorSet(mons)
    with pytest.raises(
        tpc.TPCHooksError, match="action must be 'flag' or 'stop' \\(for all, or by name\\); got <function"
    ):
        _generation.generate(monitors, model, PROMPTS, action=lambda e: True)  # (the public hint refuses it first)
    with pytest.raises(tpc.TPCHooksError, match="not members of this set"):
        monitors.generate(model, PROMPTS, action={"pii": "stop"})
    wide = tpc.Monitor(tiny_head(d_model=16), SITE)
    with pytest.raises(tpc.TPCHooksError, match="d_model=16"):
        tpc.MonitorSet({"harm": mons["harm"], "wide": wide}).generate(model, PROMPTS)
    with pytest.raises(tpc.TPCHooksError, match="blocks.9.hook_resid_post"):  # a site the model does not have
        tpc.MonitorSet({"harm": mons["harm"], "x": tpc.Monitor(tiny_head(), "blocks.9.hook_resid_post")}).generate(
            model, PROMPTS
        )


# ---------------------------------------------------------------------- stacked=False: each member by its own policy
def shaped_members() -> dict[str, tpc.Monitor]:
    """Six monitors: two full polynomials of one shape and two cascades of one shape (each pair
    stacked when the set stacks), one of another degree and a per-token one (each scored alone)."""
    heads = {k: tiny_head(seed=s) for s, k in enumerate(("harm", "harm2", "mean", "mean2"))}
    return {
        "harm": tpc.Monitor(heads["harm"], SITE, pooling="last"),
        "harm2": tpc.Monitor(heads["harm2"], SHALLOW, pooling="mean"),
        "mean": tpc.Monitor(heads["mean"], SITE, pooling="mean", cascade=tpc.Cascade(heads["mean"], 0.2)),
        "mean2": tpc.Monitor(heads["mean2"], SHALLOW, pooling="max", cascade=tpc.Cascade(heads["mean2"], 0.2)),
        "deg2": tpc.Monitor(tiny_head(degree=2, seed=7), SITE, pooling="mean"),
        "tok": tpc.Monitor(tiny_head(seed=8), SHALLOW, pooling="token", aggregate="max"),
    }


@pytest.fixture
def stacks(monkeypatch) -> list[int]:
    """The sizes of the stacked evaluations run while a test runs (none when nothing is stacked)."""
    from tpc_hooks.head import _together

    seen: list[int] = []
    real = _together._Stack.step
    monkeypatch.setattr(_together._Stack, "step", lambda self, zs: seen.append(len(zs)) or real(self, zs))
    return seen


def assert_same_runs(a: tpc.MonitorSetRun, b: tpc.MonitorSetRun) -> None:
    """Every member's steps, sequences, flags and stops bit for bit, and the set's stops."""
    assert list(a) == list(b)
    for m in a:
        assert a[m].sequences == b[m].sequences, m
        assert a[m].stopped_at == b[m].stopped_at and a[m].flagged == b[m].flagged, m
        assert_same_steps(a[m], b[m])
    assert a.stopped_at == b.stopped_at and a.stopped_by == b.stopped_by and a.flagged_by == b.flagged_by


@pytest.mark.parametrize("name", ["transformers-llama", "hooked-gpt2", "nnsight-llama"])
def test_a_set_apart_generates_the_same_bits_as_stacked(name, stacks):
    model = MODELS[name]()
    mons = shaped_members()
    mons["harm"].threshold = split_threshold(mons["harm"].generate(model, PROMPTS, max_new_tokens=N_NEW))
    for m in ("mean", "mean2"):  # flags that only record
        mons[m].threshold = split_threshold(mons[m].generate(model, PROMPTS, max_new_tokens=N_NEW))
    stacks.clear()
    stacked = tpc.MonitorSet(mons, actions={"harm": "stop"}).generate(model, PROMPTS, max_new_tokens=N_NEW)
    # harm with harm2, mean with mean2 every pass; on a decode step (one new token per row) the per-token
    # member, a full polynomial of the same shape, joins harm and harm2
    assert stacks and set(stacks) == {2, 3}
    stacks.clear()
    monitors = tpc.MonitorSet(mons, actions={"harm": "stop"}, stacked=False)
    apart = monitors.generate(model, PROMPTS, max_new_tokens=N_NEW)
    assert stacks == []
    assert_same_runs(stacked, apart)
    assert any(s is not None for s in apart.stopped_at) and any(s is None for s in apart.stopped_at)
    assert any(len(f) > 1 for f in apart.flagged_by)
    # each member apart is the monitor alone (what stacking is checked against elsewhere)
    for m in ("mean2", "deg2"):
        assert_same_steps(
            apart[m],
            mons[m].generate(model, PROMPTS, max_new_tokens=N_NEW),
            rows=[b for b, s in enumerate(apart.stopped_at) if s is not None],
        )


@pytest.mark.parametrize("hook", ["watch", "stopping_criteria", "logits_processor"])
def test_watch_and_the_generate_hooks_apart_give_the_same_bits_as_stacked(hook, stacks):
    hf = hf_llama()
    kw = {"tokenizer": tokenizer()}
    x, mask = batch(hf, kw)
    mons = shaped_members()
    mons["harm"].threshold = split_threshold(mons["harm"].generate(hf, PROMPTS, max_new_tokens=N_NEW, **kw))
    runs, outs = {}, {}
    for stacked in (True, False):
        stacks.clear()
        monitors = tpc.MonitorSet(mons, actions={"harm": "stop"}, stacked=stacked)
        if hook == "watch":
            with monitors.watch(hf, **kw) as logs:
                outs[stacked] = hf_generate(hf, x, mask)
            runs[stacked] = logs
        else:
            with getattr(monitors, hook)(hf, **kw) as sc:
                outs[stacked] = hf_generate(hf, x, mask, **{hook: [sc]})
            runs[stacked] = sc.log
        assert (set(stacks) == {2, 3}) if stacked else stacks == []
    assert torch.equal(outs[True], outs[False])
    if hook == "watch":
        for m in mons:
            assert len(runs[True][m]) == len(runs[False][m]) > 1
            for a, b in zip(runs[True][m].results, runs[False][m].results, strict=True):
                for f in ("logits", "decision_logits", "exit_order", "flops"):
                    assert torch.equal(getattr(a, f), getattr(b, f)), (m, f)
    else:
        assert_same_runs(runs[True], runs[False])
        assert any(s is not None for s in runs[False].stopped_at)


def test_stacked_is_a_bool_and_can_be_changed():
    mons = members()
    assert tpc.MonitorSet(mons).stacked is True
    monitors = tpc.MonitorSet(mons, stacked=False)
    assert monitors.stacked is False
    monitors.stacked = True
    assert monitors.stacked is True
    for bad in ("no", 0, None):
        with pytest.raises(tpc.TPCHooksError, match=f"stacked must be True .* or False .*; got {bad!r}"):
            tpc.MonitorSet(mons, stacked=bad)
        with pytest.raises(tpc.TPCHooksError, match="stacked must be True"):
            monitors.stacked = bad
    assert monitors.stacked is True  # left as it was


# ---------------------------------------------------------------------- score_activations: pooled rows, no model
D = 32


def gated_cascade_monitor(seed: int, site: str, threshold: float) -> tpc.Monitor:
    """A monitor whose cascade exits rows at several orders: a trust region some rows leave (the
    gate), per-order calibration, exit thresholds that leave some rows open."""
    head = random_head(D, 4, 3, std=0.4, seed=seed)
    gen = torch.Generator().manual_seed(100 + seed)
    head.set_bounds(torch.randn(64, D, generator=gen), margin=0.2, gate=True)
    temps = (0.5 + torch.rand(4, generator=gen)).tolist()
    biases = (0.3 * torch.randn(4, generator=gen)).tolist()
    cascade = tpc.Cascade(head, 0.3, temperatures=temps, biases=biases)
    return tpc.Monitor(head, site, pooling="mean", cascade=cascade, threshold=threshold)


def scored_members() -> dict[str, tpc.Monitor]:
    """Three cascades of one shape (two sites), two full polynomials of one shape and one of another
    degree, each with its own threshold."""
    return {
        "a": gated_cascade_monitor(0, SITE, 0.3),
        "b": gated_cascade_monitor(1, SITE, 0.6),
        "c": gated_cascade_monitor(2, SHALLOW, 0.5),
        "full": tpc.Monitor(random_head(D, 3, 4, std=0.2, seed=3), SITE, pooling="last", threshold=0.4),
        "full2": tpc.Monitor(random_head(D, 3, 4, std=0.2, seed=4), SHALLOW, pooling="max", threshold=0.55),
        "deg2": tpc.Monitor(random_head(D, 2, 4, std=0.2, seed=5), SITE, threshold=0.5),
    }


def pooled_rows(n: int = 9) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {SITE: 1.5 * torch.randn(n, D, generator=gen), SHALLOW: 1.5 * torch.randn(n, D, generator=gen)}


@pytest.mark.parametrize("stacked", [True, False])
def test_score_activations_scores_each_member_with_its_own_policy(stacked, stacks):
    mons = scored_members()
    acts = pooled_rows()
    got = tpc.MonitorSet(mons, stacked=stacked).score_activations(acts)
    assert list(got) == list(mons)
    # stacked: a, b, c together; full and full2 together; deg2 alone. Apart: none
    assert sorted(stacks) == ([2, 3] if stacked else [])
    for name, mon in mons.items():
        res, z = got[name], acts[mon.site]
        step = mon.policy().step(z)  # the member's own per-step rule, alone: the same bits
        for f in ("logits", "probs", "decision_logits", "exit_order", "flops"):
            assert torch.equal(getattr(res, f), getattr(step, f)), (name, f)
        offline = mon.policy()(z)  # the member's policy on the rows, order by order: the same up to rounding
        assert torch.equal(res.exit_order, offline.exit_order), name
        torch.testing.assert_close(res.logits, offline.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(res.decision_logits, offline.decision_logits, rtol=1e-5, atol=1e-5)
        # flagged at the member's own threshold
        assert res.threshold == mon.threshold
        t = mon.threshold
        assert res.flagged.tolist() == (res.decision_logits >= math.log(t / (1 - t))).tolist(), name
    # not degenerate: exits at several orders, and a threshold splits the rows
    assert len(set(torch.cat([got[k].exit_order for k in "abc"]).tolist())) > 2
    assert 0 < int(got["a"].flagged.sum()) < len(acts[SITE])
    assert not torch.equal(got["a"].flagged, got["b"].flagged)  # the same rows, another threshold


def test_score_activations_stacked_and_apart_are_the_same_bits_and_take_arrays():
    mons = scored_members()
    acts = pooled_rows()
    monitors = tpc.MonitorSet(mons)
    stacked = monitors.score_activations(acts)
    again = monitors.score_activations(acts)  # the stacked weights kept from the first call
    monitors.stacked = False
    apart = monitors.score_activations({k: v.numpy() for k, v in acts.items()})  # arrays: the same rows
    for name in mons:
        for f in ("logits", "probs", "decision_logits", "exit_order", "flops"):
            assert torch.equal(getattr(stacked[name], f), getattr(apart[name], f)), (name, f)
            assert torch.equal(getattr(stacked[name], f), getattr(again[name], f)), (name, f)
    with torch.no_grad():  # a changed weight is read at the next call
        mons["a"].head.factors["2"].mul_(1.5)
    monitors.stacked = True
    changed = monitors.score_activations(acts)["a"]
    assert torch.equal(changed.logits, mons["a"].policy().step(acts[SITE]).logits)
    assert not torch.equal(changed.logits, stacked["a"].logits)


def test_score_activations_refuses_bad_input_clearly():
    mons = scored_members()
    monitors = tpc.MonitorSet(mons)
    acts = pooled_rows()
    with pytest.raises(tpc.TPCHooksError, match="takes a dict site -> pooled rows .*; got a Tensor"):
        monitors.score_activations(acts[SITE])
    with pytest.raises(tpc.TPCHooksError, match=r"no rows for \['blocks.0.hook_resid_post'\], read by .*'c', 'full2'"):
        monitors.score_activations({SITE: acts[SITE]})
    with pytest.raises(
        tpc.TPCHooksError, match=r"acts\['blocks.1.hook_resid_post'\] \(read by member 'a'\) has d_model=16"
    ):
        monitors.score_activations({**acts, SITE: torch.randn(9, 16)})
    bad = acts[SHALLOW].clone()
    bad[4, 2] = float("inf")
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"acts\['blocks.0.hook_resid_post'\] contains 1 NaN/inf value\(s\), first at index \(4, 2\)",
    ):
        monitors.score_activations({**acts, SHALLOW: bad})
    with pytest.raises(tpc.TPCHooksError, match="must be a 2-D array"):
        monitors.score_activations({**acts, SITE: torch.randn(9, 4, D)})  # per-token rows, not pooled
    with pytest.raises(tpc.TPCHooksError, match="different numbers of rows"):
        monitors.score_activations({**acts, SITE: acts[SITE][:5]})
    with pytest.raises(tpc.TPCHooksError, match="must be an array or tensor of numbers"):
        monitors.score_activations({**acts, SITE: np.array([["x"] * D])})
    token = tpc.Monitor(tiny_head(seed=9), SHALLOW, pooling="token", aggregate="max")
    with pytest.raises(tpc.TPCHooksError, match="member 'tok' is a per-token monitor"):
        tpc.MonitorSet({**mons, "tok": token}).score_activations(acts)
