"""How a monitor is made and measured: training rows and the loop, the linear probe, ``fit``
(progressive or joint), site choice, the recipe (:func:`~tpc_hooks.train_monitor`, and the
CLI's ``train`` on a collected directory), the evaluation of a monitor, and the baselines.

It stands on ``monitoring`` because the recipe returns a :class:`~tpc_hooks.Monitor`.
"""
