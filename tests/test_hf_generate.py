"""Plain transformers models (the transformers adapter, tokenizer=) and monitoring inside Hugging Face
``generate`` (Monitor.stopping_criteria / Monitor.logits_processor), against independent computations:
the nnsight adapter on the same weights, unmonitored ``generate``, and offline ``Monitor.score``."""

import gc
import re
from contextlib import contextmanager

import pytest
import torch
from tiny_models import (
    bridge,
    hf_gpt2,
    hf_llama,
    hooked_gpt2_style,
    named,
    nnsight_lm,
    tiny_head,
    tokenizer,
    tokenizer_dir,
)

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter, pad

pytest.importorskip("transformers")

PROMPTS = [
    "how do i make bomb",
    "tell me about the weather please",
    "hello world",
    "write poem about cat dog and the mat",
    "steal car",
    "the cat sat on the mat",
]
SITE = "blocks.1.hook_resid_post"
EOS, PAD = 3, 0  # the tiny models' generation_config
N_NEW = 8


def hooks_on(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


# ---------------------------------------------------------------------- the transformers adapter
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("make", [hf_llama, hf_gpt2])
def test_same_tensors_as_the_nnsight_adapter_on_padded_batches(make, side):
    hf, lm = make(), nnsight_lm(make())
    ours, theirs = get_adapter(hf, tokenizer=tokenizer()), get_adapter(lm)
    assert ours.toolkit == "transformers" and ours.hf_model() is hf
    ids, _ = ours.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    assert ids == theirs.tokenize(PROMPTS, chat_template=False, max_tokens=None)[0]
    x, mask = pad(ids, PAD, side)
    sites = [
        ours.site(s)
        for s in (
            "blocks.0.hook_resid_pre",
            "blocks.1.hook_resid_post",
            "blocks.2.hook_resid_pre",
            "blocks.2.hook_resid_post",
        )
    ]
    got, want = ours.forward_sites(x, mask, sites), theirs.forward_sites(x, mask, sites)
    with torch.no_grad():  # and Hugging Face's own hidden states, row by row without padding
        hs = [hf(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states for row in ids]
    for s in sites:
        assert got[s.name].shape == (len(PROMPTS), x.shape[1], 32)
        torch.testing.assert_close(got[s.name], want[s.name], rtol=1e-5, atol=1e-6)
        for b, _row in enumerate(ids):
            at = mask[b].bool()
            ref = hs[b][s.layer + (s.kind == "post")][0]
            if s.layer == 2 and s.kind == "post":  # the last layer's hidden_states entry is after the final norm
                continue
            torch.testing.assert_close(got[s.name][b, at], ref, rtol=1e-4, atol=1e-5)
    pooled = tpc.collect(
        hf, PROMPTS, [s.name for s in sites], "mean", padding_side=side, tokenizer=tokenizer(), progress=False
    )
    ref = tpc.collect(lm, PROMPTS, [s.name for s in sites], "mean", padding_side=side, progress=False)
    for s in sites:
        torch.testing.assert_close(pooled[s.name], ref[s.name], rtol=1e-5, atol=1e-6)


def test_forward_stops_after_the_deepest_site_and_gives_hooks_back():
    hf = named(hf_llama())
    fired = []
    user = hf.model.layers[2].register_forward_hook(lambda mod, args, out: fired.append("layer 2"))
    final = hf.lm_head.register_forward_hook(lambda mod, args, out: fired.append("lm_head"))
    before = hooks_on(hf)
    tpc.collect(hf, PROMPTS, ["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"], progress=False)
    assert fired == [] and hooks_on(hf) == before
    tpc.collect(hf, PROMPTS[:1], "blocks.2.hook_resid_post", progress=False)  # the last layer: still no LM head
    assert fired == ["layer 2"] and hooks_on(hf) == before
    boom = hf.model.layers[0].register_forward_hook(lambda mod, args, out: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        tpc.collect(hf, PROMPTS, "blocks.1.hook_resid_post", progress=False)
    boom.remove()
    assert hooks_on(hf) == before
    with torch.no_grad():
        hf(input_ids=torch.tensor([[4, 5, 6]]))  # the user's hooks survived, and a full pass fires them
    assert fired == ["layer 2", "layer 2", "lm_head"]
    user.remove()
    final.remove()


def test_default_tokenizer_is_loaded_once_from_name_or_path():
    hf = named(hf_llama())
    a, b = get_adapter(hf), get_adapter(hf)
    assert a.tokenizer is b.tokenizer and a.tokenizer.get_vocab() == tokenizer().get_vocab()
    assert a.model_name == tokenizer_dir()
    given = tokenizer()
    assert get_adapter(hf, tokenizer=given).tokenizer is given


def test_a_model_without_a_tokenizer_says_how_to_give_one(tmp_path):
    hf = hf_llama()  # built from a config: no name_or_path
    mon = tpc.Monitor(tiny_head(), SITE)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"LlamaForCausalLM carries no tokenizer and has no name_or_path to load "
        r"one from; pass tokenizer=",
    ):
        tpc.collect(hf, PROMPTS, SITE, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="carries no tokenizer"):
        mon.score(hf, PROMPTS)
    hf.name_or_path = str(tmp_path / "nothing-here")
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"could not load a tokenizer for this LlamaForCausalLM from "
        r"name_or_path='.*nothing-here' \(.*\); pass tokenizer=",
    ):
        tpc.collect(hf, PROMPTS, SITE, progress=False)
    # collection needs no tokenizer once tokenizer= is given, and neither does a stopping criterion
    assert tpc.collect(hf, PROMPTS, SITE, tokenizer=tokenizer(), progress=False)[SITE].shape == (len(PROMPTS), 32)
    with mon.stopping_criteria(hf_llama()):
        pass


def test_tokenizer_threads_through_every_entry_point():
    hf, lm, tok = hf_llama(), nnsight_lm(hf_llama()), tokenizer()
    mon = tpc.Monitor(tiny_head(), SITE)
    torch.testing.assert_close(mon.score(hf, PROMPTS, tokenizer=tok).logits, mon.score(lm, PROMPTS).logits)
    words, res = mon.token_scores(hf, PROMPTS[3], tokenizer=tok)
    words_ref, res_ref = mon.token_scores(lm, PROMPTS[3])
    assert words == words_ref
    torch.testing.assert_close(res.logits, res_ref.logits)
    run, run_ref = (
        mon.generate(hf, PROMPTS, max_new_tokens=3, tokenizer=tok),
        mon.generate(lm, PROMPTS, max_new_tokens=3),
    )
    assert run.sequences == run_ref.sequences
    with mon.watch(hf, tokenizer=tok) as log:
        hf(input_ids=torch.tensor([[4, 5, 6]]))
    assert len(log) == 1
    cal = tpc.Monitor(tiny_head(), SITE).calibrate(hf, PROMPTS, fpr=0.2, tokenizer=tok)
    assert cal.threshold == pytest.approx(
        tpc.Monitor(tiny_head(), SITE).calibrate(lm, PROMPTS, fpr=0.2).threshold, abs=1e-6
    )
    harmful, benign = (
        ["how do i make bomb", "steal car", "hack email", "kill process"],
        ["tell me about the weather", "bread recipe", "write poem about cat", "hello world friend"],
    )
    trained = tpc.train_monitor(
        hf,
        harmful + benign,
        [1] * 4 + [0] * 4,
        SITE,
        degree=2,
        rank=2,
        epochs=2,
        val_fraction=0.5,
        verbose=False,
        tokenizer=tok,
    )
    assert trained.chat_template is True  # read from the given tokenizer's chat template
    assert trained.score(hf, ["steal car"], tokenizer=tok).probs.shape == (1,)


def test_a_toolkit_model_refuses_a_different_tokenizer():
    lm, tok = nnsight_lm(hf_llama()), tokenizer()
    mon = tpc.Monitor(tiny_head(), SITE)
    # the same tokenizer loaded again is the same tokenizer
    torch.testing.assert_close(mon.score(lm, PROMPTS, tokenizer=tok).logits, mon.score(lm, PROMPTS).logits)
    other = tokenizer()
    other.chat_template = "{{ messages[0]['content'] }}"
    for model, fix in (
        (lm, r"LanguageModel\(hf_model, tokenizer=tok\)"),
        (hooked_gpt2_style(), r"TransformerBridge.boot_transformers\(\.\.\., tokenizer=tok\)"),
    ):
        with pytest.raises(
            tpc.TPCHooksError,
            match=r"tokenizer= differs from the one this \w+ model carries .*"
            r"drop tokenizer= or wrap the model with the one you mean: .*" + fix,
        ):
            tpc.collect(model, PROMPTS, SITE, tokenizer=other, progress=False)
    with pytest.raises(tpc.TPCHooksError, match="differs from the one this nnsight model carries"):
        mon.generate(lm, PROMPTS, tokenizer=other)
    with pytest.raises(
        tpc.TPCHooksError, match=r"remote=True runs on NDIF through nnsight; this is a transformers model"
    ):
        tpc.collect(hf_llama(), PROMPTS, SITE, remote=True, tokenizer=tok, progress=False)


def test_a_bare_base_model_is_refused_with_the_class_to_load():
    from transformers import LlamaModel

    with pytest.raises(
        tpc.TPCHooksError,
        match=r"LlamaModel has no LM head .* pass the causal-LM class "
        r"\(AutoModelForCausalLM, or the checkpoint's ...ForConditionalGeneration\)",
    ):
        get_adapter(LlamaModel(hf_llama().config))


# ---------------------------------------------------------------------- monitoring inside generate
@pytest.fixture(scope="module", params=["transformers", "nnsight", "bridge"])
def gen_case(request):
    """(name, the model handed to the monitor, the Hugging Face model whose generate runs)."""
    if request.param == "transformers":
        hf = hf_llama()  # no name_or_path: tokenizer= is what tokenises
        return "transformers", hf, hf
    if request.param == "nnsight":
        lm = nnsight_lm(hf_llama())
        return "nnsight", lm, lm._module
    br = bridge(hf_llama())
    return "bridge", br, br.original_model


def tok_kw(name):
    return {"tokenizer": tokenizer()} if name == "transformers" else {}


def unmonitored(hf, x, mask, max_new_tokens=N_NEW, **kw):
    with torch.no_grad():
        return hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, **kw)[
            :, x.shape[1] :
        ]


