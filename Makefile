# Idempotent local setup: `make test` or `make capacity` from a fresh clone does everything: the client, the
# reference engine (the `engine` extra, after the right torch build) and the test tools.
# `make setup-client` is the load generator alone, as `pip install .` gives it (no torch), in $(CLIENT_VENV).
# Setup prints one line per step. pip's output goes to $(LOG): printed in full when a step fails,
# otherwise only its warnings that matter (scripts/quietly.sh lists the harmless ones).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOG := $(VENV)/setup.log
QUIETLY := scripts/quietly.sh $(LOG)

CLIENT_VENV ?= .venv-client

.PHONY: setup setup-client test test-fast lint demo capacity clean

$(STAMP): pyproject.toml scripts/install-torch.sh scripts/quietly.sh
	@if [ ! -x $(BIN)/python ]; then echo "setup: creating $(VENV) ($$($(PY) --version))"; $(PY) -m venv $(VENV); fi
	@: > $(LOG)
	@echo "setup: upgrading pip in $(VENV)"
	@$(QUIETLY) $(BIN)/python -m pip install --upgrade pip
	@scripts/install-torch.sh $(BIN)/python $(LOG)
	@echo "setup: installing slobench (editable) with the engine and test extras"
	@$(QUIETLY) $(BIN)/python -m pip install -e '.[engine,test,triton]'
	@touch $(STAMP)
	@echo "setup: done (pip's output: $(LOG))"

setup: $(STAMP)

# The client alone: what `pip install .` gives a user who drives their own server (no torch, no engine).
setup-client:
	@if [ ! -x $(CLIENT_VENV)/bin/python ]; then echo "setup: creating $(CLIENT_VENV)"; $(PY) -m venv $(CLIENT_VENV); fi
	@echo "setup: installing slobench (the client alone) into $(CLIENT_VENV)"
	@scripts/quietly.sh $(CLIENT_VENV)/setup.log $(CLIENT_VENV)/bin/python -m pip install .
	@echo "setup: done: $(CLIENT_VENV)/bin/slobench scenarios"

# Everything (what CI runs); test-fast leaves out the `slow` tests (servers, whole searches) for the inner loop.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

capacity: $(STAMP)
	$(BIN)/slobench capacity chat

demo: $(STAMP)
	$(BIN)/slobench generate "The quick brown fox" --max-tokens 32

clean:
	rm -rf $(VENV) $(CLIENT_VENV) .pytest_cache .ruff_cache .hypothesis
