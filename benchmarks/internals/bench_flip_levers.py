"""The intent flips' own levers: bench_constructions.py's run with variants that change the flips inside train_monitor.

A study of the recipe's internals: no keyword argument of ``train_monitor`` changes its intent flips
this way, so these variants patch it.

Each variant trains on top of ``recipe="intent"`` at the layer the default chose, beside it, and is
printed as ``bench_constructions.py --variants`` prints its variants (same names as the levers were
first recorded under; the results file is ``benchmarks/results/bench_constructions_<flags>.md``):

* ``--flips``: a share of the training flips (0.1, 0.25, 0.5: a lower weight on them; a flip is kept
  when a hash of its text and the seed falls under the share; the validation flips stay whole), and
  each flip kind alone beside the homonyms (``FLIP_LEVERS``).
* ``--unseen``: selection on a construction the fit never saw: training flips of four kinds
  (history, law, prevention, defence) and a validation group ``"intent"`` of the three others' flips
  (news, research, fiction), and the other way round, each beside the same kinds trained and
  selected on; then only the training flips least like the templates (half, a quarter: those a
  logistic regression on the chosen site's rows, out of fold, scores most like the benign training
  prompts as given) beside as many drawn at random (``UNSEEN_LEVERS``).

The flips are changed by patching ``train_monitor``'s private ``intent_flips`` (unittest.mock) while
a variant trains; everything else is the public recipe. Every other flag is ``bench_constructions.py``'s.

Run: ``python benchmarks/internals/bench_flip_levers.py [--flips] [--unseen] [bench_constructions.py's flags]``
(``--unseen``: 11.6-12.5 min a seed on 2 CPU cores once the evaluation sets are cached).
"""

import contextlib
import sys
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from tpc_hooks.data import INTENT_KINDS
from tpc_hooks.training import _train_monitor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _activations, _results, the benchmark
from bench_constructions import Study  # noqa: E402
from bench_constructions import main as run_constructions  # noqa: E402

# the intent flips' weight and kind (--flips): a share of the training flips (each drawn by a hash of its text),
# and each flip kind alone beside the homonyms
FLIP_SHARES = (0.1, 0.25, 0.5)
FLIP_LEVERS = {
    **{f"flip share {v}": {"flip_share": v} for v in FLIP_SHARES},
    **{f"intent=({k!r}, 'homonym')": {"intent": (k, "homonym")} for k in INTENT_KINDS},
}
# the flips' construction (--unseen): selection on flip kinds the fit never trained on (train_monitor's validation
# group "intent" holds the other kinds' flips; beside each, the same kinds trained and selected on), and the training
# flips least like the templates (those the benign prompts as given are least told apart from) against as many
# drawn at random
SEEN, UNSEEN = ("history", "law", "prevention", "defence"), ("news", "research", "fiction")
UNSEEN_LEVERS = {
    f"flips {', '.join(SEEN)}; selection on {', '.join(UNSEEN)}": {"flip_kinds": (SEEN, UNSEEN)},
    f"flips and selection {', '.join(SEEN)}": {"intent": (*SEEN, "homonym")},
    f"flips {', '.join(UNSEEN)}; selection on {', '.join(SEEN)}": {"flip_kinds": (UNSEEN, SEEN)},
    f"flips and selection {', '.join(UNSEEN)}": {"intent": (*UNSEEN, "homonym")},
    **{f"flips least like the templates {v}": {"unlike_share": v} for v in (0.5, 0.25)},
    **{k: FLIP_LEVERS[k] for k in ("flip share 0.5", "flip share 0.25")},
}
LEAST_LIKE = "The flips least like the templates, kept share"  # the heading of unlike_templates' notes


def thinned(keep):
    """``train_monitor`` with only the training intent flips ``keep(flips, prompts, labels, seed)`` returns
    the positions of (the validation flips whole)."""
    draw = _train_monitor.intent_flips

    def fewer(prompts, labels, kinds=None, *, every_kind=False, seed=0, **kw):
        ps = draw(prompts, labels, kinds, every_kind=every_kind, seed=seed, **kw)
        return ps if every_kind else ps.subset(keep(ps, prompts, labels, seed))

    return mock.patch.object(_train_monitor, "intent_flips", fewer)


