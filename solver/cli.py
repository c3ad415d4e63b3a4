"""`pal-solver`: the solver's command group (also `python -m solver`).

`solve` fits the analytic classifier on the feature shards of every step and
writes `weights.h5`; `evaluate` scores it on the test shards and writes the
metrics, the accuracy matrix and a plot. Neither imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import click

from solver.cliutil import clean_errors, folder_option, params_option, setup_logging
from solver.errors import ParamsError
from solver.params import SolveParams, load_section

_FLOAT_OPTIONS = ("eta",)
_INT_OPTIONS = {"width": 1, "seed": 0, "batch_rows": 1}  # option -> minimum
_CHOICES = {
    "method": ("gram", "woodbury"),
    "device": ("auto", "cpu", "cuda"),
    "dtype": ("float64", "float32"),
}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_etas(text: str) -> float | tuple[float, ...]:
    values = []
    for item in text.split(","):
        try:
            eta = float(item)
        except ValueError:
            raise ParamsError(f"--eta: {item.strip()!r} is not a number") from None
        if not math.isfinite(eta) or eta <= 0:
            raise ParamsError(f"--eta must be > 0 and finite, got {item.strip()}")
        values.append(eta)
    if len(set(values)) != len(values):
        raise ParamsError(f"--eta lists a value twice: {text}")
    return values[0] if len(values) == 1 else tuple(values)


def apply_overrides(params: SolveParams, **raw: str | None) -> SolveParams:
    """`params` with the CLI's values (strings, None = not given) put in.

    Errors name the option (`--eta`, `--width`, …), in one line.
    """
    values: dict[str, object] = {}
    for name, text in raw.items():
        if text is None:
            continue
        opt = _option(name)
        if name in _FLOAT_OPTIONS:
            values[name] = _parse_etas(text)
        elif name in _INT_OPTIONS:
            try:
                value = int(text)
            except ValueError:
                raise ParamsError(f"{opt} must be an integer, got {text!r}") from None
            low = _INT_OPTIONS[name]
            if value < low:
                raise ParamsError(f"{opt} must be >= {low}, got {value}")
            values[name] = value
        elif name in _CHOICES:
            if text not in _CHOICES[name]:
                raise ParamsError(
                    f"{opt} must be one of {', '.join(_CHOICES[name])}, got {text!r}"
                )
            values[name] = text
        else:
            raise AssertionError(name)
    return dataclasses.replace(params, **values)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """PAL's analytic-learning solver: `solve` then `evaluate`.

    Reads the feature shards written by `pal extract` (DESIGN §3) and the
    `solve:` section of params.yaml. Needs only NumPy/SciPy, h5py and click
    (CuPy on a GPU); it never imports torch.
    """
    setup_logging(verbose)


@main.command("solve")
@folder_option(
    "features", "data/extract", "Features folder: step_01/train.h5, test.h5, …"
)
@folder_option(
    "out", "data/solve", "Output folder for weights.h5 (weights-eta<η>.h5 for a sweep)."
)
@click.option(
    "--eta",
    metavar="X[,X…]",
    help="Ridge regulariser η > 0 [solve.eta]. Several comma-separated "
    "values run a sweep: one pass over the shards, one weights file "
    "per η, named weights-eta<η>.h5.",
)
@click.option("--width", metavar="N", help="Up-sampling width d > 0 [solve.width].")
@click.option(
    "--seed", metavar="N", help="Seed of the up-sampling matrix [solve.seed]."
)
@click.option(
    "--method",
    metavar="gram|woodbury",
    help="gram: G += HᵀH, Cholesky per step (fast); woodbury: the paper's "
    "RLS update per batch [solve.method].",
)
@click.option(
    "--device",
    metavar="auto|cpu|cuda",
    help="cpu: NumPy/SciPy; cuda: CuPy; auto: CuPy when a GPU passes a "
    "smoke test, else NumPy [solve.device].",
)
@click.option(
    "--dtype",
    metavar="float64|float32",
    help="Accumulation and solve precision [solve.dtype].",
)
@click.option(
    "--batch-rows",
    metavar="N",
    help="Rows per streamed chunk and per Woodbury update [solve.batch_rows].",
)
@params_option
@clean_errors
def solve_cmd(
    features: str, out: str, params_file: str, **overrides: str | None
) -> None:
    """Fit the analytic classifier after every step; write weights.h5.

    Streams each step's train shard once in row chunks, up-samples
    H = max(X·W_up, 0) with the seeded W_up of DESIGN §4, and solves the ridge
    classifier over all classes seen so far; W_k equals the joint ridge
    solution over all rows of steps 1..k. Options override the `solve:`
    section of the params file.
    """
    from solver.solve import solve

    params = apply_overrides(
        load_section(params_file, "solve", SolveParams), **overrides
    )
    solve(features, out, params)


@main.command("evaluate")
@folder_option("features", "data/extract", "Features folder with the test shards.")
@click.option(
    "--weights",
    "weights",
    multiple=True,
    metavar="PATH",
    help="Weights file from `solve`; repeat for several. A folder means all its "
    "weights-eta*.h5 files (an η sweep). Default: data/solve/weights.h5, or "
    "data/solve/weights-eta<η>.h5 for each η when solve.eta is a list.",
)
@folder_option("out", "results", "Output folder for metrics, CSVs and the plot.")
@click.option(
    "--device", metavar="auto|cpu|cuda", help="Backend for scoring [solve.device]."
)
@params_option
@clean_errors
def evaluate_cmd(
    features: str,
    weights: tuple[str, ...],
    out: str,
    params_file: str,
    device: str | None,
) -> None:
    """Score the weights on every step's test shards; write metrics.

    Writes metrics.json (acc, fg, fg_diag, aia, last, matrix, acc_by_missing,
    and bp for the BP head when the shards hold bp_logits),
    accuracy_matrix.csv, step_accuracy.csv and step_accuracy.png. For
    weights-eta<η>.h5 the names carry the same -eta<η> suffix.
    """
    from solver.backend import get_backend
    from solver.evaluate import evaluate
    from solver.weights import weights_name

    params = apply_overrides(
        load_section(params_file, "solve", SolveParams), device=device
    )
    if not weights:
        names = [weights_name(eta, params.is_sweep) for eta in params.etas]
        weights = tuple(str(Path("data/solve") / name) for name in names)
    evaluate(
        features,
        [Path(w) for w in weights],
        out,
        backend=get_backend(params.device),
        batch_rows=params.batch_rows,
    )