def offline_step_scores(mon, name, model, ids, gen):
    """score[b][t] = Monitor.score of prompt b + its first t generated tokens, for every step generate runs while
    row b is unfinished (through its EOS token); a separate full forward per prefix, no KV cache."""
    out = []
    for b, row in enumerate(ids):
        g = [t for t in gen[b].tolist()]
        n = g.index(EOS) + 1 if EOS in g else len(g)
        out.append(mon.score(model, tokens=[row + g[:t] for t in range(n)], **tok_kw(name)))
    return out


def pick_threshold(scores, margin=2e-4):
    """The highest threshold that leaves some rows unflagged, flags one at the prompt and one only later, with a
    clear margin from every score (so cached vs. uncached float noise cannot move a decision)."""
    values = sorted({float(v) for s in scores for v in s})
    for lo, hi in reversed(list(zip(values, values[1:], strict=False))):
        thr = (lo + hi) / 2
        if hi - lo < 2 * margin:
            continue
        first = [next((t for t, v in enumerate(s.tolist()) if v >= thr), None) for s in scores]
        if None in first and 0 in first and any(f not in (None, 0) for f in first):
            return thr, first
    raise AssertionError("no threshold splits the rows; change the head's seed")


@pytest.fixture(scope="module")
def split(gen_case):
    """A monitor whose threshold flags one row at the prompt, one later and leaves the others, and the
    unmonitored greedy run it is compared with."""
    name, model, hf = gen_case
    probe = tpc.Monitor(tiny_head(), SITE, pooling="last")
    ids, _ = get_adapter(model, **tok_kw(name)).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    x, mask = pad(ids, PAD, "left")
    gen = unmonitored(hf, x, mask)
    offline = offline_step_scores(probe, name, model, ids, gen)
    thr, first = pick_threshold([r.probs for r in offline])
    mon = tpc.Monitor(probe.head, SITE, pooling="last", threshold=thr)
    return mon, ids, x, mask, gen, offline, first


