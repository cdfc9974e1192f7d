# Idempotent local setup: `make test` or `make capacity` from a fresh clone does everything.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint demo capacity clean

$(STAMP): pyproject.toml scripts/install-torch.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	scripts/install-torch.sh $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,triton]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

capacity: $(STAMP)
	$(BIN)/slobench capacity scenarios/chat.yaml

demo: $(STAMP)
	$(BIN)/slobench generate "The quick brown fox" --max-tokens 32

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
