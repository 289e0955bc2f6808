"""Training recipes as named presets: what :func:`~tpc_hooks.train_monitor` trains on, what it validates
on, and which orders it keeps. One vocabulary for ``train_monitor(recipe=)`` and ``FitConfig(recipe=)``.

=====================  ==========================================  ======================================
preset                 trains on                                   what it is for
=====================  ==========================================  ======================================
``default()``          the prompts as given; every phrasing        the floor: at its threshold it catches
                       family only validates (orders above 1       what a linear probe on the same prompts
                       earn their terms on each)                   catches (the default)
``phrasing()``         + one rewrite of each training prompt       higher orders that hold on the
                       (every family), grouped selection           package's own rewrites
``intent()``           + benign intent flips and homonyms          far fewer flags on edgy-but-benign
                                                                   questions; lower recall on harmful
                                                                   requests built by another hand
``in_distribution()``  the prompts as given, pooled selection      in-distribution accuracy only
``paper()``            the paper's exact fit (every order kept),   reproducing the paper
                       with the rewrites
=====================  ==========================================  ======================================

Each opt-in's price is measured in docs/benchmarks/constructions.md and docs/benchmarks/intent.md.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._errors import TPCHooksError, deprecated
from ..data import FAMILIES, NAMED_KINDS, TRAIN_KINDS, check_families, check_kinds

NAMES = ("default", "phrasing", "intent", "in_distribution", "paper")


@dataclass(frozen=True)
class Recipe:
    """A training recipe: build one with a preset (:func:`default`, :func:`phrasing`, :func:`intent`,
    :func:`in_distribution`, :func:`paper`), pass it as ``train_monitor(recipe=...)``.

    Attributes:
        name: the preset's name (one of :data:`NAMES`).
        augment: the phrasing families (``tpc_hooks.data.PHRASING_FAMILIES``) whose rewrites of the
            training prompts are trained on.
        intent: the intent-flip kinds (``tpc_hooks.data.INTENT_KINDS``), ``"homonym"`` and
            ``"stated"`` trained on as benign hard negatives.
        prune_orders: keep only the orders that earn their terms at the operating point
            (``train_monitor``'s report says which and why).

    Example:
        >>> import tpc_hooks as tpc
        >>> tpc.recipes.default()
        Recipe(name='default', augment=(), intent=(), prune_orders=True)
        >>> tpc.recipes.intent(kinds=["law", "homonym"]).intent
        ('law', 'homonym')
        >>> tpc.recipes.paper().fit
        'paper'
    """

    name: str
    augment: tuple[str, ...] = ()
    intent: tuple[str, ...] = ()
    prune_orders: bool = True
    # a recipe may combine more than its preset does (``dataclasses.replace(tpc.recipes.default(),
    # intent=("homonym",))``): only in_distribution refuses rewrites and flips

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise TPCHooksError(f"a recipe's name is one of {list(NAMES)}; got {self.name!r}")
        object.__setattr__(self, "augment", check_families(self.augment or None))
        object.__setattr__(self, "intent", check_kinds(self.intent or None, NAMED_KINDS, TRAIN_KINDS))
        if not isinstance(self.prune_orders, bool):
            raise TPCHooksError(f"prune_orders must be True or False; got {self.prune_orders!r}")
        if self.name == "in_distribution" and (self.augment or self.intent):
            raise TPCHooksError("the in_distribution recipe trains on the prompts as given: no augment or intent")

    @property
    def fit(self) -> str:
        """The fit's half of the recipe (``FitConfig.recipe``): ``"paper"`` (the plain polynomial,
        every degree trained for all epochs and kept as it ends) or ``"default"`` (the robust fit)."""
        return "paper" if self.name == "paper" else "default"

    @property
    def shifts(self) -> tuple[str, ...]:
        """The phrasing families the validation prompts are rewritten in but the fit never trains on:
        every family the default recipe does not train on (the floor's test of the higher orders)."""
        return tuple(f for f in FAMILIES if f not in self.augment) if self.name == "default" else ()


def default(*, prune_orders: bool = True) -> Recipe:
    """The prompts as given (order 1 is the linear probe); each validation prompt is also rewritten in
    every phrasing family, which the fit neither trains nor selects on, and an order above 1 is kept
    only where it flags significantly more harmful validation prompts than the order below and, on
    every family, no fewer than order 1. ``prune_orders=False`` keeps every order (the page's
    measurement of that variant: docs/benchmarks/constructions.md)."""
    return Recipe("default", prune_orders=prune_orders)


def phrasing(families: bool | Sequence[str] = True, *, prune_orders: bool = True) -> Recipe:
    """Trains on one rewrite of every training prompt (``families``: every phrasing family, or the
    named ones) and selects over the families as groups."""
    return Recipe("phrasing", augment=check_families(families), prune_orders=prune_orders)


def intent(
    kinds: bool | Sequence[str] = True, *, families: bool | Sequence[str] = True, prune_orders: bool = True
) -> Recipe:
    """The phrasing recipe plus benign-labelled intent flips of each harmful training prompt ("What
    laws make it a crime to ...?"; :func:`tpc_hooks.data.intent_flips`) and homonyms ("How do I kill
    a Python process?"), validated as the group ``"intent"``. ``kinds``: every flip kind and
    ``"homonym"`` (``True``), or the named ones; ``"stated"`` (a harmful act stated as someone
    else's plan, then a benign question) is opt-in."""
    return Recipe(
        "intent",
        augment=check_families(families),
        intent=check_kinds(kinds, NAMED_KINDS, TRAIN_KINDS),
        prune_orders=prune_orders,
    )


def in_distribution(*, prune_orders: bool = True) -> Recipe:
    """Trains and selects on the prompts as given only (no rewrites: in-distribution accuracy)."""
    return Recipe("in_distribution", prune_orders=prune_orders)


def paper(*, augment: bool | Sequence[str] = True, prune_orders: bool = False) -> Recipe:
    """The paper's exact fit (:class:`~tpc_hooks.FitConfig` with ``recipe=tpc.recipes.paper()``), every
    order kept, trained on the prompts and their rewrites (``augment=False``: the prompts alone)."""
    return Recipe("paper", augment=check_families(augment), prune_orders=prune_orders)


_PRESETS = {
    "default": default,
    "phrasing": phrasing,
    "intent": intent,
    "in_distribution": in_distribution,
    "paper": paper,
}


def named(name: str) -> Recipe:
    """The preset of that name with its defaults (``tpc-hooks train --recipe NAME``)."""
    if name not in _PRESETS:
        raise TPCHooksError(f"recipe must be one of {list(NAMES)}; got {name!r}")
    return _PRESETS[name]()


_OLD_OPTIONS = ("augment", "intent", "prune_orders")


def resolve(recipe: Any, options: dict[str, Any]) -> Recipe:
    """``train_monitor``'s ``recipe`` as a :class:`Recipe`: a preset as given; a name (deprecated) or
    None, the preset of that name. ``options`` (``train_monitor``'s keyword arguments) lose the
    old per-call recipe options (``augment=``, ``intent=``, ``prune_orders=``; deprecated), which
    build the preset as its own arguments did."""
    old = {k: options.pop(k) for k in _OLD_OPTIONS if k in options}
    if isinstance(recipe, Recipe):
        if old:
            raise TPCHooksError(
                f"{sorted(old)} belong to the recipe: pass them to the preset, e.g. tpc.recipes.{recipe.name}(...)"
            )
        return recipe
    if recipe is None:
        recipe = "default"
    elif isinstance(recipe, str) and recipe in NAMES:
        deprecated(f"train_monitor(recipe={recipe!r})", f"train_monitor(recipe=tpc.recipes.{recipe}())")
    else:
        raise TPCHooksError(
            f"recipe must be a preset of tpc.recipes ({', '.join(n + '()' for n in NAMES)}); got {recipe!r}"
        )
    for k in old:
        deprecated(f"train_monitor({k}=...)", f"the recipe's own argument, e.g. tpc.recipes.{recipe}({k}=...)")
    return _from_old(recipe, old)


def _from_old(name: str, old: dict[str, Any]) -> Recipe:
    """The preset ``name`` with the old per-call options that were given (``augment=``, ``intent=``,
    ``prune_orders=``), as ``train_monitor(recipe=name, ...)`` once built it."""
    changed: dict[str, Any] = {}
    if old.get("augment") is not None:
        changed["augment"] = check_families(old["augment"])
    if old.get("intent") is not None:
        changed["intent"] = check_kinds(old["intent"], NAMED_KINDS, TRAIN_KINDS)
    if old.get("prune_orders") is not None:
        changed["prune_orders"] = bool(old["prune_orders"])
    return replace(named(name), **changed)