def expected_rows(gen, first, offline, forced_eos):
    """What generate must return: unflagged rows as without the monitor; a row flagged at step f keeps its first
    f + 1 tokens (the criterion: generate has appended step f's token) or f tokens and EOS (the processor)."""
    rows = []
    for b, f in enumerate(first):
        g = gen[b].tolist()
        if f is None:
            rows.append(g[: len(offline[b].probs)])
        else:
            rows.append(g[:f] + [EOS] if forced_eos else g[: f + 1])
    width = max(len(r) for r in rows)
    return [r + [PAD] * (width - len(r)) for r in rows], rows


@contextmanager
def refcounting_only():
    """Only reference counting frees objects inside: a reference cycle through the model's hooks would keep a
    dropped criterion (and its hooks) alive, and fail the check that follows."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def monitored(mon, kind, form, model, hf, x, mask, name, **kw):
    """generate with the monitor's criterion or processor made inline (as in DESIGN.md: inside the call, never
    named) or entered in a with block; returns the generated tokens and the log."""
    make, others = getattr(mon, kind), kw.pop(kind, [])
    if form == "inline":
        out = unmonitored(hf, x, mask, **{kind: [make(model, **tok_kw(name)), *others]}, **kw)
        return out, mon.last_run
    with make(model, **tok_kw(name)) as obj:
        assert obj.active and obj.log.steps == 0
        out = unmonitored(hf, x, mask, **{kind: [obj, *others]}, **kw)  # a plain list, as generate takes it
    assert not obj.active and mon.last_run is obj.log
    return out, obj.log


@pytest.mark.parametrize("form", ["inline", "with"])
@pytest.mark.parametrize("kind", ["stopping_criteria", "logits_processor"])
def test_generate_stops_exactly_the_flagged_rows(gen_case, split, kind, form):
    name, model, hf = gen_case
    mon, ids, x, mask, gen, offline, first = split
    assert EOS in gen.flatten().tolist()  # one row ends on its own EOS token: that bookkeeping is exercised too
    before = hooks_on(hf)
    mon.last_run = None
    with refcounting_only():
        out, log = monitored(mon, kind, form, model, hf, x, mask, name)
        assert hooks_on(hf) == before
    want, rows = expected_rows(gen, first, offline, forced_eos=kind == "logits_processor")
    assert out.tolist() == want
    assert log.stopped_at == first and log.first_flagged == first and log.flagged == [f is not None for f in first]
    assert log.steps == out.shape[1]
    for b in range(len(ids)):  # step t's score is Monitor.score of the same prefix
        n = len(rows[b])
        assert log.live[:, b].tolist() == [t < n for t in range(log.steps)]
        torch.testing.assert_close(log.scores[b], offline[b].probs[:n], rtol=0, atol=1e-5)
        torch.testing.assert_close(log.logits[b], offline[b].logits[:n], rtol=1e-4, atol=1e-4)
        assert torch.equal(log.exit_orders[b], offline[b].exit_order[:n])
        assert torch.equal(log.flops[b], offline[b].flops[:n])
    assert isinstance(log, tpc.GenerationRun)  # the one record of a monitored generation
    if kind == "stopping_criteria":  # it sees every appended token: the rows generate returned, without padding
        assert log.sequences == [list(ids[b]) + rows[b] for b in range(len(ids))]
        assert log.prompt_lengths == [len(i) for i in ids]
        assert [log.generated(b) for b in range(len(ids))] == rows
    else:  # a processor never sees the last token generate appends
        assert log.sequences is None
        with pytest.raises(tpc.TPCHooksError, match="no token sequences"):
            log.generated(0)


def test_generate_log_is_the_old_name_of_the_generation_run():
    with pytest.warns(DeprecationWarning, match="GenerationRun"):
        assert tpc.GenerateLog is tpc.GenerationRun


def test_a_held_criterion_keeps_its_hooks_until_closed_or_dropped(gen_case, split):
    """Rows left unfinished at max_new_tokens: a criterion still named keeps its hooks until close() or del."""
    name, model, hf = gen_case
    mon, _, x, mask, _, _, first = split
    before = hooks_on(hf)
    with refcounting_only():
        sc = mon.stopping_criteria(model, **tok_kw(name))
        assert hooks_on(hf) > before  # attached when made
        out = unmonitored(hf, x, mask, stopping_criteria=[sc])
        assert None in sc.log.stopped_at and sc.active and hooks_on(hf) > before  # unfinished rows: still attached
        sc.close()
        assert not sc.active and hooks_on(hf) == before
        sc.close()  # idempotent
        assert not sc.active and hooks_on(hf) == before
        assert sc.log.stopped_at == first and sc.log.steps == out.shape[1]  # the log outlives the hooks
        lp = mon.logits_processor(model, **tok_kw(name))
        unmonitored(hf, x, mask, logits_processor=[lp])
        assert lp.active and hooks_on(hf) > before
        log = lp.log
        del lp  # dropped: weakref.finalize gives the hooks back
        assert hooks_on(hf) == before
        assert mon.last_run is log and log.stopped_at == first


@pytest.mark.parametrize("kind", ["stopping_criteria", "logits_processor"])
def test_hooks_go_as_soon_as_every_row_has_ended(gen_case, split, kind):
    """Every row flagged at the prompt: generate ends after its first step, and the hooks are gone although the
    object is still held."""
    name, model, hf = gen_case
    probe, ids, x, mask, gen, *_ = split
    mon = tpc.Monitor(probe.head, SITE, pooling="last", threshold=1e-6)
    before = hooks_on(hf)
    obj = getattr(mon, kind)(model, **tok_kw(name))
    out = unmonitored(hf, x, mask, **{kind: [obj]})
    assert not obj.active and hooks_on(hf) == before
    assert out.tolist() == ([[EOS]] * len(ids) if kind == "logits_processor" else gen[:, :1].tolist())
    assert obj.log.stopped_at == [0] * len(ids) and obj.log.steps == 1
    with pytest.raises(
        tpc.TPCHooksError,
        match=rf"this {kind} already served a generate call \(its log is \.log\); "
        rf"make a new one for each call, as in: model.generate\(\.\.\., "
        rf"{kind}=\[monitor.{kind}\(model\)\]\)",
    ):
        unmonitored(hf, x, mask, **{kind: [obj]})
    assert hooks_on(hf) == before and obj.log.steps == 1  # the first call's log is kept


def test_rows_ended_by_flags_and_by_eos_end_the_hooks_too(gen_case, split):
    """The flagged rows stop; the others end on an EOS token (eos_token_id=, given to generate and the criterion
    alike, adds each one's second token): the criterion sees the last row end and lets its hooks go."""
    name, model, hf = gen_case
    mon, _, x, mask, gen, _, first = split
    ends = sorted({EOS} | {int(gen[b, 1]) for b, f in enumerate(first) if f is None})
    rows = []
    for b, f in enumerate(first):
        g = gen[b].tolist()
        e = next(t for t, tok in enumerate(g) if tok in ends) if any(tok in ends for tok in g) else len(g)
        rows.append(g[: min(e + 1, len(g) if f is None else f + 1)])
    assert all(len(r) < N_NEW for r in rows)
    before = hooks_on(hf)
    sc = mon.stopping_criteria(model, eos_token_id=ends, **tok_kw(name))
    out = unmonitored(hf, x, mask, eos_token_id=ends, stopping_criteria=[sc])
    assert not sc.active and hooks_on(hf) == before
    assert [r[: len(rows[b])] for b, r in enumerate(out.tolist())] == rows
    assert [len(s) for s in sc.log.scores] == [len(r) for r in rows]
    # generate told of other EOS tokens than the criterion goes on after the criterion has let its hooks go
    sc = mon.stopping_criteria(model, eos_token_id=ends, **tok_kw(name))
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"generate went on after every row had ended by this stopping_criteria's "
        r"account \(flagged, or an EOS token among "
        + re.escape(str(ends))
        + r"\); if generate ends rows on other tokens, pass the same "
        r"eos_token_id= to stopping_criteria",
    ):
        unmonitored(hf, x, mask, eos_token_id=EOS, stopping_criteria=[sc])
    assert hooks_on(hf) == before


