"""What runs in vLLM's worker processes: the worker (``worker``: vLLM's worker class, extended, which
vLLM loads by the name ``vllm_engine_args`` gives it), its remote calls (``control``), the monitors it
runs and what they hold (``armed``), the prefix cache's running states (``prefix``) and the model
classes that return the residual stream (``models``). Nothing here is imported before vLLM loads the
worker.
"""