def flip_share(share: float):
    """``train_monitor`` with only ``share`` of its training intent flips (the validation flips whole): a
    lower weight on the flips. A flip is kept when a hash of its text and seed falls under ``share``."""
    return thinned(
        lambda ps, prompts, labels, seed: [
            i for i, t in enumerate(ps.texts) if zlib.crc32(f"{seed}|{t}".encode()) % 10_000 < share * 10_000
        ]
    )


def flip_kinds(trained: tuple[str, ...], selected: tuple[str, ...]):
    """``train_monitor`` with training flips of the ``trained`` kinds only and a validation group
    ``"intent"`` of the ``selected`` kinds' flips only: selection and pruning on a construction the
    fit never saw (the homonyms as in the default)."""
    draw = _train_monitor.intent_flips

    def split(prompts, labels, kinds=None, *, every_kind=False, **kw):
        return draw(prompts, labels, selected if every_kind else trained, every_kind=every_kind, **kw)

    return mock.patch.object(_train_monitor, "intent_flips", split)


def unlike_templates(share: float, rows: dict, site: str, seed: int, notes: dict[str, list[str]]):
    """``train_monitor`` with only the ``share`` of its training flips least like the templates: a
    logistic regression tells the flips (at ``site``) from the benign training prompts as given, out of
    fold (5 folds), and the flips it scores most like those prompts are kept (the validation flips
    whole). The flips' rows are the ones the default's collection read (``rows``, the run's
    ``rows_cache``: ``(reading, text)`` keys); the out-of-fold AUROC of the split goes to ``notes``."""

    def least_like(ps, prompts, labels, _):
        read = {text: row for (reading, text), row in rows.items() if reading.site == site}
        natural = [t for t, v in zip(prompts, labels, strict=True) if int(v) == 0]
        missing = sum(t not in read for t in (*natural, *ps.texts))
        if missing:
            raise RuntimeError(f"{missing} texts were not collected at {site} by the default: run it first")
        X = torch.stack([read[t] for t in (*natural, *ps.texts)]).float().numpy()
        y = np.r_[np.ones(len(natural)), np.zeros(len(ps))]
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.01, max_iter=2000))
        p = cross_val_predict(
            clf, X, y, cv=StratifiedKFold(5, shuffle=True, random_state=seed), method="predict_proba"
        )[:, 1]
        notes.setdefault(LEAST_LIKE, []).append(
            f"{share}: flips told from the benign training prompts as given, out-of-fold AUROC "
            f"{roc_auc_score(y, p):.3f}; kept {round(share * len(ps))} of {len(ps)}"
        )
        return sorted(int(i) for i in np.argsort(-p[len(natural) :], kind="stable")[: round(share * len(ps))])

    return thinned(least_like)


def patched(
    kw: dict, rows: dict, site: str, seed: int, notes: dict[str, list[str]]
) -> tuple[contextlib.AbstractContextManager, dict]:
    """A variant's patch of ``train_monitor``'s flips (``flip_share``, ``flip_kinds``, ``unlike_share``)
    and its remaining keyword arguments."""
    kw = dict(kw)
    if "flip_share" in kw:
        return flip_share(kw.pop("flip_share")), kw
    if "flip_kinds" in kw:
        return flip_kinds(*kw.pop("flip_kinds")), kw
    if "unlike_share" in kw:
        return unlike_templates(kw.pop("unlike_share"), rows, site, seed, notes), kw
    return contextlib.nullcontext(), kw


def flags(ap) -> None:
    ap.add_argument(
        "--flips",
        action="store_true",
        help="then train the flips' levers at the chosen layer: a share of them, each kind alone (FLIP_LEVERS)",
    )
    ap.add_argument(
        "--unseen",
        action="store_true",
        help="then train with selection on flip kinds the fit never saw, and with the flips least like "
        "the templates (UNSEEN_LEVERS)",
    )


def levers(args) -> dict[str, dict]:
    """The variants ``--flips`` and ``--unseen`` ask for, by name (the flip shares they share, once)."""
    return {**(FLIP_LEVERS if args.flips else {}), **(UNSEEN_LEVERS if args.unseen else {})}


STUDY = Study(
    description=__doc__.split("\n")[0],
    flags=flags,
    levers=levers,
    tags=lambda args: [k for k in ("flips", "unseen") if getattr(args, k)],
    patch=patched,
)


def main(argv: list[str] | None = None) -> int:
    return run_constructions(argv, STUDY)


if __name__ == "__main__":
    sys.exit(main())
