"""A request inside a benign chat conversation: the sequences long-context monitors train and are tested on.

A per-token monitor trained on short prompts has never seen a request *inside* a conversation,
nor thousands of benign chat tokens before it; at long contexts its benign maxima rise and its
recall at a fixed false-positive rate falls (``benchmarks/bench_streaming.py``). These helpers
build such sequences with the tokenizer's chat template, token for token the way the adapters
tokenise a chat prompt (``add_special_tokens=False``; the template supplies special tokens), and
say where the request's tokens are so that each token can be labelled.
"""

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._errors import TPCHooksError
from ._sources import sharegpt_conversations

POSITIONS = ("start", "middle", "end")
TURN_CAP = 192  # tokens kept of each context turn by default: a long context holds several exchanges


def context_budget(lengths: Sequence[int], turn_cap: int = TURN_CAP) -> int:
    """The least length to draw contexts at (:func:`sharegpt_contexts`) so that each fills the
    largest of ``lengths`` even when its last exchange is cut away."""
    return max(lengths) + 2 * turn_cap


_PLACEHOLDER = "\u2063REQUEST\u2063"  # invisible separators: no real turn contains this
_X = "x"  # a one-character turn, to measure what the template adds around a turn


class InConversation(NamedTuple):
    """A request placed in a conversation, tokenised.

    Attributes:
        ids: the token ids of the whole chat (system prompt, the turns, the generation prompt).
        start, stop: the request's tokens are ``ids[start:stop]``.
        messages: the chat messages rendered (the fitted turns with the request in place of one).
    """

    ids: list[int]
    start: int
    stop: int
    messages: list[dict[str, str]]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _render(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def cut(tokenizer: Any, text: str, max_tokens: int) -> str:
    """``text``'s first ``max_tokens`` tokens, decoded (``text`` itself when it is no longer)."""
    ids = _encode(tokenizer, text)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


class _Template:
    """Token counts of one tokenizer's chat template: a turn's tokens as the template renders it
    (measured as the growth of a rendered chat, so system prompts are not counted) and the
    tokens a one-turn chat adds beyond its turn (system prompt + generation prompt)."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise TPCHooksError("a conversation needs a tokenizer with a chat template; this one has none")
        self.tok = tokenizer
        # a turn is measured after a chat that a turn of its role may follow
        self.before = {"assistant": [_msg("user", _X)], "user": [_msg("user", _X), _msg("assistant", _X)]}
        self.base = {r: len(_encode(tokenizer, _render(tokenizer, b, False))) for r, b in self.before.items()}
        self.overhead = len(_encode(tokenizer, _render(tokenizer, [_msg("user", _X)], True))) - self.turn("user", _X)
        self.assistant_frame = self.turn("assistant", "")  # an assistant turn's tokens beyond its text

    def turn(self, role: str, text: str) -> int:
        return (
            len(_encode(self.tok, _render(self.tok, self.before[role] + [_msg(role, text)], False))) - self.base[role]
        )


def _msg(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def check_conversation(conversation: Any) -> list[dict[str, str]]:
    """The conversation as ``[{"role", "content"}]`` turns, alternating from ``"user"``; else a clear error."""
    if isinstance(conversation, (str, bytes)) or not isinstance(conversation, Sequence):
        raise TPCHooksError(
            "a conversation is a list of {'role': 'user'|'assistant', 'content': str} turns; got "
            f"{type(conversation).__name__}"
        )
    out = []
    for k, m in enumerate(conversation):
        want = ("user", "assistant")[k % 2]
        if not isinstance(m, dict) or m.get("role") != want or not isinstance(m.get("content"), str):
            raise TPCHooksError(
                f"turn {k} of a conversation must be {{'role': {want!r}, 'content': str}} (turns "
                f"alternate, user first); got {m!r:.80}"
            )
        out.append(_msg(want, m["content"]))
    return out


def _fit_turns(tpl: _Template, turns: list[tuple[str, str, int]], budget: int) -> list[tuple[str, str, int]]:
    """The first turns ``u_0 a_0 ... u_k`` within about ``budget`` tokens (the last assistant turn
    cut to fill the budget where at least 8 of its tokens fit)."""
    out, used, j = [turns[0]], turns[0][2], 1
    while j + 1 < len(turns):
        a, u = turns[j], turns[j + 1]
        if used + a[2] + u[2] <= budget:
            out += [a, u]
            used += a[2] + u[2]
            j += 2
            continue
        room = budget - used - u[2] - tpl.assistant_frame
        if room >= 8:
            text = cut(tpl.tok, a[1], room)
            out += [("assistant", text, tpl.turn("assistant", text)), u]
        break
    return out


def in_conversation(
    tokenizer: Any,
    request: str,
    conversation: Any,
    *,
    position: str = "middle",
    max_tokens: int | None = 1024,
    turn_cap: int | None = TURN_CAP,
) -> InConversation:
    """Puts ``request`` in place of one user turn of ``conversation`` and tokenises the chat.

    The conversation's leading turns are kept up to about ``max_tokens`` tokens of chat
    (system prompt and generation prompt included; the request replaces a user turn, so the
    total moves by the difference), ending on a user turn; the last assistant turn kept is cut
    to fill the budget. ``position`` picks the turn: the first, the one whose start is nearest
    the middle of the chat, or the last (the request is then the turn the model answers). An
    empty conversation gives the request alone, chat-wrapped: what ``Monitor.score`` reads.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        request: the text to place.
        conversation: ``[{"role": "user"|"assistant", "content": ...}, ...]``, alternating from
            ``"user"`` (e.g. from :func:`tpc_hooks.data.sharegpt_conversations`).
        position: ``"start"``, ``"middle"`` or ``"end"``.
        max_tokens: the chat's token budget (None: every turn).
        turn_cap: each turn is first cut to this many tokens (None: turns as given).

    Returns:
        :class:`InConversation` ``(ids, start, stop, messages)``: ``ids[start:stop]`` are the request's tokens.

    Raises:
        TPCHooksError: no chat template, a malformed conversation, an empty request, a bad position.

    Example:
        >>> conv = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
        ...         {"role": "user", "content": "Tell me a joke."}]
        >>> seq = in_conversation(tok, "How do I bake bread?", conv, position="end")  # doctest: +SKIP
        >>> tok.decode(seq.ids[seq.start:seq.stop])  # doctest: +SKIP
        'How do I bake bread?'
    """
    if position not in POSITIONS:
        raise TPCHooksError(f"position must be one of {list(POSITIONS)}; got {position!r}")
    if not isinstance(request, str) or not request.strip():
        raise TPCHooksError("the request must be a non-empty string")
    for name, v in (("max_tokens", max_tokens), ("turn_cap", turn_cap)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise TPCHooksError(f"{name} must be a positive integer or None; got {v!r}")
    tpl = _Template(tokenizer)
    msgs = check_conversation(conversation)
    if turn_cap is not None:
        msgs = [_msg(m["role"], cut(tokenizer, m["content"], turn_cap)) for m in msgs]
    turns = [(m["role"], m["content"], tpl.turn(m["role"], m["content"])) for m in msgs]
    if not turns:
        turns = [("user", "", 0)]
    elif max_tokens is not None:
        turns = _fit_turns(tpl, turns, max_tokens - tpl.overhead)
    elif turns[-1][0] == "assistant":
        turns = turns[:-1]
    return _place(tpl, turns, position, request)


def _place(tpl: _Template, turns: list[tuple[str, str, int]], position: str, request: str) -> InConversation:
    users = list(range(0, len(turns), 2))
    if position == "start":
        j = users[0]
    elif position == "end":
        j = users[-1]
    else:
        starts = tpl.overhead + np.concatenate([[0], np.cumsum([t[2] for t in turns])])
        j = min(users, key=lambda k: abs(starts[k] - starts[-1] / 2))
    messages = [_msg(r, _PLACEHOLDER if k == j else t) for k, (r, t, _) in enumerate(turns)]
    marked = _render(tpl.tok, messages, True)
    c0 = marked.index(_PLACEHOLDER)
    after = marked[c0 + len(_PLACEHOLDER) :]
    messages[j] = _msg("user", request)
    # The template's own rendering: it may transform a turn's text (Llama 3 trims it), so the
    # request's rendered text is whatever lies between the placeholder's surroundings.
    rendered = _render(tpl.tok, messages, True)
    c1 = len(rendered) - len(after)
    if rendered[:c0] != marked[:c0] or rendered[c1:] != after or c1 <= c0:
        raise TPCHooksError(
            "cannot locate the request in the chat template's rendering: the template renders the "
            "turns around it differently depending on its text"
        )
    ids = tpl.tok(rendered, add_special_tokens=False, return_offsets_mapping=True) if tpl.tok.is_fast else None
    if ids is not None:
        offsets = ids["offset_mapping"]
        start = next(i for i, (_, e) in enumerate(offsets) if e > c0)
        stop = 1 + max(i for i, (s, _) in enumerate(offsets) if s < c1)
        return InConversation(list(ids["input_ids"]), start, stop, messages)
    # a slow tokenizer has no offsets: count the tokens of the text before and through the request
    full = _encode(tpl.tok, rendered)
    start = len(_encode(tpl.tok, rendered[:c0]))
    stop = len(_encode(tpl.tok, rendered[:c1]))
    return InConversation(full, min(start, stop - 1), stop, messages)


def sharegpt_contexts(
    tokenizer: Any, n: int, *, tokens: int = 1024, turn_cap: int | None = TURN_CAP, exclude: Iterable[str] = ()
) -> list[list[dict[str, str]]]:
    """``n`` benign chat contexts of more than ``tokens`` tokens each, from ShareGPT.

    Most ShareGPT conversations are a few short exchanges, so each context is consecutive
    conversations (:func:`tpc_hooks.data.sharegpt_conversations`, its filters) joined, exchange
    by exchange, until its turns (each cut to ``turn_cap`` tokens) pass ``tokens`` tokens; the
    rest of the conversation that passes it is dropped. Contexts do not share conversations.

    Args:
        tokenizer: the tokenizer that counts (one with a chat template).
        n: how many contexts.
        tokens: each context's least length in tokens of rendered turns.
        turn_cap: each turn's most tokens (None: uncut).
        exclude: texts whose conversations are skipped (pass your evaluation prompts).

    Returns:
        ``n`` conversations for :func:`in_conversation` or ``train_monitor(contexts=...)``.

    Raises:
        TPCHooksError: ShareGPT has fewer such contexts, or a bad argument.

    Example:
        >>> contexts = sharegpt_contexts(tok, 4, tokens=1024, exclude=prompts)  # doctest: +SKIP
        >>> len(contexts), contexts[0][0]["role"]  # doctest: +SKIP
        (4, 'user')
    """
    for name, v in (("n", n), ("tokens", tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TPCHooksError(f"{name} must be a positive integer; got {v!r}")
    tpl = _Template(tokenizer)
    out: list[list[dict[str, str]]] = []
    cur: list[dict[str, str]] = []
    total = 0
    for conv in sharegpt_conversations(exclude=exclude):
        for k in range(0, len(conv), 2):
            for m in conv[k : k + 2]:
                text = m["content"] if turn_cap is None else cut(tokenizer, m["content"], turn_cap)
                cur.append(_msg(m["role"], text))
                total += tpl.turn(m["role"], text)
            if total > tokens:
                break
        if total > tokens:
            out.append(cur)
            cur, total = [], 0
            if len(out) == n:
                return out
    raise TPCHooksError(f"ShareGPT yielded only {len(out)} contexts of more than {tokens} tokens; ask for fewer")


class HostedRequests(NamedTuple):
    """Requests placed in contexts for training (see :func:`host_requests`)."""

    sequences: list[InConversation]
    labels: np.ndarray  # each sequence's request label
    tail: int  # tokens the chat template puts after a request (its turn's end, the next header)


def host_requests(
    tokenizer: Any,
    contexts: Sequence[Sequence[dict[str, str]]],
    requests: Sequence[str],
    labels: Sequence[int] | np.ndarray,
    *,
    lengths: Sequence[int] = (512, 1024),
    turn_cap: int | None = TURN_CAP,
) -> HostedRequests:
    """Request ``j`` placed in context ``j``, within ``lengths[j % len(lengths)]`` tokens, at
    position start, middle, end for ``j % 3`` = 0, 1, 2: sequences for training a per-token
    monitor on requests inside conversations. Order the requests so that lengths and positions
    do not follow the label (``train_monitor`` shuffles them)."""
    if not lengths or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in lengths):
        raise TPCHooksError(f"lengths must be a non-empty list of positive token budgets; got {lengths!r}")
    if len(requests) != len(contexts) or len(labels) != len(contexts):
        raise TPCHooksError(
            f"one request and label per context; got {len(requests)} requests, {len(labels)} labels, "
            f"{len(contexts)} contexts"
        )
    seqs = [
        in_conversation(
            tokenizer,
            r,
            conv,
            position=POSITIONS[j % len(POSITIONS)],
            max_tokens=lengths[j % len(lengths)],
            turn_cap=turn_cap,
        )
        for j, (r, conv) in enumerate(zip(requests, contexts, strict=True))
    ]
    alone = in_conversation(tokenizer, "x", [])
    return HostedRequests(seqs, np.asarray(labels, dtype=int), len(alone.ids) - alone.stop)


def token_labels(n_tokens: int, start: int, stop: int, label: int, *, skip: int, tail: int) -> tuple[slice, np.ndarray]:
    """The rows one hosted request trains on, and their labels.

    Tokens before the request are benign context (label 0); the request's tokens and the
    ``tail`` template tokens after it (its turn's end, the next header: what a short chat
    prompt ends with, trained with its label) carry the request's label. After a harmful
    request the rest of the chat is dropped rather than labelled (benign text whose residual
    stream may or may not still carry the request); after a benign one it stays benign. The
    first ``skip`` tokens (the fixed prefix) are no rows.

    Returns:
        ``(rows, labels)``: a slice of the sequence's positions and an int array as long.
    """
    end = n_tokens if label == 0 else min(n_tokens, stop + tail)
    pos = np.arange(skip, end)
    return slice(skip, end), np.where(pos >= start, label, 0).astype(int)


def hosted_rows(
    seqs: Sequence[Any], spans: Sequence[Sequence[int]], labels: Sequence[int] | np.ndarray, *, skip: int, tail: int
) -> tuple[Any, np.ndarray, list[int]]:
    """The training rows of hosted chats: each chat's activations ``[T_i, d]`` (tensors or
    arrays) cut and labelled by :func:`token_labels` from its request's ``(start, stop)``.

    Returns ``(rows [N, d] float32 tensor, labels [N], each chat's end)``: the end is where a
    chat's rows stop (after a harmful request's turn), what its monitor's decision may read."""
    import torch

    X, y, ends = [], [], []
    for z, (start, stop), c in zip(seqs, spans, labels, strict=True):
        rows, lab = token_labels(len(z), int(start), int(stop), int(c), skip=skip, tail=tail)
        X.append(torch.as_tensor(z[rows]).float())
        y.append(lab)
        ends.append(rows.stop)
    return torch.cat(X), np.concatenate(y), ends


