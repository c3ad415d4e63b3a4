"""`pal-solver report`: the protocol's runs and variants as one table.

Reads each evaluated run, `<evaluations>/<variant>/<run>/metrics.json`, for the
runs `protocol.runs` lists and the variants given, and writes (DESIGN §2, §6):

- metrics.json: per row, the mean, sample std (ddof 1) and per-run values of
  acc, fg, fg_diag, aia, last, the accuracy by missing type and the accuracy
  on the first task and on the later tasks after the last step;
- table.md, table.csv: the rows as "mean ± std";
- step_accuracy.csv, step_accuracy.png/.pdf: accuracy over seen tasks after
  each step, mean and std per row (the plot shades mean ± std);
- step_accuracy_rows.csv: the same, a line per (row, step) with the row's
  label, for `dvc plots show` (its columns do not depend on the variants);
- accuracy_matrix.csv, accuracy_matrix.png/.pdf: PAL's mean accuracy matrix;
- headline/<row>.json: a row's Acc, FG, AIA and Last, mean and std, flat and
  at two decimals: DVC's metrics (`dvc metrics show` prints a row per file
  within 120 columns, `dvc exp show` a column per number). A head or metric
  added later joins as a file or a key.

Rows: each variant's analytic classifier, and for `pal` also its BP head
("w/o AL module"). Same inputs, same bytes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from palcore.params import ProtocolParams, load_section
from palcore.variants import VariantRow, pipeline_variants, variant_rows
from solver.head_eval import HEADS_JSON, HEADS_MD, heads_report, heads_table
from solver.metrics import matrix_csv, mean_std, metrics_json
from solver.plots import matrix_figure, steps_figure
from solver.tables import (
    GROUPS,
    MAP_GROUP,
    SCALARS,
    cell,
    steps_csv,
    steps_rows_csv,
    table_csv,
    table_md,
)

log = logging.getLogger(__name__)

# the row of a variant's BP head (PAL's "w/o AL module"), whose label and
# paper name are the variant's params row's `bp` (`ablation.pal.bp`)
BP_ROW = "bp"


class ReportError(PalError):
    """A run's metrics are absent or not what `pal-solver evaluate` writes."""


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
    _aggregate_measure(per_run, row)
    for key in ("width", "eta"):  # what solve used: one value per row
        value = _one_value(per_run, key, "solved")
        if value is not None:
            row[key] = value
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


def _one_value(per_run: Sequence[dict[str, Any]], key: str, verb: str) -> Any:
    """The one value of `key` every run holds (None where none does); one
    line naming two values when the runs differ."""
    used = [m.get(key) for m in per_run]
    differing = [v for v in used if v != used[0]]
    if differing:
        raise ReportError(
            f"the runs of one row were {verb} with different {key}: "
            f"{used[0]} and {differing[0]}"
        )
    return used[0]


def _aggregate_measure(per_run: Sequence[dict[str, Any]], row: dict[str, Any]) -> None:
    """On multi-label runs (`measure` in metrics.json): the row's measure and
    threshold, one per row, and its mAP scalars (`map`) like the scalars."""
    if all("measure" not in m for m in per_run):
        return
    for key in ("measure", "threshold"):
        row[key] = _one_value(per_run, key, "scored")
    row[MAP_GROUP] = {}
    for key in SCALARS:
        values = [float(m[MAP_GROUP][key]) for m in per_run]
        mean, std = mean_std(values)
        row[MAP_GROUP][key] = {"mean": _round(mean), "std": _round(std), "runs": values}


def build(
    evaluations: Path | Sequence[Path],
    variants: Sequence[str],
    protocol: ProtocolParams,
    params_rows: Mapping[str, VariantRow] | None = None,
) -> dict[str, Any]:
    """The report's content: runs, which seeds vary, one entry per row, and
    each row's label and paper name from its params row (`params_rows`;
    without one, the variant's name labels its analytic row). A variant
    whose params row holds `bp` is followed by its BP head's row, `bp`."""
    params_rows = params_rows or {}
    rows: dict[str, Any] = {}
    names: dict[str, VariantRow] = {}
    for variant in variants:
        spec = params_rows.get(variant) or VariantRow(variant, {})
        per_run = read_runs(evaluations, variant, protocol.runs)
        rows[variant] = aggregate(_head(per_run, spec.head, variant, protocol))
        names[variant] = spec
        n_steps = len(rows[variant]["step_accuracy"])
        first = next(iter(rows.values()))
        if n_steps != len(first["step_accuracy"]):
            raise ReportError(
                f"variant {variant} has {n_steps} steps, but "
                f"{next(iter(rows))} has {len(first['step_accuracy'])}"
            )
        if spec.bp is not None and all(m.get("bp") for m in per_run):
            if BP_ROW in rows:
                raise ReportError(
                    f"two variants' params rows hold bp, the row '{BP_ROW}': "
                    f"{_bp_owner(names)} and {variant}"
                )
            rows[BP_ROW] = aggregate([m["bp"] for m in per_run])
            names[BP_ROW] = spec.bp
    return {
        "runs": list(protocol.runs),
        "vary": list(protocol.vary),
        "rows": rows,
        "labels": {name: names[name].label for name in rows},
        "paper": {name: names[name].paper for name in rows},
    }


