# Two entry points: `make run` (set up, then run the pipeline) and `make test`.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export DVC_NO_ANALYTICS := 1

.PHONY: setup run test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dvc repro

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
