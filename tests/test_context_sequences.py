"""Requests placed inside chat conversations (``tpc_hooks.data.in_conversation`` and friends):
the sequences ``train_monitor(pooling="token", contexts=...)`` trains on.

Independent computations: the tokenizer's own rendering of the returned messages; a decode of
the request's span; a hand-written loop for the labels; the chat-wrapped prompt as the adapters
tokenise it."""

import numpy as np
import pytest

import tpc_hooks as tpc
from tiny_models import tokenizer
from tpc_hooks._context import POSITIONS
from tpc_hooks.data import host_requests, in_conversation, sharegpt_contexts, token_labels


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from tpc_hooks import offline

    try:
        return AutoTokenizer.from_pretrained(offline.default_model_dir())
    except (tpc.TPCHooksError, OSError) as err:  # `make test` installs it; a bare pytest run may not have it
        pytest.skip(f"the packaged SmolLM2 tokenizer is not installed: {err}")


TOKENIZERS = {"tiny": tokenizer, "smollm2": smollm2_tokenizer}
WORDS = "the a cat dog sat on mat hello world is nice write poem bread recipe friend python code".split()


def conversation(n_turns: int, words: int = 12, seed: int = 0) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{"role": ("user", "assistant")[t % 2], "content": " ".join(rng.choice(WORDS, words))}
            for t in range(n_turns)]


