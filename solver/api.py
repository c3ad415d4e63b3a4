"""The solver's public face: what code outside `solver/` may use.

Besides this module, only `solver.shards` (the feature shard format, which
`pal extract` writes: DESIGN §3) with its readers `solver.shard_readers`, and
`solver.cli` (the `pal-solver` group) are public; every other module of the
package is its inside and may change without notice. `tests/test_solver_api.py`
checks that no module of `pipeline/`, `palpaper/`, `palcore/` or `bench/`
imports another.

- Fit: `fit(features, out, params)` writes one chain's weights (what
  `pal-solver solve` does); `fit_pipeline(source, name, features, out)`
  fits every (variant, run) chain of a pipeline on one backend.
- Classify: `Classifier(weights_file)` gives `logits(X, step)` =
  max(X W_up, 0) W_step for features X (n, D), with the file's own up-sampling;
  `head_logits(heads_file, head, step, backend)` the scores of one head of
  `solve.heads` (heads.h5 beside weights.h5); `HEADS`, their names;
  `solve_flops(E, n, D, C, steps, chunk)`, what each head adds to a solve.
- Evaluate: `evaluate(features, [weights], out)` scores one chain;
  `evaluate_pipeline(...)` every chain, then with `report=DIR` the report
  (`report(evaluations, variants, out, params)`), whose metrics.json holds
  every row's label (DESIGN §6).
- Params: `SolveParams`, `EvaluateParams` (the `solve:` and `evaluate:`
  sections), loaded with `palcore.params.load_section`.
- Tools for benchmarks: `get_backend(device)`, `cupy_or_reason()`,
  `upsampling_matrix(D, d, seed)`, `weights_name(eta, sweep)`,
  `make_features(out, …)` (synthetic shards).
- Plots' plumbing, which `pal-paper` draws with: `paper_style()`,
  `new_figure(w, h)`, `style_of(method)` (one style per method everywhere),
  `mean_std_line(ax, stats, label, key)`, `accuracy_axes`, `legend_below`,
  `figure_files(fig, stem)` (a 300-dpi PNG and a PDF; same figure, same
  bytes), `png_bytes(fig)`.
"""

from __future__ import annotations

from typing import Any

from solver import heads
from solver.backend import Backend, _cupy_or_reason, get_backend
from solver.classifier import Classifier
from solver.evaluate import evaluate, evaluate_pipeline
from solver.head_eval import head_logits
from solver.heads import HEADS, solve_flops
from solver.params import EvaluateParams, SolveParams, check_memory
from solver.plots import (
    PAGE_IN,
    PAPER_METHOD,
    accuracy_axes,
    figure_files,
    legend_below,
    mean_std_line,
    new_figure,
    paper_style,
    png_bytes,
    style_of,
)
from solver.report import protocol_report as report
from solver.rls import upsampling_matrix
from solver.solve import solve as fit
from solver.solve import solve_pipeline as fit_pipeline
from solver.synthetic import make_features
from solver.weights import weights_name

__all__ = [
    "HEADS",
    "Backend",
    "Classifier",
    "EvaluateParams",
    "SolveParams",
    "check_memory",
    "cupy_or_reason",
    "evaluate",
    "head_logits",
    "evaluate_pipeline",
    "fit",
    "fit_pipeline",
    "get_backend",
    "heads",
    "make_features",
    "PAGE_IN",
    "PAPER_METHOD",
    "accuracy_axes",
    "figure_files",
    "legend_below",
    "mean_std_line",
    "new_figure",
    "paper_style",
    "png_bytes",
    "solve_flops",
    "style_of",
    "report",
    "upsampling_matrix",
    "weights_name",
]


def cupy_or_reason() -> tuple[Any | None, str]:
    """(cupy, "") when a GPU runs a kernel and a Cholesky solve, else (None,
    why): the test `solve.device: auto` makes."""
    return _cupy_or_reason()