def _head(
    per_run: list[dict[str, Any]], head: str, variant: str, protocol: ProtocolParams
) -> list[dict[str, Any]]:
    """The per-run metrics of the head a variant's row reports: the analytic
    classifier's, or (`head: bp`) the BP head's that evaluate scored."""
    if head == "analytic":
        return per_run
    for run, m in zip(protocol.runs, per_run, strict=True):
        if not m.get("bp"):
            raise ReportError(
                f"variant {variant} reports its BP head (head: bp), but run {run}'s "
                "metrics hold no bp (its test shards have no bp_logits)"
            )
    return [m["bp"] for m in per_run]


def _bp_owner(names: Mapping[str, VariantRow]) -> str:
    return next(v for v, spec in names.items() if spec.bp is not None)


def _persisted(report: dict[str, Any], name: str) -> dict[str, Any]:
    """A row as metrics.json holds it: its statistics but the mean matrix
    (in accuracy_matrix.csv), with its label and, when the params give one,
    the paper's name of the row (text, or result id -> text)."""
    row = {k: v for k, v in report["rows"][name].items() if k != "matrix"}
    row["label"] = report["labels"][name]
    if report["paper"][name] is not None:
        row["paper"] = report["paper"][name]
    return row


HEADLINE_DIR = "headline"
HEADLINE_KEYS = ("acc", "fg", "aia", "last")


def headline_json(row: Mapping[str, Any]) -> str:
    """A row's headline file: each headline result's mean and std over the
    runs (null for one run), at two decimals."""
    flat: dict[str, float | None] = {}
    for key in HEADLINE_KEYS:
        flat[key] = round(float(row[key]["mean"]), 2)
        std = row[key].get("std")
        flat[f"{key}_std"] = None if std is None else round(float(std), 2)
    return metrics_json(flat)


def _write_headline(folder: Path, rows: Mapping[str, Any]) -> None:
    """A headline file per row, each renamed into place; a file of a row the
    report no longer has is removed (DVC reads every file of the folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, row in rows.items():
        write_bytes_atomic(folder / f"{name}.json", headline_json(row).encode())
    for stale in sorted(folder.glob("*.json")):
        if stale.stem not in rows:
            stale.unlink()


def write_report(out_dir: Path, report: dict[str, Any]) -> None:
    """Make every file's bytes first, then rename each into place; the
    headline files last."""
    metrics = {
        "runs": report["runs"],
        "vary": report["vary"],
        **{name: _persisted(report, name) for name in report["rows"]},
    }
    first = next(iter(report["rows"]))
    files = {
        "metrics.json": metrics_json(metrics),
        "table.md": table_md(report),
        "table.csv": table_csv(report),
        "step_accuracy.csv": steps_csv(report),
        "step_accuracy_rows.csv": steps_rows_csv(report),
        "accuracy_matrix.csv": matrix_csv(report["rows"][first]["matrix"]),
    }
    data = {name: text.encode() for name, text in files.items()}
    try:
        data |= steps_figure(report)
        n = len(report["runs"])
        over = f"mean of {n} runs" if n > 1 else f"run {report['runs'][0]}"
        title = f"{report['labels'][first]}, {over}"
        data |= matrix_figure(report["rows"][first]["matrix"], title)
    except ImportError:
        log.warning("report: matplotlib missing, the plots are not written")
    for name, blob in data.items():
        write_bytes_atomic(out_dir / name, blob)
    _write_headline(out_dir / HEADLINE_DIR, report["rows"])


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
    report = build(evaluations, names, protocol, variant_rows(params_file, names))
    write_report(out, report)
    heads = heads_report(evaluations, names, protocol.runs)
    runs = {"runs": list(protocol.runs), "vary": list(protocol.vary)}
    write_bytes_atomic(out / HEADS_JSON, metrics_json(runs | heads).encode())
    write_bytes_atomic(out / HEADS_MD, heads_table(heads, protocol.runs).encode())
    pal = report["rows"][names[0]]["acc"]
    log.info(
        "report: %d rows over %d runs in %s; %s Acc %s",
        len(report["rows"]),
        len(protocol.runs),
        out,
        names[0],
        cell(pal),
    )
