"""What a monitor is asked to be, in one frozen object: :class:`TrainOptions`, the options of
:func:`~tpc_hooks.train_monitor` and the flags of ``tpc-hooks train``, checked once when built."""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast

from ..head import FitConfig, check_tau
from ..pooling import TOP_K, check_aggregate
from ..recipes import Recipe, resolve
from ._train import check_target_fpr, default_aggregate, fit_config

FIT_OWN = ("init", "device")  # fit's own arguments, not FitConfig's fields


@dataclass(frozen=True)
class TrainOptions:
    """Every option of :func:`~tpc_hooks.train_monitor` (its parameters but the model, the prompts,
    their labels, the site and the pooling), as one frozen object: ``tpc-hooks train`` builds the
    same object from its flags, and both paths train from it. The checks that need neither the model
    nor the prompts run when it is built (each error says what was expected), before any prompt is
    read or the model runs: the recipe (a preset, or a deprecated name), ``target_fpr``, the cascade's
    ``tau``, a per-token aggregation given, and the fit settings (:attr:`cfg`). The checks that need
    the prompts run in :func:`~tpc_hooks.training._train_request.check_request`.

    ``fit`` holds the rest of ``train_monitor``'s keyword arguments: :class:`~tpc_hooks.FitConfig`
    fields, and :func:`tpc_hooks.fit`'s own ``init`` and ``device`` (:attr:`fit_args`).

    Example:
        >>> options = TrainOptions(degree=3, tau=0.2)
        >>> options.cfg.degree, options.recipe.name
        (3, 'default')
        >>> TrainOptions(tau=0.9)
        Traceback (most recent call last):
        ...
        tpc_hooks.TPCHooksError: tau must be in [0, 0.5]; got 0.9
    """

    responses: Any = None  # a response monitor: one answer per prompt
    recipe: Any = None  # resolved to a Recipe when built
    target_fpr: float | None = 0.01
    calibration: Any = None
    sources: Any = None
    everyday: Any = None
    validation: Any = None
    val_fraction: float = 0.2
    split: str = "stratified"
    config: FitConfig | None = None
    degree: int | None = None
    rank: Any = None
    seed: int | None = None
    tau: float | None = None
    sae: Any = None
    aggregate: str | None = None  # None: the default for the contexts (default_aggregate)
    alpha: float = 0.1
    window: int = 16
    top_k: int = TOP_K
    contexts: Any = None
    context_tokens: Any = (512, 1024)
    chat_template: bool | None = None
    prepend_bos: bool | None = None
    max_tokens: int | None = 512
    batch_size: int = 8
    tokenizer: Any = None
    rows_cache: Any = None
    verbose: bool = True
    fit: Mapping[str, Any] = field(default_factory=dict)
    cfg: FitConfig = field(init=False, repr=False, compare=False)
    fit_args: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        options = dict(self.fit)
        set_ = object.__setattr__  # a frozen object: its derived fields are set once, here
        set_(self, "recipe", resolve(self.recipe, options))  # takes the deprecated recipe options out
        check_target_fpr(self.target_fpr)
        if self.tau is not None:
            check_tau(self.tau)
        check_aggregate(self.aggregate or "rolling", self.alpha, self.window, self.top_k)
        set_(self, "fit_args", {k: options.pop(k) for k in FIT_OWN if k in options})
        set_(self, "fit", options)
        set_(self, "cfg", self.fit_config(self.recipe.augment))

    @property
    def preset(self) -> Recipe:
        """The recipe as a :class:`~tpc_hooks.recipes.Recipe` (``recipe`` is resolved when built)."""
        return cast(Recipe, self.recipe)

    def fit_config(self, families: tuple[str, ...] | list[str]) -> FitConfig:
        """The fit settings when the training rows carry the phrasing ``families`` (the recipe's, or
        those a store holds): ``config`` with the given fields (``degree``, ``rank`` and ``seed`` only
        when given), the paper's recipe, and the rewrites' consistency penalty."""
        given = {k: v for k, v in (("degree", self.degree), ("rank", self.rank), ("seed", self.seed)) if v is not None}
        return fit_config(self.preset.name, families, self.config, {**given, **self.fit})

    def aggregate_for(self, with_contexts: bool) -> str:
        """A per-token monitor's aggregation: the one given, else the default with or without hosted
        chats (:func:`~tpc_hooks.training._train.default_aggregate`). A response monitor's steps are
        trained as a per-token monitor's tokens with ``"max"``: flagged at any step, as it decides."""
        if self.responses is not None:
            return "max"
        return self.aggregate if self.aggregate is not None else default_aggregate(with_contexts)


OPTIONS = tuple(f.name for f in fields(TrainOptions) if f.init and f.name != "fit")
"""The names :func:`~tpc_hooks.train_monitor` takes as its options, in its signature's order."""