def test_sampled_rows_go_on_as_without_the_monitor(gen_case, split):
    name, model, hf = gen_case
    mon, ids, x, mask, *_ = split

    def sample(**kw):
        torch.manual_seed(5)
        with torch.no_grad():
            return hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=0, **kw)[
                :, x.shape[1] :
            ]

    free = sample()
    ours = sample(stopping_criteria=[mon.stopping_criteria(model, **tok_kw(name))])
    log = mon.last_run
    assert any(log.flagged) and not all(log.flagged)
    for b in range(len(ids)):
        n = len(log.scores[b])
        assert ours[b, :n].tolist() == free[b, :n].tolist()
        assert set(ours[b, n:].tolist()) <= {PAD}
        if log.stopped_at[b] is not None:
            assert n == log.stopped_at[b] + 1
        prefixes = [ids[b] + free[b, :t].tolist() for t in range(n)]
        torch.testing.assert_close(
            log.scores[b], mon.score(model, tokens=prefixes, **tok_kw(name)).probs, rtol=0, atol=1e-5
        )


@pytest.mark.parametrize("form", ["inline", "with", "held"])
@pytest.mark.parametrize("where", ["callback", "forward"])
def test_hooks_are_given_back_when_generate_raises(gen_case, split, where, form):
    """Inline, once the exception is handled (nothing holds the object then); with, at the block's end; held,
    at close()."""
    from transformers import StoppingCriteria

    name, model, hf = gen_case
    mon, _, x, mask, *_ = split

    exc_type = KeyboardInterrupt if where == "callback" else RuntimeError

    class Explode(StoppingCriteria):
        """Raises at generate's second call (after two forward passes)."""

        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            if self.calls == 2:
                raise exc_type("boom")  # a new one: a kept exception would keep its traceback's frames
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def explode_in_pass(at):
        """A forward hook that raises during the model's ``at``-th forward pass."""
        calls = []

        def hook(mod, args, out):
            calls.append(1)
            if len(calls) == at:
                raise exc_type("boom")

        return hook

    before = hooks_on(hf)
    for kind in ("stopping_criteria", "logits_processor"):
        # on layer 0, before the monitor's site: the third pass is never scored
        boom = hf.model.layers[0].register_forward_hook(explode_in_pass(3)) if where == "forward" else None
        kw = {"stopping_criteria": [Explode()]} if where == "callback" else {}
        mon.last_run = None
        with refcounting_only():
            if form == "held":
                obj = getattr(mon, kind)(model, **tok_kw(name))
                with pytest.raises(exc_type):
                    unmonitored(hf, x, mask, **{**kw, kind: [obj, *kw.get(kind, [])]})
                assert obj.active and hooks_on(hf) > before + (boom is not None)
                obj.close()
            else:
                with pytest.raises(exc_type):
                    monitored(mon, kind, form, model, hf, x, mask, name, **kw)
            if boom is not None:
                boom.remove()
            assert hooks_on(hf) == before
        assert mon.last_run.steps == 2  # it ran until the exception


