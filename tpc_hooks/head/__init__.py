"""The head and what reads one: the polynomial (:class:`~tpc_hooks.TPC`), the rule that
evaluates a truncation (``_kernel``), the cascade and the scoring policies, exact attribution
(in SAE feature ids through ``sae``), training settings and history, and the checks of features.

It imports no other folder of the package but those below it (``views``: the HTML views;
``saving``: the saved format, the Hub and the cards; ``metrics``: the flag rule and the label
checks; ``pooling``; ``sae``: the SAE glue) and no interpretability toolkit.
"""

from ._attribution import Attribution as Attribution
from ._attribution import attribute as attribute
from ._cascade import Cascade as Cascade
from ._cascade import CascadeResult as CascadeResult
from ._cascade import check_tau as check_tau
from ._cascade import prefix_result as prefix_result
from ._cascade import stack_results as stack_results
from ._cascade import thresholds as thresholds
from ._checks import check_features as check_features
from ._checks import check_width as check_width
from ._checks import prepare_activations as prepare_activations
from ._history import PROBE_CS as PROBE_CS
from ._history import FitConfig as FitConfig
from ._history import History as History
from ._history import TrainConfig as TrainConfig
from ._kernel import euler_gradients as euler_gradients
from ._kernel import exit_loop as exit_loop
from ._kernel import forget_packs as forget_packs
from ._kernel import freeze_packs as freeze_packs
from ._kernel import logits as truncation_logits  # noqa: F401 (handed on under a name that says what it is)
from ._kernel import project as order_projections  # noqa: F401 (handed on under a name that says what it is)
from ._kernel import row_orders as row_orders
from ._kernel import term as order_term  # noqa: F401 (handed on under a name that says what it is)
from ._kernel import threshold_above as threshold_above
from ._kernel import truncations as truncations
from ._policy import FixedOrder as FixedOrder
from ._policy import Policy as Policy
from ._polynomial import TPC as TPC
from ._polynomial import Cost as Cost
from ._polynomial import Scaler as Scaler
from ._polynomial import check_int as check_int
from ._polynomial import from_saved as from_saved
from ._polynomial import to_saved as to_saved
from ._together import Together as Together
