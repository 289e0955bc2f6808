"""The head and what reads one: the polynomial (:class:`~tpc_hooks.TPC`), the rule that
evaluates a truncation (``_kernel``), the cascade and the scoring policies, exact attribution and
the SAE glue, pooling, metrics, training settings and history, and input checks.

It imports no other folder of the package but the two below it (``rendering``: the HTML views;
``saving``: the saved format, the Hub and the cards) and no interpretability toolkit.
"""
