"""The fit engine: a polynomial head fitted to rows, degree by degree (``fit``: the linear probe at
degree 1, then each degree trained alone with everything below frozen, its shrinkage and early
stopping), the minibatch loop, and the rows it reads. It knows nothing of prompts, models, recipes
or thresholds: the other half of ``training`` (the recipe) decides what it fits on and what is kept.
"""

from ._fit import _init_degree as init_degree  # noqa: F401 (handed on to the refit, under a public name)
from ._fit import _new_head as new_head  # noqa: F401 (handed on to the refit, under a public name)
from ._fit import _Trainer as Trainer  # noqa: F401 (handed on to the refit, under a public name)
from ._fit import fit as fit
from ._loop import default_device as default_device
from ._loop import f1_at_zero as f1_at_zero
from ._loop import train_loop as train_loop
from ._probe import fit_probe as fit_probe
from ._rows import Rows as Rows
from ._rows import as_rows as as_rows
from ._rows import split_data as split_data
from ._rows import token_rows as token_rows
