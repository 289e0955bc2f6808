PYTHON ?= python3
PIP = $(PYTHON) -m pip install --quiet -c constraints.txt

.PHONY: install test demo bench

install:
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"

test: install
	$(PYTHON) -m pytest -q

demo: install
	tpc-hooks demo

bench: install
	$(PYTHON) benchmarks/bench_training.py