def test_misuse_is_refused_clearly(gen_case, split):
    name, model, hf = gen_case
    mon, _, x, mask, *_ = split
    before = hooks_on(hf)
    lp = mon.logits_processor(model, **tok_kw(name))
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"generate did not call this logits_processor after the last one: pass "
        r"it to generate, as in: model.generate\(\.\.\., logits_processor=\["
        r"monitor.logits_processor\(model\)\]\)",
    ):
        unmonitored(hf, x, mask)  # made (hooks attached), but not passed to generate
    assert not lp.active and hooks_on(hf) == before  # refused: the hooks went back at once, though lp is held
    sc = mon.stopping_criteria(model, **tok_kw(name))
    first = unmonitored(hf, x, mask, stopping_criteria=[sc])
    log = sc.log
    assert sc.active  # rows were left unfinished at max_new_tokens
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"this stopping_criteria already served a generate call \(its log is "
        r"\.log\); make a new one for each call, as in: model.generate\(\.\.\., "
        r"stopping_criteria=\[monitor.stopping_criteria\(model\)\]\)",
    ):
        unmonitored(hf, x, mask, stopping_criteria=[sc])  # a second call
    assert not sc.active and hooks_on(hf) == before
    assert sc.log is log and log.steps == first.shape[1]
    sc = mon.stopping_criteria(model, **tok_kw(name))
    sc.close()
    assert hooks_on(hf) == before
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"this stopping_criteria is closed and its hooks are removed; make a "
        r"new one for each generate call, as in: model.generate",
    ):
        unmonitored(hf, x, mask, stopping_criteria=[sc])
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"this stopping_criteria is closed and its hooks are removed; make a "
        r"new one for the with block, as in: with monitor.stopping_criteria",
    ):
        sc.__enter__()
    other = hf_llama(seed=1)
    sc = mon.stopping_criteria(other, tokenizer=tokenizer())
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"this stopping_criteria saw no forward pass of its model; is the model "
        r"passed to stopping_criteria the one generating\?",
    ):
        unmonitored(hf, x, mask, stopping_criteria=[sc])
    assert not sc.active and hooks_on(other) == 0 and hooks_on(hf) == before
    old = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = None
    try:
        with pytest.raises(
            tpc.TPCHooksError, match="logits_processor forces an EOS token on flagged rows, but neither"
        ):
            mon.logits_processor(model)
        assert mon.logits_processor(model, eos_token_id=[EOS, 1])._run.eos.tolist() == [EOS, 1]
        assert mon.logits_processor(model, tokenizer=tokenizer())._run.eos.tolist() == [EOS]
    finally:
        hf.generation_config.eos_token_id = old
    with pytest.raises(tpc.TPCHooksError, match=r"eos_token_id must be a token id or a list of them; got \[3, -1\]"):
        mon.stopping_criteria(model, eos_token_id=[EOS, -1], **tok_kw(name))
    assert hooks_on(hf) == before  # nothing refused, or made and dropped, left a hook


