"""State that follows its owner: what is derived from a monitor's head (packed per-step weights, a
cascade) follows the head however it changes, and settings are validated when assigned."""

import pytest
import torch
from tiny_models import hf_llama, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.adapters import get_adapter, pad

SITE = "blocks.1.hook_resid_post"
PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello world"]


def _edits(head):
    """In-place edits through ``.data``, as interpretability code makes them (no version counter sees these)."""
    yield lambda: head.bias.data.fill_(3.0)
    yield lambda: head.linear.data.zero_()
    yield lambda: head.factors["2"].data.mul_(3.0)


def _prompt_scores(mon, hf, tok, driver):
    """Step 0 (the prompt alone) of a monitored generation, driven four ways."""
    ids, _ = get_adapter(hf, tokenizer=tok).tokenize(PROMPTS, chat_template=False, max_tokens=None)
    x, mask = pad(ids, 0, "left")
    kw = dict(input_ids=x, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    if driver == "generate":
        return torch.stack([s[0] for s in mon.generate(hf, PROMPTS, max_new_tokens=2, tokenizer=tok).scores])
    if driver == "watch":
        with mon.watch(hf, tokenizer=tok) as log:
            hf.generate(**kw)
        return log.results[0].probs
    hook = getattr(mon, driver)(hf, tokenizer=tok)
    hf.generate(**kw, **{driver: [hook]})
    return torch.stack([s[0] for s in mon.last_run.scores])


@pytest.mark.parametrize("driver", ["generate", "watch", "stopping_criteria", "logits_processor"])
def test_edits_through_data_reach_every_generation_path(driver):
    hf, tok = hf_llama(), tokenizer()
    mon = tpc.Monitor(tiny_head(), SITE, pooling="last", threshold=0.999999)
    _prompt_scores(mon, hf, tok, driver)  # the per-step weights are packed here
    for edit in _edits(mon.head):
        edit()
        want = mon.score(hf, PROMPTS, tokenizer=tok).probs  # offline: reads the parameters as they are
        torch.testing.assert_close(_prompt_scores(mon, hf, tok, driver), want, rtol=1e-5, atol=1e-6)


def test_a_new_head_with_the_old_cascade_is_refused_at_assignment():
    head = tiny_head()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1))
    other = tiny_head(seed=1)
    with pytest.raises(tpc.TPCHooksError, match="cascade wraps the old head"):
        mon.head = other
    assert mon.head is head
    mon.cascade = None  # the documented fix: drop the cascade (or give one on the new head), then assign
    mon.head = other
    assert mon.head is other and mon.policy().head is other
    mon.cascade = tpc.Cascade(other, 0.1)
    with pytest.raises(tpc.TPCHooksError, match="must wrap the monitor's own head"):
        mon.cascade = tpc.Cascade(head, 0.1)
    with pytest.raises(tpc.TPCHooksError, match="a tpc_hooks.TPC"):
        mon.head = "not a head"


@pytest.mark.parametrize("value", [float("nan"), 0.0, 1.0, 2.0, -1.0, float("inf"), "0.5", True])
def test_a_threshold_is_validated_when_assigned(value):
    mon = tpc.Monitor(tiny_head(), SITE)
    with pytest.raises(tpc.TPCHooksError, match=r"threshold must be a number in \(0, 1\)"):
        mon.threshold = value
    assert mon.threshold == 0.5
