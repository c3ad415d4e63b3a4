"""The options `pal-paper`'s commands share, and their help."""

from __future__ import annotations

from pathlib import Path

import click

from palcore.params import DEFAULT_PARAMS
from palpaper import workers

JOBS_HELP = (
    "Queue workers (`dvc queue start -j N`): N cells at once. Every worker sees "
    "the same devices, so on a GPU box they share the first GPU: use --gpus "
    "there. Default: 1, or on a GPU every card filled (see --gpus)."
)
GPUS_HELP = (
    "One queue worker per CUDA device id listed (e.g. 0,1,2,3), each pinned to "
    "its card with CUDA_VISIBLE_DEVICES: every cell runs on one card, the "
    "workers share the DVC cache. List a card twice for two cells on it at "
    f"once. Replaces -j. Default: ${workers.ENV} when set; else, where "
    "tune.device is a GPU and neither is -j given, every card torch sees "
    "filled: as many workers a card as palpaper/costs.yaml's packing and the "
    "card's memory allow."
)


runs_option = click.option(
    "--runs",
    default=None,
    metavar="R[,R…]",
    help="Run ids of each cell (sets protocol.runs). Default: the committed "
    "protocol.runs. Use --runs 0 where three runs per cell do not fit.",
)
params_path_option = click.option(
    "--params",
    "params_file",
    default=str(DEFAULT_PARAMS),
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The params file the cells change (the committed one for run/collect).",
)
cells_option = click.option(
    "--cells",
    default=None,
    metavar="NAME[,NAME…]",
    help="Run only these cells: a cell's name or its column's key, as `pal-paper "
    "list` prints them (missing's `text-0.1` is the cell of 10 % text missing).",
)
shard_option = click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="Run every N-th cell from the K-th (1-based): one share of the grid, "
    "for one of N machines or clones (docs/USAGE.md).",
)
out_option = click.option(
    "--out",
    default="results/paper",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the rendered results; each dataset gets its own subfolder.",
)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the same as one JSON object, for scripts.",
)
baselines_option = click.option(
    "--baselines",
    type=click.Choice(["measured", "cited"]),
    default="measured",
    show_default=True,
    help="Tables 1-2 (missing) and steps: `measured` runs the five compared "
    "methods (MAP, MSP, L2P, DualPrompt, RebQ) in every cell; `cited` runs "
    "PAL, ACIL and PAL's own rows only (cells of their own), Tables 1-2 show "
    "the paper's numbers for the five, marked (cited), and the per-step "
    "figures leave them out. Only for a dataset the paper reports (food101, "
    "n24news).",
)
