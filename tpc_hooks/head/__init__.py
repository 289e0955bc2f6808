"""The head and what reads one: the polynomial (:class:`~tpc_hooks.TPC`), the rule that
evaluates a truncation (``_kernel``), the cascade and the scoring policies, exact attribution and
the SAE glue, training settings and history, and the checks of features.

It imports no other folder of the package but those below it (``views``: the HTML views;
``saving``: the saved format, the Hub and the cards; ``metrics``: the flag rule and the label
checks; ``pooling``) and no interpretability toolkit.
"""
