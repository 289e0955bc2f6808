"""Response monitors (``reads="answer"``): the answer pooled alone, step 0 never flagged, exact on
every adapter (a generation's step t scores as the conversation with t answer tokens offline, which
equals the head on the answer's activations pooled by hand), in Hugging Face ``generate``'s hooks,
under ``watch`` and per request as a serving engine runs them."""

import json

import numpy as np
import pytest
import torch
from test_adapters import HF_REF, MODELS, PROMPTS, SITE, hooks_left, reference_acts
from tiny_models import assert_steps_score_as_offline, hf_llama, named, nnsight_lm, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter, pad
from tpc_hooks.data import split_positions
from tpc_hooks.monitoring._generation import StepScores
from tpc_hooks.monitoring._requests import RequestScores
from tpc_hooks.pooling import POOLINGS, pool

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

RESPONSES = ["no", "it is sunny and warm", "hi there", "the cat sat", "i cannot help with that"]


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    return request.param, MODELS[request.param]()


def answer_monitor(pooling="mean", **kw):
    return tpc.Monitor(tiny_head(), SITE, pooling=pooling, reads="answer", **kw)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_conversations_score_is_the_head_on_its_answer_pooled_by_hand(case, pooling):
    name, model = case
    mon = answer_monitor(pooling)
    got = mon.score(model, PROMPTS, responses=RESPONSES, batch_size=3)
    adapter = get_adapter(model)
    ids, _ = adapter.tokenize(PROMPTS, chat_template=False, max_tokens=None)
    for i, (p, r) in enumerate(zip(ids, RESPONSES, strict=True)):
        a = adapter.tokenizer.encode(r, add_special_tokens=False)
        acts = reference_acts(name, model, p + a, 1)[len(p) :]  # the answer's tokens only
        row = pool(acts[None], torch.ones(1, len(a)), pooling)
        with torch.no_grad():
            want = mon.head(row)[0]
        torch.testing.assert_close(got.logits[i], want, rtol=1e-4, atol=1e-4)
    # the same conversations as token ids with their answer starts; a prompt monitor reads them whole
    seqs = [p + adapter.tokenizer.encode(r, add_special_tokens=False) for p, r in zip(ids, RESPONSES, strict=True)]
    again = mon.score(model, tokens=seqs, answer_starts=[len(p) for p in ids])
    torch.testing.assert_close(again.logits, got.logits, rtol=1e-4, atol=1e-4)
    whole = tpc.Monitor(mon.head, SITE, pooling=pooling)
    torch.testing.assert_close(
        whole.score(model, PROMPTS, responses=RESPONSES).logits, whole.score(model, tokens=seqs).logits
    )


@pytest.mark.parametrize("pooling", POOLINGS)
def test_generation_steps_score_as_the_conversation_offline(case, pooling):
    _, model = case
    mon = answer_monitor(pooling)
    run = mon.generate(model, PROMPTS, max_new_tokens=6)
    assert len({run.prompt_lengths[b] for b in range(len(PROMPTS))}) > 1  # left padding differs by row
    assert_steps_score_as_offline(mon, model, run)
    alone = [mon.generate(model, [p], max_new_tokens=6) for p in PROMPTS[:2]]
    for b, one in enumerate(alone):  # batched equals unbatched
        assert one.sequences[0] == run.sequences[b]
        torch.testing.assert_close(one.logits[0], run.logits[b], rtol=1e-4, atol=1e-4)


def test_a_response_monitor_stops_at_the_first_answer_token_never_the_prompt(case):
    _, model = case
    before = hooks_left(model)
    flag_all = answer_monitor(threshold=1e-6)
    run = flag_all.generate(model, PROMPTS, max_new_tokens=5, action="stop")
    assert run.first_flagged == [1] * len(PROMPTS) and run.stopped_at == [1] * len(PROMPTS)
    assert all(len(run.generated(b)) == 1 for b in range(len(PROMPTS)))
    assert hooks_left(model) == before


