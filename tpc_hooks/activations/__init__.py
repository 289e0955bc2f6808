"""Reading activations from a model: :func:`~tpc_hooks.collect` (pooled or per-token rows at any
site, through the adapters) and the :class:`~tpc_hooks.ActivationStore` it can write to disk.
"""
