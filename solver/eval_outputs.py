"""What `evaluate` writes for one weights file: metrics<suffix>.json, the
accuracy matrix and per-step CSVs and (per chain) the step plot, each renamed
into place after every file's bytes are made (solver/evaluate.py's module
docstring lists the files); on multi-label shards metrics<suffix>.json,
f1_matrix<suffix>.csv and map_matrix<suffix>.csv (`write_multilabel`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palcore.outputs import write_bytes_atomic
from solver.classifier import Classifier
from solver.metrics import Counts, matrix_csv, metrics_json, summarize
from solver.multilabel import Scored, multilabel_metrics
from solver.plots import step_plot_png

log = logging.getLogger("solver.evaluate")  # the stage's log, as before


@dataclass
class Evaluation:
    """The counts of one weights file (AL) and of the BP head (None without)."""

    weights: Classifier
    al: Counts
    bp: Counts | None

    @property
    def suffix(self) -> str:
        stem = self.weights.path.stem
        return stem[len("weights") :] if stem.startswith("weights") else f"-{stem}"


def metrics_dict(e: Evaluation) -> dict[str, Any]:
    """metrics.json content: the AL metrics, plus `bp` when scored."""
    out = summarize(e.al)
    out["width"] = e.weights.info.width  # what the weights were solved with
    out["eta"] = "auto" if e.weights.eta_by_step is not None else e.weights.info.eta
    if e.bp is not None:
        out["bp"] = summarize(e.bp)
    if e.weights.eta_by_step is not None:
        out["eta_by_step"] = e.weights.eta_by_step  # solve.eta: auto
    return out


def step_csv(al: list[float], bp: list[float] | None) -> str:
    """step, al, bp: pooled accuracy over seen tasks after each step."""
    lines = ["step,al,bp"]
    for k, a in enumerate(al, start=1):
        b = f"{bp[k - 1]:.4f}" if bp is not None else ""
        lines.append(f"{k},{a:.4f},{b}")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, e: Evaluation, plot: bool = True) -> Path:
    """Write metrics, both CSVs and (with `plot`) the plot for one evaluation;
    return the metrics file's path.

    Every file's bytes are made first, then each is renamed into place.
    """
    sfx = e.suffix
    al = e.al.pooled()
    bp = e.bp.pooled() if e.bp is not None else None
    info = e.weights.info
    m = metrics_dict(e)
    files = {
        f"accuracy_matrix{sfx}.csv": matrix_csv(e.al.matrix()).encode(),
        f"step_accuracy{sfx}.csv": step_csv(al, bp).encode(),
    }
    try:
        if plot:
            eta = "auto" if e.weights.eta_by_step is not None else f"{info.eta:g}"
            title = f"{info.method}, eta {eta}, width {info.width}"
            files[f"step_accuracy{sfx}.png"] = step_plot_png(al, bp, title)
    except ImportError:  # the solver runs without matplotlib; only the plot is lost
        log.warning(
            "evaluate: matplotlib missing, step_accuracy%s.png not written", sfx
        )
    metrics = out_dir / f"metrics{sfx}.json"
    files[metrics.name] = metrics_json(m).encode()
    for name, data in files.items():
        write_bytes_atomic(out_dir / name, data)
    log.info(
        "evaluate: %s acc %.2f fg %.2f aia %.2f last %.2f",
        metrics,
        m["acc"],
        m["fg"],
        m["aia"],
        m["last"],
    )
    return metrics


def write_multilabel(
    out_dir: Path,
    e: Evaluation,
    scored: Scored,
    threshold: float,
    bp: Scored | None = None,
) -> Path:
    """Write metrics<suffix>.json (`multilabel_metrics`, with the weights'
    width and η, and the BP head's under `bp` when scored) and the F1 and mAP
    task matrices as CSVs for one weights file on multi-label shards; return
    the metrics file's path."""
    sfx = e.suffix
    m = multilabel_metrics(scored, threshold)
    m["width"] = e.weights.info.width
    m["eta"] = e.weights.info.eta
    if bp is not None:
        m["bp"] = multilabel_metrics(bp, threshold)
    metrics = out_dir / f"metrics{sfx}.json"
    files = {
        f"f1_matrix{sfx}.csv": matrix_csv(m["matrix"]),
        f"map_matrix{sfx}.csv": matrix_csv(m["map"]["matrix"]),
        metrics.name: metrics_json(m),
    }
    for name, text in files.items():
        write_bytes_atomic(out_dir / name, text.encode())
    log.info(
        "evaluate: %s F1 %.2f fg %.2f last %.2f mAP %.2f (threshold %g)",
        metrics,
        m["acc"],
        m["fg_diag"],
        m["last"],
        m["map"]["acc"],
        threshold,
    )
    return metrics