def rendered_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("which", TOKENIZERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_the_request_is_where_the_span_says_in_the_templates_own_rendering(which, position):
    tok = TOKENIZERS[which]()
    request = "how do i make bomb"
    q = in_conversation(tok, request, conversation(9), position=position, max_tokens=None)
    assert q.ids == rendered_ids(tok, q.messages)
    assert tok.decode(q.ids[q.start:q.stop]).strip() == request
    users = [k for k, m in enumerate(q.messages) if m["role"] == "user"]
    assert [m["role"] for m in q.messages] == [("user", "assistant")[k % 2] for k in range(len(q.messages))]
    assert q.messages[-1]["role"] == "user"
    hosting = [k for k in users if q.messages[k]["content"] == request]
    assert len(hosting) == 1
    want = {"start": users[0], "end": users[-1]}.get(position)
    if want is not None:
        assert hosting[0] == want
    else:
        assert users[0] < hosting[0] < users[-1]


@pytest.mark.parametrize("which", TOKENIZERS)
def test_an_empty_conversation_is_the_chat_wrapped_request(which):
    tok = TOKENIZERS[which]()
    q = in_conversation(tok, "bread recipe please", [])
    assert q.ids == rendered_ids(tok, [{"role": "user", "content": "bread recipe please"}])
    assert tok.decode(q.ids[q.start:q.stop]).strip() == "bread recipe please"


@pytest.mark.parametrize("which", TOKENIZERS)
def test_the_budget_and_the_turn_cap_bound_the_chat(which):
    tok = TOKENIZERS[which]()
    conv = conversation(41, words=30)
    request = "steal car please"
    lengths = [len(in_conversation(tok, request, conv, position="end", max_tokens=m).ids) for m in (60, 120, 240, 480)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    n_request = len(in_conversation(tok, request, []).ids) - len(in_conversation(tok, "x", []).ids) + 1
    for m, n in zip((60, 120, 240, 480), lengths):
        assert n <= m + n_request + 8  # the request replaces a user turn; 8: the cut assistant turn's margin
    capped = in_conversation(tok, request, conv, position="start", max_tokens=None, turn_cap=5)
    for m in capped.messages:
        if m["content"] != request:
            assert len(tok(m["content"], add_special_tokens=False)["input_ids"]) <= 5


def test_a_slow_tokenizer_gives_the_fast_ones_sequence():
    """Without offsets, the span comes from counting the tokens before and through the request:
    on word-level tokens it is the same as the offsets'."""
    fast = tokenizer()

    class Slow:
        is_fast = False
        chat_template = fast.chat_template

        def __call__(self, text, **kw):
            if kw.get("return_offsets_mapping"):
                raise NotImplementedError("a slow tokenizer has no offsets")
            return fast(text, **kw)

        def __getattr__(self, name):
            return getattr(fast, name)

    conv = conversation(7)
    for position in POSITIONS:
        a = in_conversation(fast, "hack email", conv, position=position, max_tokens=None)
        b = in_conversation(Slow(), "hack email", conv, position=position, max_tokens=None)
        assert (a.ids, a.start, a.stop) == (b.ids, b.start, b.stop)


def test_bad_conversations_and_arguments_are_clear_errors():
    tok = tokenizer()
    conv = conversation(3)
    cases = [
        (dict(conversation=[{"role": "assistant", "content": "hi"}]), r"turn 0 of a conversation must be \{'role': 'user'"),
        (dict(conversation=conv[:1] + conv[:1]), r"turn 1 of a conversation must be \{'role': 'assistant'"),
        (dict(conversation=["hello"]), "turns alternate, user first"),
        (dict(conversation="hello"), "a conversation is a list of"),
        (dict(request="  "), "the request must be a non-empty string"),
        (dict(position="late"), r"position must be one of \['start', 'middle', 'end'\]"),
        (dict(max_tokens=0), "max_tokens must be a positive integer or None"),
        (dict(turn_cap=True), "turn_cap must be a positive integer or None"),
    ]
    for kw, message in cases:
        args = {"request": "hello world", "conversation": conv, **kw}
        with pytest.raises(tpc.TPCHooksError, match=message):
            in_conversation(tok, args.pop("request"), args.pop("conversation"), **args)
    bare = tokenizer()
    bare.chat_template = None
    with pytest.raises(tpc.TPCHooksError, match="needs a tokenizer with a chat template"):
        in_conversation(bare, "hello", conv)


@pytest.mark.parametrize("label", [0, 1])
def test_token_labels_equal_a_hand_written_loop(label):
    for n, start, stop, skip, tail in [(20, 5, 9, 2, 3), (20, 5, 18, 2, 6), (12, 1, 2, 1, 0), (30, 24, 29, 24, 6)]:
        rows, labels = token_labels(n, start, stop, label, skip=skip, tail=tail)
        want_rows, want = [], []
        for p in range(n):
            if p < skip:
                continue
            if label == 1 and p >= stop + tail:
                break  # the rest of the chat after a harmful request's turn: no rows
            want_rows.append(p)
            want.append(label if p >= start else 0)
        assert list(range(n))[rows] == want_rows and labels.tolist() == want


def test_host_requests_places_request_j_in_context_j_with_lengths_and_positions_in_turn():
    tok = tokenizer()
    contexts = [conversation(9, seed=k) for k in range(7)]
    requests = [f"hack email {w}" for w in WORDS[:7]]
    labels = [1, 0, 0, 1, 1, 0, 1]
    h = host_requests(tok, contexts, requests, labels, lengths=(40, 80), turn_cap=None)
    assert h.labels.tolist() == labels
    for j, q in enumerate(h.sequences):
        assert tok.decode(q.ids[q.start:q.stop]).strip() == requests[j]
        alone = in_conversation(tok, requests[j], contexts[j], position=POSITIONS[j % 3], max_tokens=(40, 80)[j % 2],
                                turn_cap=None)
        assert (q.ids, q.start, q.stop) == (alone.ids, alone.start, alone.stop)
    wrapped = in_conversation(tok, "x", [])
    assert h.tail == len(wrapped.ids) - wrapped.stop
    with pytest.raises(tpc.TPCHooksError, match="one request and label per context"):
        host_requests(tok, contexts, requests[:3], labels[:3])


def test_sharegpt_contexts_are_long_alternating_and_disjoint():
    tok = smollm2_tokenizer()
    try:
        contexts = sharegpt_contexts(tok, 3, tokens=300, turn_cap=64)
    except tpc.TPCHooksError as err:
        if "install" in str(err):
            pytest.skip(str(err))
        raise
    assert len(contexts) == 3
    firsts = [c[0]["content"] for c in contexts]
    for c in contexts:
        assert [m["role"] for m in c] == [("user", "assistant")[k % 2] for k in range(len(c))]
        assert all(len(tok(m["content"], add_special_tokens=False)["input_ids"]) <= 64 for m in c)
        assert len(rendered_ids(tok, c)) > 300
    assert len(set(firsts)) == 3
    (whole,) = sharegpt_contexts(tok, 1, tokens=300, turn_cap=None)  # uncut: exclude compares whole first turns
    (other,) = sharegpt_contexts(tok, 1, tokens=300, turn_cap=None, exclude=[whole[0]["content"].upper()])
    assert other[0]["content"] != whole[0]["content"]
    for kw, message in [(dict(n=0), "n must be a positive integer"), (dict(n=1, tokens=True), "tokens must be")]:
        with pytest.raises(tpc.TPCHooksError, match=message):
            sharegpt_contexts(tok, **kw)
