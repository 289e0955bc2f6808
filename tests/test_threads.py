"""Threads sharing one model: each thread gets exactly the results it gets alone.

tpc-hooks serialises the passes it drives through a model (collection, scoring, its own decode
loop) with one lock per model, and every hook it attaches acts only in the thread that attached
it, so passes the user drives (``generate`` with the monitor's hooks, ``watch``) and passes of
other threads never see each other's activations."""

import threading

import pytest
import torch
from tiny_models import hf_llama, hooked_gpt2_style, nnsight_lm, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter, pad

SITE = "blocks.1.hook_resid_post"
MINE = ["how do i make bomb", "hello world"]
THEIRS = ["tell me about the weather please", "write poem about cat dog and the mat", "steal car"]
CALLS = 100


def _together(*jobs):
    """Runs the jobs in threads started at once; re-raises the first error."""
    barrier, errors = threading.Barrier(len(jobs)), []

    def run(job):
        try:
            barrier.wait()
            job()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _models():
    return {
        "transformers": lambda: (hf_llama(), tokenizer()),
        "nnsight": lambda: (nnsight_lm(hf_llama()), None),
        "HookedTransformer": lambda: (hooked_gpt2_style(), None),
    }


@pytest.mark.parametrize("kind", ["transformers", "nnsight", "HookedTransformer"])
def test_two_threads_scoring_through_one_model_get_their_own_results(kind):
    model, tok = _models()[kind]()
    mon = tpc.Monitor(tiny_head(), SITE, pooling="mean")
    want = {p: mon.score(model, prompts, tokenizer=tok).logits for p, prompts in (("mine", MINE), ("theirs", THEIRS))}
    got = {"mine": [], "theirs": []}

    def job(which, prompts):
        return lambda: [got[which].append(mon.score(model, prompts, tokenizer=tok).logits) for _ in range(CALLS)]

    _together(job("mine", MINE), job("theirs", THEIRS))
    for which in got:
        assert len(got[which]) == CALLS and all(torch.equal(g, want[which]) for g in got[which])


def _generate_with(hf, tok, hook=None):
    ids, _ = get_adapter(hf, tokenizer=tok).tokenize(THEIRS, chat_template=False, max_tokens=None)
    x, mask = pad(ids, 0, "left")
    kw = {} if hook is None else {"stopping_criteria": [hook]}
    return hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, **kw)


def test_generate_with_the_monitors_hooks_beside_a_scoring_thread():
    hf, tok = hf_llama(), tokenizer()
    mon = tpc.Monitor(tiny_head(), SITE, pooling="last", threshold=0.999999)
    probe = mon.stopping_criteria(hf, tokenizer=tok)
    _generate_with(hf, tok, probe)
    peaks = sorted(float(s.max()) for s in probe.log.scores)
    mon.threshold = (peaks[0] + peaks[-1]) / 2  # some rows are stopped, some are not
    sc = mon.stopping_criteria(hf, tokenizer=tok)
    out_alone, log_alone = _generate_with(hf, tok, sc), sc.log
    assert any(s is not None for s in log_alone.stopped_at) and None in log_alone.stopped_at
    scores_alone = mon.score(hf, MINE, tokenizer=tok).logits
    runs, scores = [], []

    def generating():
        for _ in range(10):
            sc = mon.stopping_criteria(hf, tokenizer=tok)
            runs.append((_generate_with(hf, tok, sc), sc.log))

    def scoring():
        scores.extend(mon.score(hf, MINE, tokenizer=tok).logits for _ in range(CALLS))

    _together(generating, scoring)
    for out, log in runs:
        assert torch.equal(out, out_alone) and log.stopped_at == log_alone.stopped_at
        assert all(torch.equal(a, b) for a, b in zip(log.scores, log_alone.scores, strict=True))
    assert all(torch.equal(s, scores_alone) for s in scores)


def test_watch_sees_only_its_own_threads_passes():
    hf, tok = hf_llama(), tokenizer()
    mon = tpc.Monitor(tiny_head(), SITE, pooling="last")
    with mon.watch(hf, tokenizer=tok) as alone:
        _generate_with(hf, tok)
    seen = {}

    def watching():
        with mon.watch(hf, tokenizer=tok) as log:
            _generate_with(hf, tok)
        seen["log"] = log

    def scoring():
        for _ in range(CALLS):
            mon.score(hf, MINE, tokenizer=tok)

    _together(watching, scoring)
    log = seen["log"]
    assert len(log) == len(alone) and log.fresh == alone.fresh
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(log.results, alone.results, strict=True))