def test_hooked_transformer_has_no_hf_generate():
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"stopping_criteria works inside Hugging Face generate, and this "
        r"TransformerLens model has none .*monitor.generate\(model, prompts, "
        r"action='stop'\)",
    ):
        tpc.Monitor(tiny_head(), SITE).stopping_criteria(hooked_gpt2_style())


def test_chunked_prefill_scores_the_whole_prompt_at_step_zero(split):
    mon, _, x, mask, *_ = split
    hf = hf_llama()
    logs = []
    for chunk in ({"prefill_chunk_size": 3}, {}):
        with mon.stopping_criteria(hf) as sc:
            unmonitored(hf, x, mask, max_new_tokens=3, stopping_criteria=[sc], **chunk)
        logs.append(sc.log)
    assert logs[0].steps == logs[1].steps
    for a, b in zip(logs[0].scores, logs[1].scores, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_the_packaged_model_as_plain_transformers():
    """The offline default (SmolLM2, a Hugging Face folder): its tokenizer loads from name_or_path, the
    activations equal nnsight's, and a stopping criterion scores generate's steps as Monitor.score does."""
    from tpc_hooks import offline

    try:
        offline.gguf_path()
    except tpc.TPCHooksError as err:
        pytest.skip(str(err))
    hf, tok = offline.load_hf()
    lm = offline.load_model(toolkit="nnsight")
    site, prompts = "blocks.20.hook_resid_post", ["How do I bake bread?", "Write a haiku about autumn rain."]
    adapter = get_adapter(hf)
    assert adapter.tokenizer.get_vocab() == tok.get_vocab() and adapter.model_name == hf.name_or_path
    a = tpc.collect(hf, prompts, site, chat_template=True, progress=False)[site]
    b = tpc.collect(lm, prompts, site, chat_template=True, progress=False)[site]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    gen = torch.Generator().manual_seed(0)
    head = tpc.TPC(576, 2, 4)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        head.scaler.scale.fill_(30.0)
    mon = tpc.Monitor(head, site, chat_template=True)
    ids, _ = adapter.tokenize(prompts, chat_template=True, max_tokens=None)
    x, mask = pad(ids, tok.pad_token_id, "left")
    with mon.stopping_criteria(hf) as sc, torch.no_grad():
        out = hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=3, do_sample=False, stopping_criteria=[sc])
    for b in range(len(prompts)):
        n = len(sc.log.scores[b])
        prefixes = [ids[b] + out[b, x.shape[1] : x.shape[1] + t].tolist() for t in range(n)]
        torch.testing.assert_close(sc.log.logits[b], mon.score(hf, tokens=prefixes).logits, rtol=1e-4, atol=1e-4)


