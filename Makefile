# Idempotent local setup: `make test` or `make capacity` from a fresh clone does everything.
# Setup prints one line per step. pip's output goes to $(LOG): printed in full when a step fails,
# otherwise only its warnings that matter (scripts/quietly.sh lists the harmless ones).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOG := $(VENV)/setup.log
QUIETLY := scripts/quietly.sh $(LOG)

.PHONY: setup test lint demo capacity clean

$(STAMP): pyproject.toml scripts/install-torch.sh scripts/quietly.sh
	@if [ ! -x $(BIN)/python ]; then echo "setup: creating $(VENV) ($$($(PY) --version))"; $(PY) -m venv $(VENV); fi
	@: > $(LOG)
	@echo "setup: upgrading pip in $(VENV)"
	@$(QUIETLY) $(BIN)/python -m pip install --upgrade pip
	@scripts/install-torch.sh $(BIN)/python $(LOG)
	@echo "setup: installing slobench (editable) with its test extras"
	@$(QUIETLY) $(BIN)/python -m pip install -e '.[test,triton]'
	@touch $(STAMP)
	@echo "setup: done (pip's output: $(LOG))"

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

capacity: $(STAMP)
	$(BIN)/slobench capacity loadgen/scenarios/chat.yaml

demo: $(STAMP)
	$(BIN)/slobench generate "The quick brown fox" --max-tokens 32

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
