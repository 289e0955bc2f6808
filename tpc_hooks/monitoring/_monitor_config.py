"""A monitor's settings as data: what it reads, how it tokenises and pools, and when it flags."""

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, no_type_check

from .._errors import TPCHooksError
from ..activations import parse_site
from ..pooling import TOP_K, check_aggregate, check_pooling, check_skip, check_top_k

STREAMING_KEYS = ("aggregate", "alpha", "window", "skip")  # saved only by per-token monitors
# what a monitor does when it flags, by name (a callable is an action too, where one is taken): "flag" records
# only, "stop" ends the sequence at its first flagged step
ACTIONS = ("flag", "stop")
# the actions whose flag ends the sequence: the decode loop, Hugging Face generate's hooks, the vLLM worker and
# the driver's checks read this, not an action's name
STOPPING = frozenset({"stop"})
# what a monitor reads: "prompt" (every step, the prefix pooled from its first token) or "answer" (a response
# monitor: the answer's tokens only, from the first answer token)
READS = ("prompt", "answer")


# no_type_check: loaded values are checked by __post_init__, whose messages name the fix; the test-time
# type checker would preempt them with its own.
@no_type_check
@dataclass(frozen=True)
class MonitorConfig:
    """Everything a :class:`~tpc_hooks.Monitor` needs besides its head, cascade and SAE. Frozen,
    validated on construction; the defaults live here and nowhere else.

    Attributes:
        site: TransformerLens hook name it reads (``blocks.L.hook_resid_post``).
        pooling: ``"mean"``, ``"last"`` or ``"max"`` (the activations of a prefix pooled, then
            scored), or ``"token"``: every token scored and the logits aggregated over time (a
            streaming monitor; see ``aggregate``).
        chat_template: whether prompts are wrapped in the tokenizer's chat template.
        prepend_bos: whether a BOS token is prepended to raw prompts (None: when the tokenizer
            has one).
        max_tokens: prompt truncation (None: none).
        model_name: the model it was trained on (informational; ``d_model`` is enforced).
        threshold: probability at or above which an input is flagged, in (0, 1). Compared in
            logit space (``decision_logits >= logit(threshold)``), so thresholds set by
            :meth:`~tpc_hooks.Monitor.calibrate` stay meaningful where float32 probabilities
            reach 1.
        aggregate, alpha, window: how a per-token monitor turns the per-token logits
            ``s_1..s_t`` of a prefix into its logit: ``"mean"``, ``"max"``, ``"ema"`` (``e_t =
            alpha * s_t + (1 - alpha) * e_{t-1}``, ``e_1 = s_1``) or ``"rolling"`` (the mean of
            the last ``window`` logits; the default: on long benign conversations its
            false-positive rate stays put as they grow, where a running ``"max"``'s climbs with
            every token) or ``"sctopk"`` (segment top-k: the mean of the ``top_k`` best means of
            ``window`` consecutive logits, so a flag needs several segments to agree; He et al.,
            arXiv 2604.14865); see :func:`tpc_hooks.pooling.aggregate`. Ignored by prefix-pooled
            monitors.
        top_k: ``sctopk``'s number of segments averaged (saved only by such a monitor).
        skip: a per-token monitor's leading tokens that are never scored (the fixed prefix every
            sequence starts with: BOS, the chat template's system prompt and user header).
        reads: ``"prompt"`` (a prompt monitor: every step scored, step 0 the prompt alone, the
            prefix pooled from its first token) or ``"answer"`` (a response monitor: the prompt is
            not pooled and step 0 is never flagged; step ``t`` pools the answer's first ``t``
            tokens). Prefix-pooled monitors only.

    Example:
        >>> cfg = MonitorConfig("blocks.6.hook_resid_post", pooling="token", aggregate="max")
        >>> MonitorConfig.from_dict(cfg.to_dict()) == cfg
        True
        >>> MonitorConfig("blocks.6.hook_resid_post", threshold=float("nan"))
        Traceback (most recent call last):
        ...
        tpc_hooks.TPCHooksError: threshold must be a number in (0, 1); got nan
    """

    site: str
    pooling: str = "mean"
    chat_template: bool = False
    prepend_bos: bool | None = None
    max_tokens: int | None = 512
    model_name: str | None = None
    threshold: float = 0.5
    aggregate: str = "rolling"
    alpha: float = 0.1
    window: int = 16
    skip: int = 0
    reads: str = "prompt"
    top_k: int = TOP_K

    def __post_init__(self) -> None:
        if not isinstance(self.site, str):
            raise TPCHooksError(f"site must be a hook name like 'blocks.6.hook_resid_post'; got {self.site!r}")
        parse_site(self.site)
        if not isinstance(self.pooling, str):
            raise TPCHooksError(f"pooling must be a string; got {self.pooling!r}")
        if self.pooling != "token":
            check_pooling(self.pooling)
        if not isinstance(self.chat_template, bool):
            raise TPCHooksError(f"chat_template must be true or false; got {self.chat_template!r}")
        if self.prepend_bos is not None and not isinstance(self.prepend_bos, bool):
            raise TPCHooksError(
                f"prepend_bos must be true, false or None (when the tokenizer has a BOS token); "
                f"got {self.prepend_bos!r}"
            )
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise TPCHooksError(
                f"max_tokens must be a positive integer or None (no truncation); got {self.max_tokens!r}"
            )
        if self.model_name is not None and not isinstance(self.model_name, str):
            raise TPCHooksError(f"model_name must be a string or None; got {self.model_name!r}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t < 1:
            raise TPCHooksError(f"threshold must be a number in (0, 1); got {t!r}")
        how, alpha, window = check_aggregate(self.aggregate, self.alpha, self.window, self.top_k)
        if self.reads not in READS:
            raise TPCHooksError(f"reads must be one of {list(READS)}; got {self.reads!r}")
        if self.reads == "answer" and self.pooling == "token":
            raise TPCHooksError(
                'reads="answer" pools the answer so far; a per-token monitor (pooling="token") reads every '
                'token: give a response monitor pooling "mean", "last" or "max"'
            )
        for name, value in (
            ("threshold", float(t)),
            ("alpha", alpha),
            ("window", window),
            ("skip", check_skip(self.skip)),
            ("top_k", check_top_k(self.top_k)),
        ):
            object.__setattr__(self, name, value)

    @property
    def streaming(self) -> bool:
        """Whether this is a per-token monitor (``pooling="token"``)."""
        return self.pooling == "token"

    @property
    def answers(self) -> bool:
        """Whether this is a response monitor (``reads="answer"``)."""
        return self.reads == "answer"

    def to_dict(self) -> dict[str, Any]:
        """The settings as saved in ``config.json`` (``"monitor"``); a prefix-pooled monitor leaves
        out the streaming settings it does not use, ``reads`` when it reads the prompt and ``top_k``
        unless it aggregates by ``sctopk``."""
        d = asdict(self)
        if not self.streaming:
            for k in STREAMING_KEYS:
                d.pop(k)
        if not self.answers:  # a prompt monitor's file is as it was before response monitors
            d.pop("reads")
        if not (self.streaming and self.aggregate == "sctopk"):  # other monitors' files as they were
            d.pop("top_k")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MonitorConfig":
        """The config of :meth:`to_dict`'s dict (other keys are ignored), every value checked.

        Raises:
            TPCHooksError: a missing ``site``, or a value of the wrong type or out of range.
        """
        if not isinstance(d, dict):
            raise TPCHooksError(f"a monitor config must be a JSON object; got {type(d).__name__}")
        if "site" not in d:
            raise TPCHooksError('a monitor config needs "site" (the hook name it reads)')
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


_NAME = re.compile(r"^([A-Za-z0-9_-]+)=(.+)$")  # --monitor NAME=DIR[:ACTION]


def monitor_specs(specs: list[str], action: str) -> list[tuple[str, str, str]]:
    """``--monitor`` values (``tpc-hooks serve`` and ``review``) -> ``(name, directory, action)``: ``DIR``
    alone (name ``""``, the action ``action``), or each ``NAME=DIR[:ACTION]``.

    Example:
        >>> monitor_specs(["harm=/m/harm:stop", "pii=/m/pii"], "flag")
        [('harm', '/m/harm', 'stop'), ('pii', '/m/pii', 'flag')]
    """
    out = []
    for spec in specs:
        m = _NAME.match(spec)
        name, rest = (m.group(1), m.group(2)) if m else ("", spec)
        where, colon, act = rest.rpartition(":")
        if colon and act in ACTIONS:
            rest = where
        else:
            act = action
        out.append((name, rest, act))
    names = [n for n, _, _ in out]
    if len(out) > 1 and "" in names:
        raise TPCHooksError(
            "several monitors need a name each: --monitor NAME=DIR[:stop|flag] (e.g. "
            "--monitor harm=./harm:stop --monitor pii=./pii:flag)"
        )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TPCHooksError(f"--monitor names must differ; {dup} given twice")
    return out
