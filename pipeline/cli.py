"""`pal`: the pipeline's command group (also `python -m pipeline`).

Each stage has one subcommand, named after its dvc.yaml stage, its params
section and its output folder. Subcommands load lazily so `pal --help` is fast.
"""

from __future__ import annotations

import os

import click

from palcore.cliutil import LazyGroup, setup_logging

# Idle OpenMP threads sleep instead of spinning: on shared or small machines a
# spinning torch thread pool was measured to slow training steps several-fold.
# Set before any subcommand imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Nothing is downloaded at run time (DESIGN §8): a hub id resolves from the
# local HF cache without asking the Hub (and without its "could not reach the
# Hub" warnings). HF_HUB_OFFLINE=0 in the environment asks it again.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

COMMANDS = {
    "backbone": (
        "pipeline.stages.hub:cli",
        "Link a folder to a hub id's snapshot in the local HF cache.",
    ),
    "check": (
        "pipeline.stages.check:cli",
        "Check params, paths, devices and data before dvc repro.",
    ),
    "contracts": (
        "pipeline.stages.contracts:cli",
        "Guard and verify the output contracts of the GPU stages.",
    ),
    "dataset": (
        "pipeline.stages.dataset:cli",
        "Switch to a dataset's own git branch (`demo`: back).",
    ),
    "demo": (
        "pipeline.stages.demo:cli",
        "Make the offline demo dataset and tiny ViLT.",
    ),
    "prepare": (
        "pipeline.stages.prepare:cli",
        "Index a dataset into samples, tasks, missing tables.",
    ),
    "frozen": (
        "pipeline.stages.frozen:cli",
        "Run the frozen backbone once over every sample of the dataset.",
    ),
    "pixels": (
        "pipeline.stages.pixels:cli",
        "Decode every listed image once into a uint8 pixel cache.",
    ),
    "tune": (
        "pipeline.stages.tune:cli",
        "Tune the prompt pools and BP head, task by task.",
    ),
    "extract": (
        "pipeline.stages.extract:cli",
        "Dump prompted joint embeddings into HDF5 shards.",
    ),
    "verify": (
        "pipeline.stages.verify:cli",
        "Re-hash every output the locks name, and DVC's cache behind it.",
    ),
    "predict": (
        "pipeline.stages.predict:cli",
        "Classify new image–text rows with a tuned step and its weights.",
    ),
}


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="pal-pipeline")
def main(verbose: bool) -> None:
    """PAL pipeline: prompting analytic learning with missing modality.

    Stages run in order demo → prepare, frozen and pixels → tune → extract, then
    `pal-solver solve` and `pal-solver evaluate`. `dvc repro` runs them all
    from params.yaml.
    """
    setup_logging(verbose)
