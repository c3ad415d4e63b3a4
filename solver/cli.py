"""`pal-solver`: the solver's command group (also `python -m solver`).

`solve` fits the analytic classifier on the feature shards of every step and
writes `weights.h5`; `evaluate` scores it on the test shards and writes the
metrics, the accuracy matrix and a plot. Neither imports torch. Each command
lives in its stage's module and loads only when invoked.
"""

from __future__ import annotations

import click

from palcore.cliutil import LazyGroup, setup_logging

COMMANDS = {
    "solve": (
        "solver.solve:cli",
        "Fit the analytic classifier after every step; write weights.h5.",
    ),
    "evaluate": (
        "solver.evaluate:cli",
        "Score the weights on every step's test shards; write metrics.",
    ),
    "report": (
        "solver.report:cli",
        "Mean ± std over the protocol's runs, per variant: tables and plots.",
    ),
    "export": (
        "solver.export:cli",
        "Copy a features folder out of the project, sealed (MD5SUMS).",
    ),
    "compare": (
        "solver.compare:cli",
        "Compare a report with the committed one, by the rule for results.",
    ),
    "show": (
        "solver.show:cli",
        "Print a report's metrics.json as a table of at most 120 columns.",
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
    """PAL's analytic-learning solver: `solve`, `evaluate`, then `report`.

    Reads the feature shards written by `pal extract` (DESIGN §3) and the
    `solve:` section of params.yaml. Needs NumPy, SciPy, h5py, PyYAML, tqdm,
    click and matplotlib (for the report's figures), CuPy on a GPU; it
    never imports torch.
    """
    setup_logging(verbose)
