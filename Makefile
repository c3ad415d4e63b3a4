# Entry points: `make run` (set up, then the pipeline: every run of the
# protocol), `make ablation` (the paper's whole ablation table: `pal-paper run
# ablation`), `make test` (the fast tests), `make test-all`, `make lint`.
# Every target runs with .venv/bin first on PATH, so the stage commands that
# `dvc repro` calls (`pal`, `pal-solver`) are found without activating the venv.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export HF_HUB_OFFLINE := 1
export DVC_NO_ANALYTICS := 1

.PHONY: setup run ablation test test-all lint clean wheels

setup: $(STAMP)

# pip --quiet says nothing for a minute or more while it installs: a line every
# 20 s says it still works (a log of `make run` has no silence over 30 s).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "pip install -e '.[dev]' into $(VENV): about 2 minutes the first time"
	@(t=0; while sleep 20 >/dev/null; do t=$$((t + 20)); echo "pip: still installing, $$t s"; done) & \
	  beat=$$!; $(VENV)/bin/pip install --quiet -e ".[dev]"; status=$$?; kill $$beat; exit $$status
	touch $(STAMP)

# `dvc repro`: every stage in order, the analytic stage (solve, evaluate) once
# for all of a pipeline's chains; then one line on how results/demo compares
# with the committed report (the same bytes, or within the rule for results
# on a CPU kind that takes other float paths: docs/DESIGN.md §2).
DVC := $(VENV)/bin/dvc

run: $(STAMP)
	$(DVC) repro
	@$(VENV)/bin/pal-solver compare results/demo

# The whole ablation table: one DVC experiment of dvc.yaml running the
# variants of pipelines.main and pipelines.ablation (Table 3 in
# results/paper/<dataset>/, the whole table in results/<dataset>/ablation/).
ablation: run
	$(VENV)/bin/pal-paper run ablation

# The inner loop: every test but the end-to-end ones marked `slow`, in
# TEST_WORKERS processes (pytest-xdist; about 4 minutes on 2 cores, 6 in one).
# `test-all` runs everything in one process, as CI does.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

test-all: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Wheels for a machine without a registry (the GPU box of palbench/gpu_check.py,
# Python 3.12 on x86-64): `make wheels PACKAGES="h5py click"` fills wheels/,
# which travels with the tree; there, `python3 -m pip install --no-index
# --find-links wheels h5py click`.
PACKAGES ?=
WHEEL_PYTHON ?= 3.12
wheels:
	@test -n "$(PACKAGES)" || { echo 'make wheels: say which, e.g. PACKAGES="h5py click"'; exit 2; }
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version $(WHEEL_PYTHON) \
	  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d wheels $(PACKAGES)
	@du -sh wheels

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
