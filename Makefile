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

.PHONY: setup run ablation test lint clean wheels

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# `dvc repro`, with the protocol's (variant, run) chains side by side: first
# every prepare@ stage (and the demo they need); then each chain's stages
# tune, extract, solve, evaluate @<variant>-<run>, in order, one `dvc repro
# --single-item` each (no visit upstream, whose outputs other chains are
# reading), JOBS chains at a time with one torch thread each; then the rest
# (report). DVC releases its lock while a stage's command runs, and
# --wait-for-lock makes the processes take turns at the bookkeeping. The
# outputs are the bytes one plain `dvc repro` gives (JOBS=1 runs that).
JOBS ?= 2
DVC := $(VENV)/bin/dvc
# one chain; $$0 is its evaluate stage, e.g. ablation/dvc.yaml:evaluate@shared-1
CHAIN := for s in tune extract solve evaluate; do \
  $(DVC) --wait-for-lock repro --single-item "$${0%%evaluate@*}$$s@$${0\#*evaluate@}" \
  || exit 255; done
define chains
	$(DVC) stage list $(1) --name-only | grep 'evaluate@' | \
	  OMP_NUM_THREADS=1 xargs -P $(JOBS) -n 1 sh -c '$(CHAIN)'
endef

run: $(STAMP)
ifeq ($(JOBS),1)
	$(DVC) repro
else
	$(DVC) repro $$($(DVC) stage list --name-only | grep '^prepare@')
	$(call chains,dvc.yaml)
	$(DVC) repro
endif

# The whole ablation table: the main pipeline, then the variants of
# ablation/dvc.yaml (their chains likewise side by side), then its table.
ablation: run
ifneq ($(JOBS),1)
	$(call chains,ablation/dvc.yaml)
endif
	$(DVC) repro ablation/dvc.yaml

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# Wheels for a machine without a registry (the GPU box of bench/gpu_check.py,
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
