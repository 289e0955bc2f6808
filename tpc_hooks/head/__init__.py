"""The head and everything that reads one: the polynomial (:class:`~tpc_hooks.TPC`), the rule that
evaluates a truncation and flags (``_kernel``), the cascade and the scoring policies, exact
attribution and the SAE glue, the saved format, sharing on the hub and model cards, pooling,
metrics, the HTML views, training settings and history, errors and input checks.

The lowest layer: it imports no other folder of the package and no interpretability toolkit.
"""
