"""A MonitorSet runs its members on the same forward passes: each member's steps equal the same
monitor run alone, in every adapter; one member's "stop" ends rows while another only flags."""

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
