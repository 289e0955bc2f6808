"""SAE features (SAELens) as the package reads them: the checks of an SAE against a site, encoding
activations into latents (and the encoder as a linear map given a pass's active latents), an SAE's
identity and its decoder. Below both the head (attribution in
feature ids) and the collection of activations (rows of latents), so that reading activations does
not stand on the polynomial.

It imports no other folder of the package but the error type, and never ``sae_lens``.
"""

from ._sae import check_sae as check_sae
from ._sae import decoder as decoder
from ._sae import describe as describe_sae  # noqa: F401 (handed on under a name that says what it is)
from ._sae import dims as sae_dims  # noqa: F401 (handed on under a name that says what it is)
from ._sae import encode as sae_encode  # noqa: F401 (handed on under a name that says what it is)
from ._sae import identity as sae_identity  # noqa: F401 (handed on under a name that says what it is)
from ._sae import through_encoder as through_encoder