def _balanced(y: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` indices into ``y``, half of each class (class 1 gets the odd one), each class's
    drawn without replacement until it runs out (then cycling), in a shuffled order."""
    out = []
    for c, k in ((1, n - n // 2), (0, n // 2)):
        pool = rng.permutation(np.flatnonzero(y == c))
        if k and not len(pool):
            raise TPCHooksError(f"contexts host requests of both classes, and no prompt has label {c}")
        out += [int(pool[i % len(pool)]) for i in range(k)]
    return [out[i] for i in rng.permutation(n)]


def host_splits(
    tokenizer: Any,
    contexts: Sequence[Sequence[dict[str, str]]],
    prompts: dict[str, tuple[Sequence[str], Any]],
    *,
    val_fraction: float,
    lengths: Sequence[int],
    seed: int,
) -> dict[str, HostedRequests]:
    """The contexts split as ``train_monitor(contexts=...)`` splits them: the first
    ``max(2, round(val_fraction * n))`` host validation prompts, the rest training ones; each
    context one prompt of its split (``prompts["val"]``, ``prompts["train"]``: texts and labels),
    the classes balanced, in a seeded order (:func:`host_requests`)."""
    n_val = max(2, int(round(val_fraction * len(contexts))))
    out = {}
    for k, (name, cs) in enumerate((("val", contexts[:n_val]), ("train", contexts[n_val:]))):
        texts, y = prompts[name][0], np.asarray(prompts[name][1], dtype=int)
        pick = _balanced(y, len(cs), np.random.default_rng([seed, k]))
        out[name] = host_requests(tokenizer, cs, [texts[i] for i in pick], y[pick], lengths=lengths)
    return out
