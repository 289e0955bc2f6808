"""The paper's baselines (App. C) and a one-call comparison against the TPC.

* linear probe: a degree-1 TPC (scikit-learn ``LogisticRegression``), :func:`fit_linear`;
* :class:`BilinearProbe`, :class:`MLPProbe` (width matched to a truncation with
  :func:`matched_mlp_width`), :class:`EarlyExitMLP` (exits matched with
  :func:`matched_early_exit_widths`, cascaded with :func:`early_exit_cascade`);
* :func:`fit_baseline` trains any of them (``fit_bilinear``, ``fit_mlp``, ``fit_early_exit``
  are the same call with the kind filled in);
* :func:`compare` trains the TPC and the baselines on one split and scores every order;
* :class:`TrainConfig`: the optimiser settings the baselines train with (``config=``).

Example:
    >>> from tpc_hooks import baselines
    >>> from tpc_hooks.synthetic import make_problem
    >>> X, y = make_problem(n=400, d_model=8, seed=0)
    >>> Xt, yt = make_problem(n=200, d_model=8, seed=1)
    >>> res = baselines.compare(X[:300], y[:300], X[300:], y[300:], Xt, yt, degree=2, rank=2,
    ...                         methods=("tpc", "early_exit"), epochs=2, verbose=False)
    >>> [(r["method"], r["order"]) for r in res.rows]
    [('tpc', 1), ('tpc', 2), ('early_exit', 1), ('early_exit', 2)]
"""

from ..head import TrainConfig as TrainConfig
from ._baselines import BASELINES as BASELINES
from ._baselines import BilinearProbe as BilinearProbe
from ._baselines import EarlyExitMLP as EarlyExitMLP
from ._baselines import MLPProbe as MLPProbe
from ._baselines import early_exit_cascade as early_exit_cascade
from ._baselines import fit_baseline as fit_baseline
from ._baselines import fit_bilinear as fit_bilinear
from ._baselines import fit_early_exit as fit_early_exit
from ._baselines import fit_mlp as fit_mlp
from ._baselines import matched_early_exit_widths as matched_early_exit_widths
from ._baselines import matched_mlp_width as matched_mlp_width
from ._compare import METHODS as METHODS
from ._compare import Comparison as Comparison
from ._compare import compare as compare
from ._compare import fit_linear as fit_linear

__all__ = [
    "BASELINES",
    "BilinearProbe",
    "MLPProbe",
    "EarlyExitMLP",
    "early_exit_cascade",
    "fit_baseline",
    "fit_bilinear",
    "fit_mlp",
    "fit_early_exit",
    "matched_mlp_width",
    "matched_early_exit_widths",
    "METHODS",
    "Comparison",
    "compare",
    "fit_linear",
    "TrainConfig",
]
