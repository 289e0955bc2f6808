"""tpc-hooks' contract with vLLM, kept with the tests that run it: every vLLM name the plugin uses
(``surface.ROWS``), the static checks of those names (``checks``), and the live checks on a
monitored engine (``live``, the driver's half; ``recorder``, the worker's, which reaches the worker
as vLLM's ``worker_extension_cls``). ``tests/test_vllm_contract.py`` runs them: ``make test-vllm``,
and ``make test-vllm-contract-newest`` against vLLM's newest release.
"""
