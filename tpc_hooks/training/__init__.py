"""How a monitor is made and measured, in two halves. The recipe (here): what
:func:`~tpc_hooks.train_monitor` and the CLI's ``train`` on a collected directory train on, keep and
calibrate, site choice, the refit on every prompt, and the evaluation of a monitor. The fit engine
(``_engine/``): ``fit`` (progressive or joint), the linear probe, the minibatch loop and the rows.

It stands on ``monitoring`` because the recipe returns a :class:`~tpc_hooks.Monitor`.
"""

from ._collected import CONTEXT_SPLITS as CONTEXT_SPLITS
from ._collected import check_split as check_split
from ._collected import flip_splits as flip_splits
from ._collected import pooled_rows as pooled_rows
from ._collected import rewrite_splits as rewrite_splits
from ._collected import token_sequences as token_sequences
from ._engine import Rows as Rows
from ._engine import as_rows as as_rows
from ._engine import default_device as default_device
from ._engine import f1_at_zero as f1_at_zero
from ._engine import fit as fit
from ._engine import split_data as split_data
from ._engine import train_loop as train_loop
from ._evaluate import DECISIONS as DECISIONS
from ._evaluate import cascade_sweep as cascade_sweep
from ._evaluate import order_logits as order_logits
from ._evaluate import per_order as per_order
from ._evaluation import Evaluation as Evaluation
from ._from_stores import finish as finish
from ._from_stores import plan_from_stores as plan_from_stores
from ._options import TrainOptions as TrainOptions
from ._outside import evaluate as evaluate
from ._outside import evaluate_activations as evaluate_activations
from ._select import choose_site as choose_site
from ._train import check_target_fpr as check_target_fpr
from ._train import train as train
from ._train_monitor import train_monitor as train_monitor
