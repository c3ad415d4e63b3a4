"""`pal-solver report`: the protocol's runs and variants as one table.

Reads each evaluated run, `<evaluations>/<variant>/<run>/metrics.json`, for the
runs `protocol.runs` lists and the variants given, and writes (DESIGN §2, §6):

- metrics.json: per row, the mean, sample std (ddof 1) and per-run values of
  acc, fg, fg_diag, aia, last, the accuracy by missing type and the accuracy
  on the first task and on the later tasks after the last step;
- table.md, table.csv: the rows as "mean ± std";
- step_accuracy.csv, step_accuracy.png: accuracy over seen tasks after each
  step, mean and std per row (the plot shades mean ± std);
- accuracy_matrix.csv, accuracy_matrix.png: PAL's mean accuracy matrix.

Rows: each variant's analytic classifier, and for `pal` also its BP head
("w/o AL module"). Same inputs, same bytes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from palcore.params import (
    ProtocolParams,
    load_section,
    pipeline_variants,
    variant_label,
)
from solver.metrics import matrix_csv, metrics_json
from solver.plots import mean_std_line, new_figure, png_bytes

log = logging.getLogger(__name__)

# the row of PAL's BP head; every variant's label is its params row's
# (`ablation.<variant>.label`)
BP_LABEL = "w/o AL module (BP head)"
SCALARS = ("acc", "fg", "fg_diag", "aia", "last")
MISSING = ("complete", "image_missing", "text_missing")
TASKS = ("first", "later")
# the per-run dicts of metrics.json that a row aggregates key by key
GROUPS = {"acc_by_missing": MISSING, "acc_by_task": TASKS}
COLUMNS = {
    "acc": "Acc",
    "fg": "FG",
    "fg_diag": "FG_diag",
    "aia": "AIA",
    "last": "Last",
    "complete": "complete",
    "image_missing": "image missing",
    "text_missing": "text missing",
    "first": "first task",
    "later": "later tasks",
}
SEED_WORDS = {
    "class_order": "class order",
    "missing": "missing tables",
    "prompts": "prompt init and batch order",
    "upsampling": "up-sampling",
}


class ReportError(PalError):
    """A run's metrics are absent or not what `pal-solver evaluate` writes."""


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof 1; None for one value)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def read_runs(
    evaluations: Path | Sequence[Path], variant: str, runs: Sequence[int]
) -> list[dict[str, Any]]:
    """The metrics.json of each run of `variant`, in the order of `runs`; from
    the first of the `evaluations` folders that holds `variant`."""
    roots = [Path(evaluations)] if isinstance(evaluations, (str, Path)) else evaluations
    evaluations = next((r for r in roots if (r / variant).is_dir()), roots[0])
    out = []
    for run in runs:
        path = evaluations / variant / str(run) / "metrics.json"
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ReportError(f"{path}: not found (run {run} not evaluated)") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ReportError(f"{path}: not valid JSON") from None
        if not isinstance(m, dict):
            raise ReportError(f"{path}: not evaluate's metrics (no JSON object)")
        missing = [k for k in (*SCALARS, "matrix", "step_accuracy") if k not in m]
        if missing:
            raise ReportError(f"{path}: no '{missing[0]}' (not evaluate's metrics)")
        bad = [k for k in SCALARS if not _is_number(m[k])]
        if bad:
            raise ReportError(f"{path}: '{bad[0]}' is not a number: {m[bad[0]]!r}")
        out.append(m)
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def aggregate(per_run: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean, std and per-run values of each metric over the runs of one row."""
    row: dict[str, Any] = {}
    for key in SCALARS:
        values = [float(m[key]) for m in per_run]
        mean, std = mean_std(values)
        row[key] = {"mean": _round(mean), "std": _round(std), "runs": values}
    for group, keys in GROUPS.items():
        row[group] = {}
        for key in keys:
            values = [
                float(m[group][key])
                for m in per_run
                if m.get(group, {}).get(key) is not None
            ]
            if len(values) == len(per_run):
                mean, std = mean_std(values)
                row[group][key] = {
                    "mean": _round(mean),
                    "std": _round(std),
                    "runs": values,
                }
    for key in ("width", "eta"):  # what solve used: one value per row
        values = [m.get(key) for m in per_run]
        if any(v != values[0] for v in values):
            other = next(v for v in values if v != values[0])
            raise ReportError(
                f"the runs of one row were solved with different {key}: "
                f"{values[0]} and {other}"
            )
        if values[0] is not None:
            row[key] = values[0]
    steps = [m["step_accuracy"] for m in per_run]
    if len({len(s) for s in steps}) != 1:
        raise ReportError(
            f"the runs of one row have different numbers of steps: {len(steps[0])}"
            f" and {next(len(s) for s in steps if len(s) != len(steps[0]))}"
        )
    row["step_accuracy"] = [
        {"mean": _round(mean), "std": _round(std)}
        for mean, std in (mean_std(col) for col in zip(*steps, strict=True))
    ]
    row["matrix"] = [
        [
            _round(math.fsum(m["matrix"][k][i] for m in per_run) / len(per_run))
            for i in range(len(per_run[0]["matrix"][k]))
        ]
        for k in range(len(per_run[0]["matrix"]))
    ]
    return row


def build(
    evaluations: Path | Sequence[Path],
    variants: Sequence[str],
    protocol: ProtocolParams,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The report's content: runs, which seeds vary, one entry per row and
    each row's label (`labels`, default: the row's name)."""
    rows: dict[str, Any] = {}
    for variant in variants:
        per_run = read_runs(evaluations, variant, protocol.runs)
        rows[variant] = aggregate(per_run)
        n_steps = len(rows[variant]["step_accuracy"])
        first = next(iter(rows.values()))
        if n_steps != len(first["step_accuracy"]):
            raise ReportError(
                f"variant {variant} has {n_steps} steps, but "
                f"{next(iter(rows))} has {len(first['step_accuracy'])}"
            )
        if variant == "pal" and all(m.get("bp") for m in per_run):
            rows["bp"] = aggregate([m["bp"] for m in per_run])
    labels = {**{name: name for name in rows}, **(labels or {}), "bp": BP_LABEL}
    return {
        "runs": list(protocol.runs),
        "vary": list(protocol.vary),
        "rows": rows,
        "labels": {name: labels[name] for name in rows},
    }


def _cell(stat: dict[str, Any] | None) -> str:
    if stat is None:
        return ""
    if stat["std"] is None:
        return f"{stat['mean']:.2f}"
    return f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def _stats(row: dict[str, Any]) -> list[dict[str, Any] | None]:
    """The row's statistics in COLUMNS order (None where a group lacks one)."""
    stats = [row[k] for k in SCALARS]
    for group, keys in GROUPS.items():
        stats += [row.get(group, {}).get(k) for k in keys]
    return stats


def _cells(row: dict[str, Any]) -> list[str]:
    return [_cell(stat) for stat in _stats(row)]


def caption(report: dict[str, Any]) -> str:
    """Which runs the table averages and which seeds differ between them."""
    runs = ", ".join(str(r) for r in report["runs"])
    n = len(report["runs"])
    varied = [SEED_WORDS[v] for v in report["vary"]]
    seeds = (
        f"run r adds r to the seeds of: {', '.join(varied)}"
        if varied
        else "no seed differs between runs"
    )
    if n == 1:
        return f"one run ({runs}), no spread; {seeds}."
    return f"mean ± sample std over {n} runs ({runs}); {seeds}."


def table_md(report: dict[str, Any]) -> str:
    """The rows as a Markdown table, accuracies in %."""
    header = ["", *COLUMNS.values()]
    lines = [
        f"Accuracy (%) of each variant, {caption(report)}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in report["rows"].items():
        lines.append(f"| {report['labels'][name]} | " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines) + "\n"


def table_csv(report: dict[str, Any]) -> str:
    """One line per row: name, then mean and std of each column."""
    cols = [f"{k}_{s}" for k in COLUMNS for s in ("mean", "std")]
    lines = ["row," + ",".join(cols)]
    for name, row in report["rows"].items():
        cells = []
        for stat in _stats(row):
            for s in ("mean", "std"):
                value = None if stat is None else stat[s]
                cells.append("" if value is None else f"{value:.4f}")
        lines.append(f"{name}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def steps_csv(report: dict[str, Any]) -> str:
    """step, then <row>_mean and <row>_std for each row."""
    rows = report["rows"]
    names = list(rows)
    lines = ["step," + ",".join(f"{n}_{s}" for n in names for s in ("mean", "std"))]
    n_steps = len(next(iter(rows.values()))["step_accuracy"])
    for k in range(n_steps):
        cells = []
        for n in names:
            stat = rows[n]["step_accuracy"][k]
            cells.append(f"{stat['mean']:.4f}")
            cells.append("" if stat["std"] is None else f"{stat['std']:.4f}")
        lines.append(f"{k + 1}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def steps_png(report: dict[str, Any]) -> bytes:
    """Mean accuracy over seen tasks per step, each row shaded mean ± std."""
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    for name, row in report["rows"].items():
        steps = mean_std_line(ax, row["step_accuracy"], report["labels"][name])
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy over seen tasks (%)")
    ax.set_xticks(steps)
    ax.set_ylim(0, 102)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(caption(report), fontsize=7, wrap=True)
    fig.tight_layout()
    return png_bytes(fig)


def matrix_png(matrix: list[list[float]], title: str) -> bytes:
    """The accuracy matrix (step × task) as an annotated heatmap."""
    import numpy as np

    K = len(matrix)
    grid = np.full((K, K), np.nan)
    for k, row in enumerate(matrix):
        grid[k, : len(row)] = row
    fig = new_figure(5, 4.2)
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis")
    for k, row in enumerate(matrix):
        for i, a in enumerate(row):
            ax.text(i, k, f"{a:.0f}", ha="center", va="center", fontsize=8, color="w")
    ax.set_xticks(range(K), [str(i) for i in range(1, K + 1)])
    ax.set_yticks(range(K), [str(k) for k in range(1, K + 1)])
    ax.set_xlabel("task")
    ax.set_ylabel("after step")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    return png_bytes(fig)


def write_report(out_dir: Path, report: dict[str, Any]) -> None:
    """Make every file's bytes first, then rename each into place."""
    metrics = {
        "runs": report["runs"],
        "vary": report["vary"],
        **{
            name: {k: v for k, v in row.items() if k != "matrix"}
            for name, row in report["rows"].items()
        },
    }
    first = next(iter(report["rows"]))
    files = {
        "metrics.json": metrics_json(metrics),
        "table.md": table_md(report),
        "table.csv": table_csv(report),
        "step_accuracy.csv": steps_csv(report),
        "accuracy_matrix.csv": matrix_csv(report["rows"][first]["matrix"]),
    }
    data = {name: text.encode() for name, text in files.items()}
    try:
        data["step_accuracy.png"] = steps_png(report)
        n = len(report["runs"])
        over = f"mean over {n} runs" if n > 1 else f"run {report['runs'][0]}"
        title = f"{report['labels'][first]}: {over}"
        data["accuracy_matrix.png"] = matrix_png(report["rows"][first]["matrix"], title)
    except ImportError:
        log.warning("report: matplotlib missing, the plots are not written")
    for name, blob in data.items():
        write_bytes_atomic(out_dir / name, blob)


@click.command("report")
@click.option(
    "--evaluations",
    multiple=True,
    default=("data/evaluate",),
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Folder of evaluated runs: <variant>/<run>/metrics.json; repeat it "
    "for variants evaluated into several folders (the first that holds a "
    "variant is read).",
)
@click.option(
    "--pipeline",
    "pipelines",
    multiple=True,
    metavar="NAME",
    help="Report the variants params pipelines.NAME lists, in table order; "
    "repeat it for several pipelines' variants in one table.",
)
@click.option(
    "--variants",
    default=None,
    metavar="NAME[,NAME…]",
    help="Or name the variants (rows of params `ablation`) to report, in table "
    "order. Default: pal. pal also adds its BP head as the row 'w/o AL module'.",
)
@folder_option("out", "results", "Output folder for the tables and plots.")
@params_option
@clean_errors
def cli(
    evaluations: tuple[str, ...],
    pipelines: tuple[str, ...],
    variants: str | None,
    out: str,
    params_file: str,
) -> None:
    """Mean ± std over the protocol's runs, per variant: tables and plots.

    Reads the runs listed in protocol.runs of each variant's evaluations and
    writes metrics.json, table.md, table.csv, step_accuracy.csv/.png and
    accuracy_matrix.csv/.png (the first variant's mean matrix) into OUT.
    """
    if pipelines and variants is not None:
        raise ReportError("--pipeline and --variants: give one of them")
    if pipelines:
        names = [v for p in pipelines for v in pipeline_variants(params_file, p)]
    else:
        names = [v.strip() for v in (variants or "pal").split(",") if v.strip()]
    protocol_report([Path(e) for e in evaluations], names, Path(out), params_file)


def protocol_report(
    evaluations: Sequence[Path], names: Sequence[str], out: Path, params_file: Any
) -> None:
    """The report of variants `names` over the protocol's runs into `out`."""
    protocol = load_section(params_file, "protocol", ProtocolParams)
    if not names:
        raise ReportError("--variants: name at least one variant")
    labels = {name: variant_label(params_file, name) for name in names}
    report = build(evaluations, names, protocol, labels)
    write_report(out, report)
    pal = report["rows"][names[0]]["acc"]
    log.info(
        "report: %d rows over %d runs in %s; %s Acc %s",
        len(report["rows"]),
        len(protocol.runs),
        out,
        names[0],
        _cell(pal),
    )
