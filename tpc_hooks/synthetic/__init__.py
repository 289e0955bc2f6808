"""Synthetic activation-like problems with planted higher-order structure.

For tests, benchmarks and the placeholder demo only: they are not evidence about real
models. Features are correlated, offset and anisotropically scaled like residual-stream
activations (one large "massive" coordinate), and the label depends on a linear direction
plus pairwise and triple interactions, so that a linear probe is good but not perfect.
"""

from collections.abc import Sequence

import numpy as np

__all__ = ["make_problem", "topic_intent"]


def make_problem(
    n: int = 2000,
    d_model: int = 32,
    *,
    seed: int = 0,
    world: int = 0,
    noise: float = 0.5,
    interaction: float = 1.0,
    latent: int = 8,
    shift: float | Sequence[float] = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(X float32 [n, d_model], y int64 [n])`` with roughly balanced classes.

    ``world`` fixes the problem (mixing, scales, offsets, threshold); ``seed`` draws the
    samples, so ``seed=0`` and ``seed=1`` with the same ``world`` are train and test sets
    of one problem. ``shift`` scales the latent factors the label does not depend on (factors
    6 and up): ``shift > 1`` is a planted distribution shift, a source that varies along
    directions the training rows barely explored while the labelling rule stays the same. A
    sequence gives one scale per such factor (6, 7, ...): shifts along different factors stand in
    for different phrasings of the same requests.

    Example:
        >>> X, y = make_problem(n=100, d_model=8, seed=1)
        >>> X.shape, sorted(set(y.tolist()))
        ((100, 8), [0, 1])
    """
    wrng = np.random.default_rng([world, d_model, latent])
    latent = min(latent, d_model)
    mix = wrng.standard_normal((latent, d_model)) / np.sqrt(latent)
    scales, offsets = wrng.uniform(0.5, 3.0, d_model), wrng.normal(0, 2.0, d_model)
    rng = np.random.default_rng([seed, 1 + world])
    h = rng.standard_normal((n, latent))
    h[:, 6:] *= np.broadcast_to(np.asarray(shift, dtype=np.float64), (h.shape[1] - min(6, h.shape[1]),))
    X = h @ mix + 0.3 * rng.standard_normal((n, d_model))
    X = X * scales + offsets
    X[:, 0] = X[:, 0] * 20 + 100  # a massive activation, as in real residual streams
    score = h[:, 0] + interaction * (h[:, 1] * h[:, 2] + 0.5 * (h[:, 3] ** 2 - 1) - 0.3 * h[:, 4] * h[:, 5] * h[:, 1])
    score = score + noise * rng.standard_normal(n)
    y = (score > 0.0).astype(np.int64)
    return X.astype(np.float32), y


def topic_intent(
    n: int = 4000, d_model: int = 32, *, seed: int = 0, world: int = 0, noise: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A topic feature and an intent feature that are harmful only together: ``(X, y, kind)``.

    Each row mentions a dangerous topic or not, and asks for operational help or not, each with
    probability 1/2 and a strength drawn from a log-normal (some rows dwell on the topic, some
    barely touch it). The row's activation adds ``topic * u_topic + intent * u_intent`` to
    correlated noise; it is harmful (1) only when both are present. ``kind`` names each row:
    ``"harmful"``, ``"topic only"`` (a benign question about a dangerous subject: the hard
    negative), ``"intent only"`` (a benign request for help) or ``"neither"``. A linear probe
    can only add the two strengths, so a benign row that dwells on the topic outscores a harmful
    row that barely touches it; their product (a degree-2 term) separates them.

    Example:
        >>> X, y, kind = topic_intent(n=200, d_model=8, seed=1)
        >>> X.shape, bool(((kind == "harmful") == (y == 1)).all())
        ((200, 8), True)
    """
    wrng = np.random.default_rng([world, d_model, 7])
    u = wrng.standard_normal((2, d_model))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    scales, offsets = wrng.uniform(0.5, 3.0, d_model), wrng.normal(0, 2.0, d_model)
    rng = np.random.default_rng([seed, 11 + world])
    present = rng.random((n, 2)) < 0.5
    strength = np.exp(rng.normal(0.5, 0.5, (n, 2))) * present
    X = strength @ u + noise * rng.standard_normal((n, d_model))
    X = X * scales + offsets
    y = (present[:, 0] & present[:, 1]).astype(np.int64)
    kind = np.select([y == 1, present[:, 0], present[:, 1]], ["harmful", "topic only", "intent only"], "neither")
    return X.astype(np.float32), y, kind