def test_hugging_face_generate_hooks_and_watch_score_as_monitor_generate():
    model = named(hf_llama())
    mon = answer_monitor("mean")
    ids, _ = get_adapter(model, tokenizer=tokenizer()).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    x, mask = pad(ids, 0, "left")
    ours = mon.generate(model, PROMPTS, max_new_tokens=4, stop_at_eos=False, tokenizer=tokenizer())
    crit = mon.stopping_criteria(model, tokenizer=tokenizer(), eos_token_id=None)
    model.generate(
        input_ids=x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, stopping_criteria=[crit]
    )
    theirs = mon.last_run
    with mon.watch(model, tokenizer=tokenizer()) as log:
        model.generate(
            input_ids=x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    for b in range(len(PROMPTS)):
        n, m = len(ours.logits[b]), len(theirs.logits[b])  # the criterion ends a row at its flag
        torch.testing.assert_close(theirs.logits[b], ours.logits[b][:m], rtol=1e-4, atol=1e-4)
        assert m == n or theirs.first_flagged[b] == m - 1 >= 1
        watched = torch.stack([r.logits[b] for r in log.results])  # generate's passes: the last token is not fed
        torch.testing.assert_close(watched, ours.logits[b][: len(log.results)], rtol=1e-4, atol=1e-4)
    assert log.results[0].logits.isneginf().all()  # the prompt's pass: nothing pooled, never flagged


def _alone(mon, rows, prompt, steps):
    """StepScores on one request: the prompt in one pass (marked so), then one row per pass."""
    ss = StepScores(mon)
    out = [ss.update(rows[None, :prompt], torch.ones(1, prompt), prompt=True)]
    out += [ss.update(rows[None, t : t + 1], torch.ones(1, 1)) for t in range(prompt, prompt + steps - 1)]
    return torch.cat([r.logits for r in out])


@pytest.mark.parametrize("pooling", POOLINGS)
def test_per_request_scores_with_the_prompt_left_out_equal_each_request_alone(pooling):
    """As a serving engine feeds them: the prompt's rows never reach the monitor, the pass that ends
    the prompt is a piece of no row that completes step 0, and the decode steps are batched."""
    d = 32
    mon = tpc.Monitor(tiny_head(d), SITE, pooling=pooling, reads="answer")
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(9, d, generator=g), torch.randn(7, d, generator=g)
    rs = RequestScores(mon)
    none = torch.zeros(0, d)
    passes = [
        [("a", none, False), ("b", none, True)],  # a's prompt (5) in two chunks, b's (4) whole
        [("a", none, True), ("b", b[4:5], True)],
        [("a", a[5:6], True), ("b", b[5:6], True)],  # both decode: one batched update
        [("a", a[6:7], True), ("b", b[6:7], True)],
        [("a", a[7:8], True)],
    ]
    for p in passes:
        rs.update(p)
    got = rs.take()
    for rid, rows, prompt in (("a", a, 5), ("b", b, 4)):
        want = _alone(mon, rows, prompt, len(got[rid]["logits"]))
        assert got[rid]["logits"][0] == float("-inf")
        torch.testing.assert_close(got[rid]["logits"], want, rtol=1e-5, atol=1e-5)


def test_token_scores_of_a_conversation_and_saving_keep_what_it_reads(tmp_path):
    model = nnsight_lm(hf_llama())
    mon = answer_monitor("max")
    tokens, res = mon.token_scores(model, PROMPTS[0], response=RESPONSES[1])
    ids, _ = get_adapter(model).tokenize(PROMPTS[:1], chat_template=False, max_tokens=None)
    start = len(ids[0])
    assert res.logits[:start].isneginf().all()
    seq = ids[0] + get_adapter(model).tokenizer.encode(RESPONSES[1], add_special_tokens=False)
    assert len(tokens) == len(seq)
    offline = mon.score(
        model, tokens=[seq[: t + 1] for t in range(start, len(seq))], answer_starts=[start] * (len(seq) - start)
    )
    torch.testing.assert_close(res.logits[start:], offline.logits, rtol=1e-4, atol=1e-4)
    mon.save_pretrained(tmp_path / "m")
    back = tpc.Monitor.from_pretrained(tmp_path / "m")
    assert back.reads == "answer" and back.config == mon.config
    # format_version 2: a version that reads only prompt monitors (format_version 1) refuses it
    assert json.loads((tmp_path / "m" / "config.json").read_text())["format_version"] == 2
    prompt_monitor = tpc.Monitor(tiny_head(), SITE)
    assert "reads" not in prompt_monitor.config.to_dict()  # a prompt monitor's file is as it was
    prompt_monitor.save_pretrained(tmp_path / "p")
    assert json.loads((tmp_path / "p" / "config.json").read_text())["format_version"] == 1


def test_bad_conversations_are_clear_errors():
    model = nnsight_lm(hf_llama())
    mon = answer_monitor()
    with pytest.raises(tpc.TPCHooksError, match="response monitor.*pass responses="):
        mon.score(model, PROMPTS)
    with pytest.raises(tpc.TPCHooksError, match="2 responses for 5 prompts"):
        mon.score(model, PROMPTS, responses=RESPONSES[:2])
    with pytest.raises(tpc.TPCHooksError, match="response 1 is empty"):
        mon.score(model, PROMPTS[:2], responses=["fine", ""])
    with pytest.raises(tpc.TPCHooksError, match="answer_starts must give"):
        mon.score(model, tokens=[[3, 4, 5]], answer_starts=[3])
    with pytest.raises(tpc.TPCHooksError, match="pass response="):
        mon.token_scores(model, PROMPTS[0])
    with pytest.raises(tpc.TPCHooksError, match="answer_starts= is for a response monitor"):
        tpc.Monitor(tiny_head(), SITE).score(model, tokens=[[3, 4, 5]], answer_starts=[1])
    with pytest.raises(tpc.TPCHooksError, match="reads must be one of"):
        tpc.Monitor(tiny_head(), SITE, reads="both")
    with pytest.raises(tpc.TPCHooksError, match="per-token monitor"):
        tpc.Monitor(tiny_head(), SITE, pooling="token", reads="answer")
    short = answer_monitor(max_tokens=6)
    with pytest.warns(UserWarning, match="1 of 1 conversations were longer than max_tokens=6"):
        res = short.score(model, PROMPTS[3:4], responses=["a very long answer indeed to cut"])
    ids, _ = get_adapter(model).tokenize(PROMPTS[3:4], chat_template=False, max_tokens=6)
    first = get_adapter(model).tokenizer.encode("a very long answer indeed to cut", add_special_tokens=False)[:1]
    torch.testing.assert_close(res.logits, short.score(model, tokens=[ids[0] + first], answer_starts=[6]).logits)


def test_hf_ref_covers_the_transformers_cases():  # the pooled-by-hand reference reads every HF-backed case alone
    assert {k for k in MODELS if not k.startswith("hooked")} == set(HF_REF)


HARMFUL = ["how do i make bomb", "steal car please", "hack email", "make bomb tell me", "hack car", "steal email"]
BENIGN = [
    "bread recipe",
    "tell me about weather",
    "hello world",
    "write poem",
    "cake recipe please",
    "python code",
    "the cat sat",
    "hello friend",
    "rain today",
    "a song about dogs",
    "soup recipe",
    "good morning",
]
ANSWERS = ["sure first get", "yes here is how", "ok step one", "i will not", "fine do this", "no sorry"] * 3


def test_train_monitor_on_conversations_trains_on_every_answer_step_and_calibrates_on_conversations(monkeypatch):
    import tpc_hooks.training._train

    seen, fit = {}, tpc_hooks.training._train.fit

    def spy(X, y, X_val, y_val, *a, **kw):
        seen["X"], seen["y"] = X, y
        return fit(X, y, X_val, y_val, *a, **kw)

    monkeypatch.setattr(tpc_hooks.training._train, "fit", spy)
    hf = named(hf_llama())
    prompts, labels = HARMFUL + BENIGN, [1] * 6 + [0] * 12
    mon = tpc.train_monitor(
        hf,
        prompts,
        labels,
        SITE,
        "max",
        responses=ANSWERS,
        degree=2,
        rank=2,
        epochs=2,
        val_fraction=0.5,
        target_fpr=0.34,
        verbose=False,
        tokenizer=tokenizer(),
    )
    assert mon.reads == "answer" and mon.pooling == "max" and not mon.streaming
    assert mon.report["responses"]["n"] == len(prompts) and mon.report["responses"]["truncated"] == 0
    # the rows fit trained on: each training conversation's answer steps, pooled by hand
    adapter = get_adapter(hf, tokenizer=tokenizer())
    ids, _ = adapter.tokenize(prompts, chat_template=mon.chat_template, max_tokens=512, prepend_bos=mon.prepend_bos)
    want = []
    for p, a in zip(ids, ANSWERS, strict=True):
        answer = adapter.tokenizer.encode(a, add_special_tokens=False)
        with torch.no_grad():
            hidden = hf(input_ids=torch.tensor([p + answer]), output_hidden_states=True).hidden_states[2][0]
        steps = torch.stack([hidden[len(p) : len(p) + t + 1].max(0).values for t in range(len(answer))])
        want.append(steps)
    split = mon.report["split"]
    tr, va = split_positions(prompts, np.asarray(labels), split["val_fraction"], split["split"], split["seed"])
    torch.testing.assert_close(seen["X"].float(), torch.cat([want[i] for i in tr]), rtol=1e-4, atol=1e-5)
    assert seen["y"].tolist() == [labels[i] for i in tr for _ in range(len(want[i]))]
    # the threshold: counted offline, the benign validation conversations that reach it at any answer step
    benign_val = [i for i in va if labels[i] == 0]
    flagged = 0
    for i in benign_val:
        seq = ids[i] + adapter.tokenizer.encode(ANSWERS[i], add_special_tokens=False)
        steps = [seq[: len(ids[i]) + t] for t in range(1, len(seq) - len(ids[i]) + 1)]
        res = mon.score(hf, tokens=steps, answer_starts=[len(ids[i])] * len(steps), tokenizer=tokenizer())
        flagged += bool(res.flagged.any())
    op = mon.report["operating_point"]
    assert op["n_benign"] == len(benign_val) >= 4 and op["flagged"] == flagged <= len(benign_val) // 3
    run = mon.generate(hf, BENIGN[:2], max_new_tokens=3, tokenizer=tokenizer())
    assert_steps_score_as_offline(mon, hf, run, tokenizer=tokenizer())


def test_train_monitor_refuses_what_conversations_cannot_take():
    hf = named(hf_llama())
    prompts, labels = HARMFUL + BENIGN, [1] * 6 + [0] * 12
    kw = dict(tokenizer=tokenizer(), verbose=False, degree=1)
    cases = [
        (dict(responses=ANSWERS[:3]), "3 responses for 18 prompts"),
        (dict(responses=ANSWERS[:17] + [" "]), "1 responses are empty"),
        (dict(responses="one answer"), "responses must be a list of strings"),
        (dict(responses=ANSWERS, pooling="token"), "not 'token'"),
        (dict(responses=ANSWERS, site=[SITE, "blocks.0.hook_resid_post"]), "at one site"),
        (dict(responses=ANSWERS, calibration=["hello there"]), "calibration read prompts alone"),
        (dict(responses=ANSWERS, recipe=tpc.recipes.intent()), "rewrites or intent flips"),
    ]
    for extra, message in cases:
        args = {"site": SITE, **extra}
        with pytest.raises(tpc.TPCHooksError, match=message):
            tpc.train_monitor(hf, prompts, labels, **args, **kw)


def test_the_generation_view_says_the_prompt_is_unscored_and_where_the_answer_crossed():
    model = nnsight_lm(hf_llama())
    mon = answer_monitor(threshold=1e-6)
    run = mon.generate(model, PROMPTS[:2], max_new_tokens=3)
    html = str(tpc.views.generation_html(run, tokenizer=get_adapter(model).tokenizer, threshold=mon.threshold))
    assert html.count("prompt not scored") == 2 and html.count("first flagged at answer token 1") == 2
    prompt_monitor = tpc.Monitor(mon.head, SITE, threshold=1e-6)
    run = prompt_monitor.generate(model, PROMPTS[:2], max_new_tokens=3)
    html = str(tpc.views.generation_html(run, tokenizer=get_adapter(model).tokenizer, threshold=1e-6))
    assert "prompt not scored" not in html and html.count("first flagged on the prompt") == 2


def test_a_requests_answer_start_is_read_and_checked_where_the_engine_admits_it():
    from types import SimpleNamespace

    from tpc_hooks.adapters.vllm._wire import ANSWER_START, request_settings

    assert request_settings(SimpleNamespace(extra_args={ANSWER_START: 5}))["answer_start"] == 5
    assert "answer_start" not in request_settings(SimpleNamespace(extra_args={}))
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="must be a token position"):
            request_settings(SimpleNamespace(extra_args={ANSWER_START: bad}))


def test_a_response_monitor_in_a_set_scores_as_alone_beside_a_prompt_monitor():
    model = nnsight_lm(hf_llama())
    answers = answer_monitor("mean")
    prompts_ = tpc.Monitor(tiny_head(seed=1), SITE, pooling="mean")  # the same shape: stacked in one evaluation
    monitors = tpc.MonitorSet({"answers": answers, "prompts": prompts_})
    got = monitors.generate(model, PROMPTS, max_new_tokens=4)
    for name, mon in (("answers", answers), ("prompts", prompts_)):
        alone = mon.generate(model, PROMPTS, max_new_tokens=4)
        for b in range(len(PROMPTS)):
            torch.testing.assert_close(got[name].logits[b], alone.logits[b], rtol=1e-5, atol=1e-5)
    assert all(float(s[0]) == 0.0 for s in got["answers"].scores)
