"""Several monitors on one model at once: :class:`MonitorSet`. Its members share every forward
pass (each site is read once, however many members read it) and each keeps its own pooling,
policy, threshold and action; the run records every member's steps under its name."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

import torch

from .._errors import TPCHooksError
from ..activations import Adapter
from ..head import CascadeResult, Together, check_features, check_width
from . import _generation
from ._monitor import Monitor
from ._monitor_config import ACTIONS
from ._records import LastRun, MonitorEvent, MonitorSetRun

_SHARED = ("chat_template", "max_tokens", "prepend_bos")  # what the one tokenisation of a pass needs to agree on


_F = TypeVar("_F", bound=Callable[..., Any])


def _checked_here(fn: _F) -> _F:
    """``fn`` checks its arguments itself, with messages that name the fix: a runtime type checker
    (beartype, jaxtyping's import hook) would otherwise answer ``MonitorSet(..., stacked="no")``
    with its own error first. Static checkers still read the annotations and the body."""
    fn.__no_type_check__ = True  # type: ignore[attr-defined]
    return fn


def _shared(key: str) -> property:
    """A setting every member of a :class:`MonitorSet` shares, read from its first member."""
    return property(lambda self: getattr(next(iter(self._monitors.values())), key))


class MonitorSet(Mapping[str, Monitor], LastRun):
    """Monitors that run together on one model, each under a name.

    Wherever a :class:`~tpc_hooks.Monitor` runs while a model generates (:meth:`generate` on
    every adapter, :meth:`watch`, the Hugging Face :meth:`stopping_criteria` and
    :meth:`logits_processor`), a set runs all its members on the same forward passes: each site
    is hooked and read once, however many members read it, and each member scores it with its
    own pooling, policy (its saved cascade, else the full polynomial) and threshold; members whose
    policies share a shape are scored in one stacked evaluation per pass (``stacked=False``: each
    by its own policy). Each member scores exactly as it would alone (tested step for step, bit for
    bit). A member's action is ``"stop"`` (a row ends at the first step this member flags) or
    ``"flag"`` (recorded only); a row ends when any stopping member flags it. Without a model,
    :meth:`score_activations` scores pooled activations with every member's policy the same way.

    The members share one tokenisation of each prompt, so their ``chat_template``,
    ``max_tokens`` and ``prepend_bos`` must agree.

    Args:
        monitors: name -> :class:`~tpc_hooks.Monitor` (names: non-empty, without ``=`` or ``:``).
        actions: ``"flag"`` or ``"stop"`` for every member, or a dict name -> action (members
            not named: ``"flag"``).
        stacked: True (the default): the members whose policies share a shape are scored in one
            stacked evaluation; False: each member runs its own policy. The results are the same
            bits either way; False is for measuring what stacking saves, or ruling it out while
            debugging (see :attr:`stacked`).

    Attributes:
        last_run: the :class:`~tpc_hooks.MonitorSetRun` of the latest Hugging Face ``generate``
            call served by the set's :meth:`stopping_criteria` or :meth:`logits_processor` (None
            before any). ``last_generate_log``: its deprecated name.

    Example:
        >>> import tpc_hooks as tpc
        >>> harm = tpc.Monitor(tpc.TPC(8, 2, 2), "blocks.1.hook_resid_post")
        >>> pii = tpc.Monitor(tpc.TPC(8, 2, 2), "blocks.0.hook_resid_post", pooling="max")
        >>> monitors = tpc.MonitorSet({"harm": harm, "pii": pii}, actions={"harm": "stop"})
        >>> monitors.actions, monitors.sites
        ({'harm': 'stop', 'pii': 'flag'}, ['blocks.0.hook_resid_post', 'blocks.1.hook_resid_post'])
        >>> run = monitors.generate(model, prompts, max_new_tokens=32)  # doctest: +SKIP
        >>> run["harm"].scores[0], run.stopped_by  # doctest: +SKIP
    """

    @_checked_here
    def __init__(self, monitors: Mapping[str, Any], *, actions: str | Mapping[str, str] = "flag", stacked: bool = True):
        if not isinstance(monitors, Mapping) or not monitors:
            raise TPCHooksError("MonitorSet needs a non-empty dict name -> Monitor, e.g. MonitorSet({'harm': monitor})")
        for name, m in monitors.items():
            if not isinstance(name, str) or not name or any(c in name for c in "=:") or name != name.strip():
                raise TPCHooksError(
                    f"a member's name must be a non-empty string without '=', ':' or surrounding spaces; got {name!r}"
                )
            if not isinstance(m, Monitor):
                raise TPCHooksError(f"member {name!r} is a {type(m).__name__}, not a tpc_hooks.Monitor")
        for key in _SHARED:
            values = {name: getattr(m, key) for name, m in monitors.items()}
            if len(set(values.values())) > 1:
                raise TPCHooksError(
                    f"the members read differently tokenised prompts ({key}: {values}); a set runs them on the same "
                    f"forward passes: give them the same {key} (monitor.{key} = ...), or run them apart"
                )
        self._monitors = dict(monitors)
        self.actions = self._actions(actions)
        self.stacked = stacked
        self.last_run: MonitorSetRun | None = None

    def _actions(self, actions: Any, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``actions`` (one for all, or by name over ``base``, default every member flags) checked."""
        base = dict(base) if base is not None else {name: "flag" for name in self._monitors}
        if actions is None:
            return base
        if isinstance(actions, str):
            actions = dict.fromkeys(self._monitors, actions)
        if not isinstance(actions, Mapping):
            raise TPCHooksError(
                f"a MonitorSet's action must be 'flag' or 'stop' (for all, or by name); got {actions!r}. "
                "A callable action decides for one monitor alone: monitor.generate(..., action=f)"
            )
        unknown = sorted(set(actions) - set(self._monitors))
        if unknown:
            raise TPCHooksError(f"actions name {unknown}, which are not members of this set ({list(self._monitors)})")
        for name, act in actions.items():
            if act not in ACTIONS:
                raise TPCHooksError(f"the action of {name!r} must be 'flag' or 'stop'; got {act!r}")
        return {**base, **actions}

    # ------------------------------------------------------------------ a mapping of its members
    def __getitem__(self, name: str) -> Monitor:
        if name not in self._monitors:
            raise KeyError(f"{name!r} is not a member of this set ({list(self._monitors)})")
        return self._monitors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._monitors)

    def __len__(self) -> int:
        return len(self._monitors)

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {m.site} ({self.actions[n]})" for n, m in self._monitors.items())
        return f"MonitorSet({parts})"

    @property
    def stacked(self) -> bool:
        """Whether the members whose policies share a shape (width, degree or order, packed rank,
        trust region, gate, ``escalate_only``) are scored in one stacked evaluation per pass (True,
        the default) or each by its own policy (False). Each member's results are the same bits
        either way. Read by every monitored loop the set runs (:meth:`generate`, :meth:`watch`,
        the Hugging Face hooks) and by :meth:`score_activations`; a vLLM engine's workers always
        stack. Assignable (``monitors.stacked = False``)."""
        return self._stacked

    @stacked.setter
    @_checked_here
    def stacked(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TPCHooksError(
                f"stacked must be True (score the members of one shape in one stacked evaluation) or False "
                f"(each member by its own policy); got {value!r}"
            )
        self._stacked = value
        self._together = Together(stacked=value)  # keeps the stacked weights score_activations made

    @property
    def sites(self) -> list[str]:
        """The distinct sites the members read, each read once per forward pass."""
        return sorted({m.site for m in self._monitors.values()})

    # the tokenisation every member shares (checked equal when the set is made)
    chat_template, max_tokens, prepend_bos = (_shared(k) for k in _SHARED)

    # ------------------------------------------------------------------ what the loops read
    def _adapter(self, model: Any, tokenizer: Any = None) -> Adapter:
        """The model's adapter, with every member checked against it (site, width, SAE) and moved
        to its device."""
        adapters = [m._adapter(model, tokenizer=tokenizer) for m in self._monitors.values()]
        return adapters[0]

    def _members(self, actions: Any) -> list[tuple[str, Monitor, str]]:
        """What a monitored loop runs: each member by name with its action (``actions`` over the set's)."""
        acts = self._actions(actions, self.actions)
        return [(name, m, acts[name]) for name, m in self._monitors.items()]

    def _result(self, runs: dict[str, Any]) -> MonitorSetRun:
        """What a monitored loop returns from its runs by name."""
        return MonitorSetRun(runs)

    # ------------------------------------------------------------------ scoring pooled activations
    @_checked_here
    def score_activations(self, acts: Mapping[str, Any]) -> dict[str, CascadeResult]:
        """Scores pooled activations with every member's own policy, without a model.

        Each member reads the rows at its site, ``acts[member.site]`` (``[n, d_model]``, a tensor
        or an array; pooled as that member pools, e.g. by :func:`~tpc_hooks.collect`; SAE
        latents for a member with an SAE), and scores them with its deployed policy
        (:meth:`Monitor.policy`: its cascade, else the full polynomial) by the per-step rule a
        generation runs (``member.policy().step``: the same bits as in :meth:`generate`; equal
        to ``member.policy()(rows)`` up to float rounding). The members whose policies share a
        shape are scored in one stacked evaluation, unless :attr:`stacked` is False; either way
        each result is the one the member gets alone. A member's weights are packed once and
        repacked when its parameters change (an optimiser step, ``load_state_dict``, ``to``);
        an edit through ``.data``, which no version counter sees, is not read.

        Args:
            acts: site -> pooled rows, one row per input, the same inputs at every site (sites no
                member reads are ignored).

        Returns:
            name -> :class:`~tpc_hooks.CascadeResult` over the ``n`` rows, its ``threshold`` the
            member's own, so ``.flagged`` is the member's decision
            (``decision_logits >= logit(threshold)``).

        Raises:
            TPCHooksError: ``acts`` not a mapping, a member's site missing from it, a per-token
                member (``pooling="token"``; it scores every token, not pooled rows), rows that are
                not 2-D, empty, of another width than a member's head or holding NaN/inf, or sites
                with different numbers of rows.

        Example:
            >>> import torch, tpc_hooks as tpc
            >>> harm = tpc.Monitor(tpc.TPC(8, 2, 2), "blocks.1.hook_resid_post")
            >>> jb = tpc.Monitor(tpc.TPC(8, 2, 2), "blocks.1.hook_resid_post", threshold=0.9)
            >>> monitors = tpc.MonitorSet({"harm": harm, "jailbreak": jb})
            >>> acts = {"blocks.1.hook_resid_post": torch.randn(4, 8)}
            >>> scores = monitors.score_activations(acts)
            >>> scores["jailbreak"].threshold, scores["harm"].flagged.shape
            (0.9, torch.Size([4]))
            >>> torch.equal(scores["harm"].logits, harm.policy().step(acts[harm.site]).logits)
            True
            >>> acts = tpc.collect(model, prompts, monitors.sites, pooling="mean")  # doctest: +SKIP
            >>> monitors.score_activations(acts)["harm"].flagged  # doctest: +SKIP
        """
        if not isinstance(acts, Mapping):
            raise TPCHooksError(
                f"score_activations takes a dict site -> pooled rows [n, d_model]; got a {type(acts).__name__}. "
                f"This set reads {self.sites}"
            )
        for name, m in self._monitors.items():
            if m.streaming:
                raise TPCHooksError(
                    f"member {name!r} is a per-token monitor (pooling='token'): it scores every token and aggregates "
                    "over time, so pooled rows are not its input; score_activations takes prefix-pooled members only "
                    "(score that one with monitor.score or monitor.token_scores)"
                )
        missing = sorted({m.site for m in self._monitors.values()} - set(acts))
        if missing:
            readers = {site: [n for n, m in self._monitors.items() if m.site == site] for site in missing}
            raise TPCHooksError(
                f"acts has no rows for {missing}, read by {readers}; it has {sorted(map(str, acts))}. Pass each "
                "member's site, e.g. acts = tpc.collect(model, prompts, monitors.sites, pooling=...)"
            )
        rows = {site: check_features(acts[site], f"acts[{site!r}]") for site in self.sites}
        counts = {site: z.shape[0] for site, z in rows.items()}
        if len(set(counts.values())) > 1:
            raise TPCHooksError(
                f"the sites hold different numbers of rows ({counts}); each row is one input, read at every site"
            )
        for name, m in self._monitors.items():
            check_width(rows[m.site], f"acts[{m.site!r}] (read by member {name!r})", m.head.d_model)
        with torch.no_grad():
            got = self._together.step([(m.policy().step, rows[m.site]) for m in self._monitors.values()])
        return {
            name: replace(res, threshold=m.threshold)
            for (name, m), res in zip(self._monitors.items(), got, strict=True)
        }

    # ------------------------------------------------------------------ running
    def generate(
        self,
        model: Any,
        prompts: Sequence[str],
        max_new_tokens: int = 32,
        action: str | Mapping[str, str] | None = None,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        seed: int = 0,
        stop_at_eos: bool = True,
        tokenizer: Any = None,
    ) -> MonitorSetRun:
        """:meth:`Monitor.generate` for every member at once: one decode loop, each site read
        once per forward pass, each member scored as alone.

        Args:
            action: None (the set's :attr:`actions`), ``"flag"``/``"stop"`` for every member, or
                a dict name -> action for some (the others keep the set's).
            do_sample, temperature, seed, stop_at_eos, tokenizer: as in :meth:`Monitor.generate`.

        Returns:
            A :class:`~tpc_hooks.MonitorSetRun`: each member's :class:`~tpc_hooks.GenerationRun` by
            name, the shared sequences, and per row the step it was stopped at and by whom.
        """
        return _generation.generate(
            self,
            model,
            prompts,
            max_new_tokens,
            action,
            do_sample=do_sample,
            temperature=temperature,
            seed=seed,
            stop_at_eos=stop_at_eos,
            tokenizer=tokenizer,
        )

    def watch(
        self, model: Any, *, on_flag: Callable[[MonitorEvent], Any] | None = None, tokenizer: Any = None
    ) -> AbstractContextManager[dict[str, Any]]:
        """:meth:`Monitor.watch` for every member: the block yields ``{name: WatchLog}``, and
        ``on_flag`` sees each flagged row with ``event.monitor`` naming the member.

        Example:
            >>> with monitors.watch(hf_model) as logs:  # doctest: +SKIP
            ...     hf_model.generate(**batch, max_new_tokens=20)
            >>> logs["harm"].first_flagged  # doctest: +SKIP
        """
        return _generation.watch(self, model, on_flag=on_flag, tokenizer=tokenizer)

    def stopping_criteria(
        self,
        model: Any,
        *,
        action: str | Mapping[str, str] | None = None,
        eos_token_id: int | list[int] | None = None,
        tokenizer: Any = None,
    ) -> Any:
        """:meth:`Monitor.stopping_criteria` for the set: one criterion whose hooks read each site
        once and which stops the rows any stopping member flags (the flagging ones only record).
        Its ``log`` (and :attr:`last_run`) is a :class:`~tpc_hooks.MonitorSetRun`.

        Example:
            >>> sc = monitors.stopping_criteria(hf_model, tokenizer=tok)  # doctest: +SKIP
            >>> out = hf_model.generate(**batch, max_new_tokens=32, stopping_criteria=[sc])  # doctest: +SKIP
            >>> sc.log.stopped_by  # doctest: +SKIP
        """
        from ._hf_generate import MonitorStoppingCriteria

        return MonitorStoppingCriteria(
            self, model, tokenizer=tokenizer, order=None, cascade=None, eos_token_id=eos_token_id, action=action
        )

    def logits_processor(
        self,
        model: Any,
        *,
        action: str | Mapping[str, str] | None = None,
        eos_token_id: int | list[int] | None = None,
        tokenizer: Any = None,
    ) -> Any:
        """:meth:`Monitor.logits_processor` for the set: EOS is forced on the rows any stopping
        member flags; every member's steps are recorded."""
        from ._hf_generate import MonitorLogitsProcessor

        return MonitorLogitsProcessor(
            self, model, tokenizer=tokenizer, order=None, cascade=None, eos_token_id=eos_token_id, action=action
        )
