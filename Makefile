# Entry points: `make run` (set up, then the pipeline: every run of the
# protocol), `make ablation` (the paper's whole ablation table), `make test`,
# `make lint`.
# Every target runs with .venv/bin first on PATH, so the stage commands that
# `dvc repro` calls (`pal`, `pal-solver`) are found without activating the venv.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export DVC_NO_ANALYTICS := 1

.PHONY: setup run ablation test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dvc repro

ablation: $(STAMP)
	$(VENV)/bin/dvc repro ablation/dvc.yaml

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
