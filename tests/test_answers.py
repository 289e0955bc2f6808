"""The model's own answers (tpc.generate_answers): greedy, batched, each up to its EOS."""

import pytest
import torch
from tiny_models import hf_gpt2, hf_llama, nnsight_lm, tokenizer

import tpc_hooks as tpc

PROMPTS = ["the cat sat on the mat", "a dog", "the bird flew over the red house and away"]


def _alone(model, tok, ids: list[int], n: int) -> list[int]:
    """Hugging Face generate on one prompt, greedy, cut after the first EOS: the independent answer."""
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,  # cut by hand below
        pad_token_id=tok.pad_token_id,
    )[0, len(ids) :].tolist()
    return out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out


@pytest.mark.parametrize("make", [hf_llama, hf_gpt2])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_answers_are_hugging_faces_greedy_answers_of_each_prompt_alone(make, batch_size):
    model, tok = make(), tokenizer()
    got = tpc.generate_answers(model, PROMPTS, 12, batch_size=batch_size, tokenizer=tok, progress=False)
    ids, _ = tpc.adapters.get_adapter(model, tokenizer=tok).tokenize(PROMPTS, chat_template=True, max_tokens=512)
    assert got.prompt_lengths == [len(i) for i in ids] and got.prompts == PROMPTS
    for i, p in enumerate(ids):
        want = _alone(model, tok, p, 12)
        assert got.sequences[i] == p + want
        assert got.answer_ids(i) == want and got.ended[i] == (tok.eos_token_id in want)
        assert got.texts[i] == tok.decode(want, skip_special_tokens=True)


def test_an_answer_ends_at_eos_and_the_others_go_on():
    model, tok = hf_llama(), tokenizer()
    first = tpc.generate_answers(model, PROMPTS, 8, tokenizer=tok, progress=False).answer_ids(0)[0]
    tok.eos_token = tok.convert_ids_to_tokens(first)  # prompt 0's first token now ends an answer
    assert tok.eos_token_id == first
    got = tpc.generate_answers(model, PROMPTS, 8, tokenizer=tok, progress=False)
    assert got.answer_ids(0) == [first] and got.ended[0]
    ids, _ = tpc.adapters.get_adapter(model, tokenizer=tok).tokenize(PROMPTS, chat_template=True, max_tokens=512)
    for i in (1, 2):  # the batch goes on without the row that ended
        want = _alone(model, tok, ids[i], 8)
        assert got.answer_ids(i) == want and got.ended[i] == (first in want)


def test_answers_label_their_conversations_by_garaks_rule():
    opener = tpc.data.refusal_strings()["Prefixes"][1][0]
    a = tpc.Answers(
        ["q1", "q2", "q3"], [f"{opener}, no.", "Step one: ...", f"{opener}."], [[1], [2], [3]], [1] * 3, [False] * 3
    )
    assert a.refused.tolist() == [True, False, True]
    y, groups = a.labels([1, 1, 0])
    assert y.tolist() == [0, 1, 0] and groups.tolist() == ["refused", "harmful", "benign"]


def test_answers_through_nnsight_are_the_underlying_models():
    pytest.importorskip("nnsight")
    hf, tok = hf_llama(), tokenizer()
    via = tpc.generate_answers(nnsight_lm(hf), PROMPTS, 10, batch_size=3, tokenizer=tok, progress=False)
    assert via == tpc.generate_answers(hf, PROMPTS, 10, batch_size=3, tokenizer=tok, progress=False)


@pytest.mark.parametrize("kw, message", [({"max_new_tokens": 0}, "max_new_tokens"), ({"batch_size": 0}, "batch_size")])
def test_generate_answers_refuses_bad_settings(kw, message):
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.generate_answers(hf_llama(), PROMPTS, **{"max_new_tokens": 4, **kw}, tokenizer=tokenizer())
