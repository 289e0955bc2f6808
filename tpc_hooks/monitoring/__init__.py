"""A trained head at work on a model: the :class:`~tpc_hooks.Monitor` and its settings, the
monitored decode loop and ``watch``, the Hugging Face ``generate`` hooks, per-request scoring
for engines whose batch changes every step, and the records of a monitored generation.
"""
