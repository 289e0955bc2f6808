"""The model's own answers to prompts, as data: :func:`generate_answers` and :class:`Answers`."""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .._errors import TPCHooksError
from ..activations import get_adapter, pad, pad_id
from ..data import check_prompts, conversation_labels, is_refusal


@dataclass(frozen=True)
class Answers:
    """The answers a model wrote to ``prompts`` (:func:`generate_answers`).

    ``sequences[i]``: prompt ``i``'s token ids as the model read them (chat template, BOS) followed
    by its answer's ids, the EOS token kept when it wrote one (``ended[i]``) within the token budget;
    ``prompt_lengths[i]``: where the answer starts; ``texts[i]``: the answer decoded (special tokens
    skipped). :attr:`refused` marks the answers that refuse (:func:`tpc_hooks.data.is_refusal`) and
    :meth:`labels` labels the conversations by it.

    Example:
        >>> a = Answers(["Hi?"], ["Hello."], [[1, 2, 3, 9]], [2], [False])
        >>> a.answer_ids(0), len(a), a.refused.tolist()
        ([3, 9], 1, [False])
    """

    prompts: list[str]
    texts: list[str]
    sequences: list[list[int]]
    prompt_lengths: list[int]
    ended: list[bool]

    def __len__(self) -> int:
        return len(self.prompts)

    def answer_ids(self, i: int) -> list[int]:
        """The ids of answer ``i`` (its EOS kept when it wrote one)."""
        return self.sequences[i][self.prompt_lengths[i] :]

    @property
    def refused(self) -> np.ndarray:
        """Whether each answer refuses, by garak's rule (:func:`tpc_hooks.data.is_refusal`)."""
        return np.array([is_refusal(t) for t in self.texts], dtype=bool)

    def labels(self, labels: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The conversations' labels and groups, given the requests' ``labels``
        (:func:`tpc_hooks.data.conversation_labels`: harmful when the request is harmful and the
        answer does not refuse; a refused harmful request is the group ``"refused"``)."""
        return conversation_labels(labels, self.texts)


def generate_answers(
    model: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 64,
    *,
    chat_template: bool | None = None,
    prepend_bos: bool | None = None,
    max_tokens: int | None = 512,
    batch_size: int = 8,
    tokenizer: Any = None,
    progress: bool = True,
) -> Answers:
    """The model's greedy answers to ``prompts``, batched through its adapter's own decode loop (a
    vLLM ``LLM``: through the engine, each request opted out of any armed monitor).

    Prompts are read as a monitor reads them (the chat template, with the assistant's turn opened,
    and BOS); each answer ends at the tokenizer's EOS token or after ``max_new_tokens``. Batches are
    left-padded: an answer can differ from the one the prompt gets alone by the rounding padding
    changes (greedy picks the same token unless two were within it).

    Args:
        chat_template: wrap prompts as a chat user turn; default: when the tokenizer has a template.
        prepend_bos: prepend BOS to raw prompts; default: when the tokenizer has a BOS token.
        max_tokens: the prompt tokens read (a longer prompt keeps its first ``max_tokens``).
        tokenizer: the tokenizer of a ``transformers`` model (default: loaded from its
            ``name_or_path``); toolkit models use their own.

    Returns:
        :class:`Answers`.

    Example:
        >>> answers = tpc.generate_answers(model, ["How do I pick a lock?"], 64)  # doctest: +SKIP
        >>> answers.texts[0], answers.refused[0]  # doctest: +SKIP
    """
    items = check_prompts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise TPCHooksError(f"max_new_tokens must be an integer >= 1; got {max_new_tokens!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TPCHooksError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    adapter = get_adapter(model, tokenizer=tokenizer)
    tok = adapter.tokenizer
    if chat_template is None:
        chat_template = bool(getattr(tok, "chat_template", None))
    ids, _ = adapter.tokenize(items, chat_template=chat_template, max_tokens=max_tokens, prepend_bos=prepend_bos)
    eos = getattr(tok, "eos_token_id", None)
    if adapter.engine:
        written = adapter.answer(ids, max_new_tokens)
    else:
        written = []
        with tqdm(total=len(ids), desc="answer", unit="prompt", disable=not progress) as bar:
            for start in range(0, len(ids), batch_size):
                written += _greedy(adapter, ids[start : start + batch_size], max_new_tokens, eos)
                bar.update(min(batch_size, len(ids) - start))
    ended = [bool(w) and eos is not None and w[-1] == eos for w in written]
    return Answers(
        items,
        [tok.decode(w, skip_special_tokens=True) for w in written],
        [p + w for p, w in zip(ids, written, strict=True)],
        [len(p) for p in ids],
        ended,
    )


def _greedy(adapter: Any, ids: list[list[int]], max_new_tokens: int, eos: int | None) -> list[list[int]]:
    """One left-padded batch's greedy answers through ``adapter.decode`` (no site read), each up to
    and including its EOS."""
    pid = pad_id(adapter.tokenizer)
    x, mask = pad(ids, pid, "left")
    out: list[list[int]] = [[] for _ in ids]
    state: dict[str, Any] = {"t": 0, "live": [True] * len(ids)}

    def on_step(acts: Any, step_mask: torch.Tensor, logits: torch.Tensor) -> Any:
        t, live = state["t"], state["live"]
        if t == max_new_tokens:
            return None
        chosen = logits.argmax(-1).tolist()
        for b, on in enumerate(live):
            if on:
                out[b].append(chosen[b])
                live[b] = chosen[b] != eos
        state["t"] = t + 1
        if not any(live) or t + 1 == max_new_tokens:
            return None
        nxt = torch.tensor([c if on else pid for c, on in zip(chosen, live, strict=True)])
        return nxt, torch.tensor(live)

    adapter.decode(x, mask, None, max_new_tokens, on_step)
    return out


def conversation_ids(
    adapter: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    chat_template: bool,
    max_tokens: int | None,
    prepend_bos: bool | None,
    what: str = "score",
    cut: list[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Each (prompt, response) conversation as a monitor reads it, and where each answer starts: the
    prompt's ids (its chat template with the assistant's turn opened, BOS, ``max_tokens``) followed by
    the response's ids (encoded with no special token).

    A conversation past ``max_tokens`` keeps the answer's first tokens that fit (at least one), and a
    warning says how many were cut (``cut``, a list given: their positions are added to it). Raises
    on ``responses`` not one string per prompt, or a response with no token.
    """
    items = check_prompts(prompts)
    if isinstance(responses, str) or not isinstance(responses, Sequence):
        raise TPCHooksError(f"{what}: responses must be a list of strings, one per prompt")
    if len(responses) != len(items):
        raise TPCHooksError(f"{what}: {len(responses)} responses for {len(items)} prompts; pass one per prompt")
    ids, _ = adapter.tokenize(items, chat_template=chat_template, max_tokens=max_tokens, prepend_bos=prepend_bos)
    out: list[list[int]] = []
    cut = [] if cut is None else cut
    for i, (p, r) in enumerate(zip(ids, responses, strict=True)):
        if not isinstance(r, str):
            raise TPCHooksError(f"{what}: response {i} is a {type(r).__name__}, not a string")
        a = adapter.tokenizer.encode(r, add_special_tokens=False)
        if not a:
            raise TPCHooksError(f"{what}: response {i} is empty: a conversation needs at least one answer token")
        room = len(a) if max_tokens is None else max(1, max_tokens - len(p))
        if room < len(a):
            cut.append(i)
        out.append(list(p) + list(a[:room]))
    if cut:
        warnings.warn(
            f"{what}: {len(cut)} of {len(out)} conversations were longer than max_tokens={max_tokens}: "
            f"their answers keep the tokens that fit (conversations {cut[:5]}{' ...' if len(cut) > 5 else ''})",
            stacklevel=3,
        )
    return out, [len(p) for p in ids]


def read_ids(
    monitor: Any,
    adapter: Any,
    prompts: Sequence[str] | None,
    responses: Sequence[str] | None,
    tokens: Sequence[Sequence[int]] | None,
    answer_starts: Sequence[int] | None,
) -> tuple[list[list[int]], list[int] | None]:
    """What :meth:`Monitor.score` reads: the token ids, and where each answer starts (a response monitor;
    None: every token is pooled)."""
    if (prompts is None) == (tokens is None):
        raise TPCHooksError("pass prompts or tokens (exactly one)")
    if tokens is not None and responses is not None:
        raise TPCHooksError("responses= goes with prompts=; with tokens=, pass answer_starts=")
    if prompts is not None and answer_starts is not None:
        raise TPCHooksError("answer_starts= goes with tokens=; with prompts=, pass responses=")
    if monitor.answers and responses is None and answer_starts is None:
        raise TPCHooksError(
            'this is a response monitor (reads="answer"): it scores answers; pass responses= (one per '
            "prompt), or tokens= with answer_starts="
        )
    if answer_starts is not None and not monitor.answers:
        raise TPCHooksError("answer_starts= is for a response monitor; a prompt monitor reads every token of tokens=")
    if prompts is not None:
        if responses is None:
            ids, _ = adapter.tokenize(
                check_prompts(prompts),
                chat_template=monitor.chat_template,
                max_tokens=monitor.max_tokens,
                prepend_bos=monitor.prepend_bos,
            )
            return ids, None
        ids, starts = conversation_ids(adapter, prompts, responses, **monitor._reading())
        return ids, starts if monitor.answers else None
    assert tokens is not None  # one of the two, checked above
    ids = [list(map(int, t)) for t in tokens]
    if not ids or any(len(t) == 0 for t in ids):
        raise TPCHooksError("tokens must be a non-empty list of non-empty token id lists")
    if answer_starts is None:
        return ids, None
    starts = [int(a) for a in answer_starts]
    if len(starts) != len(ids) or any(not 0 <= a < len(t) for a, t in zip(starts, ids, strict=False)):
        raise TPCHooksError(
            "answer_starts must give, for each token list, where its answer starts: 0 <= start < its "
            "length (at least one answer token)"
        )
    return ids, starts