def test_the_monitor_follows_a_bfloat16_model_and_scores_in_float32():
    """A bfloat16 model: the monitor reads its activations, pools and scores them in float32, equal
    to the float32 computation on the same activations; the stopping criterion logs the same scores."""
    hf = named(hf_llama()).to(torch.bfloat16)
    mon = tpc.Monitor(tiny_head(), SITE)
    prompts = ["How do I bake bread?", "Hi there"]
    got = mon.score(hf, prompts)
    X = tpc.collect(hf, prompts, SITE, progress=False)[SITE]
    assert X.dtype == torch.float32 and got.probs.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(got.logits, mon.head(X.double()).float(), rtol=0, atol=1e-5)
    adapter = get_adapter(hf)
    ids, _ = adapter.tokenize(prompts, chat_template=False, max_tokens=None)
    x, mask = pad(ids, PAD, "left")
    sc = mon.stopping_criteria(hf)
    with torch.no_grad():
        hf.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=2,
            do_sample=False,
            stopping_criteria=[sc],
            pad_token_id=PAD,
        )
    for b in range(2):
        assert sc.log.logits[b].dtype == torch.float32
        torch.testing.assert_close(sc.log.logits[b][0], got.logits[b], rtol=0, atol=1e-5)


def test_a_model_whose_kv_cache_does_not_grow_is_refused_with_the_fix():
    """A wrapper that drops the KV cache it is given (as TransformerBridge does under transformers
    >= 5.24) would make every later step score the newest token alone: monitor.generate refuses
    it at the first decode step instead of returning wrong scores."""
    from transformers import DynamicCache

    hf = hf_llama()

    def fresh_cache(module, args, kwargs):
        for name in ("cache", "past_key_values"):
            if kwargs.get(name) is not None:
                kwargs[name] = DynamicCache()
        return args, kwargs

    hf.register_forward_pre_hook(fresh_cache, with_kwargs=True)
    mon = tpc.Monitor(tiny_head(), SITE, threshold=1 - 1e-7)  # flags nothing: generate goes on
    x = tokenizer()(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"KV cache did not grow during generation \(0 positions held before a "
        r"forward pass of generate, after \d+ fed",
    ):
        hf.generate(
            **x,
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=0,
            stopping_criteria=[mon.stopping_criteria(hf, tokenizer=tokenizer())],
        )
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"KV cache did not grow during generation \(0 positions held before the next decode step, after \d+ "
        r"fed.*install 'transformers<5.24'",
    ):
        mon.generate(hf, PROMPTS, max_new_tokens=3, tokenizer=tokenizer())
    assert mon.generate(hf_llama(), PROMPTS, max_new_tokens=3, tokenizer=tokenizer()).scores  # the same, cache kept
