"""Render results from the cells' finished experiments, a partial grid too.

A cell without a finished experiment on the baseline commit is marked – in
its table and named in one line with the command that runs it (the
researcher's options kept, `--cells` naming the missing ones), and, when
those cells finished on another commit (HEAD moved since the grid ran), the
`--rev` that renders them. A result none of whose cells finished is not
written; the others are. A result with a report folder (Table 3's
`ablation`) also gets its one cell's whole report there, as its evaluate
stage wrote it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from palcore.outputs import write_bytes_atomic
from palcore.variants import variant_row
from palpaper import render
from palpaper.departures import departures, prepared_classes
from palpaper.experiments import QueueDamaged, Repo
from palpaper.grids import RESULTS, Column, cited_variants
from palpaper.overrides import Cell, get
from palpaper.tools import ExperimentError

log = logging.getLogger(__name__)


def command(
    names: Sequence[str],
    runs: Sequence[int] | None,
    cells: Sequence[str] | None = None,
    shard: str | None = None,
    jobs: int = 1,
    verb: str = "run",
    cite: bool = False,
) -> str:
    """The `pal-paper` command line with these options (what to type again)."""
    cmd = f"pal-paper {verb} " + " ".join(names)
    if cite:
        cmd += " --baselines cited"
    if runs is not None:
        cmd += f" --runs {','.join(map(str, runs))}"
    if cells:
        cmd += f" --cells {','.join(cells)}"
    if shard:
        cmd += f" --shard {shard}"
    if jobs != 1:
        cmd += f" -j {jobs}"
    return cmd


def grid(
    names: Sequence[str],
    params: dict[str, Any],
    runs: Sequence[int] | None,
    cite: bool = False,
) -> tuple[dict[str, list[Column]], list[Cell]]:
    """Each result's columns, and the distinct cells of them all in order;
    `cite`: the route `--baselines cited` (`grids.Result.columns`)."""
    columns = {n: RESULTS[n].columns(params, runs, cite) for n in names}
    cells: dict[str, Cell] = {}
    for cols in columns.values():
        for c in cols:
            cells.setdefault(c.cell.name, c.cell)
    return columns, list(cells.values())


def _why(repo: Repo, cell: Cell, status: dict[str, str]) -> str:
    name = repo.exp_name(cell)
    return {
        "Failed": f"failed (`dvc queue logs {name}`)",
        "Queued": "still queued",
        "Running": "still running",
    }.get(status.get(name, ""), f"no finished experiment on {repo.short}")


def _moved_hint(repo: Repo, ids: Sequence[str], lacking: list[Cell], cite: bool) -> str:
    """'; they finished on X: `pal-paper collect … --rev X`' when the lacking
    cells finished on another commit (HEAD moved since the grid ran)."""
    elsewhere = repo.other_baselines([c.name for c in lacking])
    if not elsewhere:
        return ""
    rev, n = max(elsewhere.items(), key=lambda kv: (kv[1], kv[0]))
    return (
        f" ({n} of them finished on {rev[:7]}, not {repo.short}: "
        f"`{command(ids, None, verb='collect', cite=cite)} --rev {rev[:7]}` "
        "renders those)"
    )


def collect(
    repo: Repo,
    ids: list[str],
    params: dict[str, Any],
    runs: list[int] | None,
    out: Path,
    cite: bool = False,
) -> None:
    """Render each result of `ids` into OUT/<dataset>/, missing cells marked;
    `cite`: the cells of `--baselines cited`, Tables 1-2's five compared
    methods from the paper (never from a cell's metrics)."""
    columns, cells = grid(ids, params, runs, cite)
    dataset = str(get(params, "data.dataset"))
    finished = repo.finished(cells)  # refs whose params are the cells'
    metrics: dict[str, dict[str, Any]] = {}
    commits: dict[str, str] = {}
    classes = None
    for c in cells:
        commit = finished.get(repo.exp_name(c))
        if commit is None:
            continue
        m = repo.metrics(commit, dataset)
        if m is not None and any(RESULTS[rid].id == "heads" for rid in ids):
            heads = repo.show(commit, f"results/{dataset}/heads.json")
            m[render.HEADS_KEY] = _heads_of(heads)
        if m is not None:
            metrics[c.name], commits[c.name] = m, commit
            if classes is None:
                classes = prepared_classes(repo.root, repo.show(commit, "dvc.lock"))
    lacking = [c for c in cells if c.name not in metrics]
    if lacking:
        _warn_lacking(repo, ids, columns, lacking, runs, cite)
    empty = []
    for rid in ids:
        data = {col.key: metrics.get(col.cell.name, {}) for col in columns[rid]}
        if not any(data.values()):
            empty.append(rid)
            continue
        _write(rid, columns[rid], data, params, runs, classes, out / dataset, cite)
        if RESULTS[rid].report is not None:
            (column,) = columns[rid]
            _keep_report(repo, rid, commits[column.cell.name], dataset)
    if empty:
        raise ExperimentError(
            "\nError: ".join(
                f"{rid}: none of its {len(columns[rid])} cells finished on "
                f"{repo.short}; nothing written (run: "
                f"{command([rid], runs, cite=cite and RESULTS[rid].runs_baselines)})"
                for rid in empty
            )
        )


def _heads_of(text: str | None) -> dict[str, Any]:
    """A cell's heads.json without its runs: head -> variant -> row."""
    if text is None:
        return {}
    try:
        heads = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return {k: v for k, v in heads.items() if k not in ("runs", "vary")}


def _warn_lacking(
    repo: Repo,
    ids: list[str],
    columns: dict[str, list[Column]],
    lacking: list[Cell],
    runs: list[int] | None,
    cite: bool,
) -> None:
    """One line per result that lacks cells: which, why, the command that
    runs them (and the --rev where they finished on another commit)."""
    try:
        status = repo.queue_status()
    except QueueDamaged as exc:  # the finished cells still render
        log.warning("%s", exc)
        status = {}
    moved = _moved_hint(repo, ids, lacking, cite)
    for rid in ids:
        mine = [c for c in lacking if any(x.cell == c for x in columns[rid])]
        if not mine:
            continue
        why: dict[str, list[str]] = {}
        for c in mine:
            why.setdefault(_why(repo, c, status), []).append(c.name)
        log.warning(
            "%s: %d of %d cells marked – (%s); run them: %s%s",
            rid,
            len(mine),
            len(columns[rid]),
            "; ".join(f"{w}: {', '.join(n)}" for w, n in why.items()),
            command(
                [rid],
                runs,
                [c.name for c in mine],
                cite=cite and RESULTS[rid].runs_baselines,
            ),
            moved,
        )


def _keep_report(repo: Repo, rid: str, commit: str, dataset: str) -> None:
    """The result's one cell's whole report (what its evaluate stage wrote to
    results/<dataset>/: every variant's row, the step plots) copied into
    results/<dataset>/<report>/."""
    folder = repo.root / "results" / dataset / str(RESULTS[rid].report)
    files = repo.report(commit, dataset)  # metrics.json among them: it was read
    for name, blob in sorted(files.items()):
        write_bytes_atomic(folder / name, blob)
    log.info("%s: the cell's report in %s (%d files)", rid, folder, len(files))


def labelled(metrics: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A cell's metrics.json with each row's label and paper name: as the
    report wrote them, or (a cell run before the report wrote them) from the
    params' `ablation` rows, PAL's BP head's from its row's `bp`."""
    specs = {v: variant_row(params, v) for v in params.get("ablation") or {}}
    specs |= [("bp", s.bp) for s in list(specs.values()) if s.bp is not None]
    out = dict(metrics)
    for name, entry in metrics.items():
        if isinstance(entry, dict) and "label" not in entry and name in specs:
            spec = specs[name]
            out[name] = {**entry, "label": spec.label}
            if spec.paper is not None:
                out[name]["paper"] = spec.paper
    return out


def _write(
    rid: str,
    columns: list[Column],
    data: dict[str, Any],
    params: dict[str, Any],
    runs: list[int] | None,
    classes: int | None,
    folder: Path,
    cite: bool,
) -> None:
    r = RESULTS[rid]
    cite = cite and r.runs_baselines
    data = {key: labelled(metrics, params) for key, metrics in data.items()}
    dataset = str(get(params, "data.dataset"))
    run_ids = next(d["runs"] for d in data.values() if d)
    departs = departures(params, columns, run_ids, classes)
    rerun = command([rid], runs, cite=cite)
    cited = cited_variants(params, rid) if cite else None
    if cited and not r.cites:  # no numbers of theirs to cite: left out
        r = replace(r, rows=tuple(row for row in r.rows if row not in cited))
    table = render.build(r, columns, data, dataset, rerun, departs, cited)
    markdown = table.markdown()
    if rid == "heads":
        markdown += "\n".join(render.heads_etas(r, columns, data)) + "\n"
    files = {
        f"{rid}.md": markdown.encode(),
        f"{rid}.csv": table.csv().encode(),
    }
    partial = not all(data.values())
    if not partial:
        from palpaper import figures  # matplotlib and SciPy: not for `--help`

        files |= figures.figure(r, columns, data)
    for name, blob in files.items():
        write_bytes_atomic(folder / name, blob)
    n, done = len(columns), sum(1 for d in data.values() if d)
    log.info(
        "%s: %s (%d of %d cell%s%s)",
        rid,
        folder / f"{rid}.md",
        done,
        n,
        "s" * (n != 1),
        "; no figure for a partial grid" if partial and r.figure else "",
    )
