"""What runs inside vLLM: the worker extension that scores every request each step, and
``tpc-hooks serve`` (vLLM's OpenAI-compatible server with monitors on every request).

Imports vLLM only inside functions: importing this package never needs vLLM.
"""
