"""The paper's results as grids of cells: which params each cell changes.

Each result lists its columns (the cells, in the paper's order; a cell is
one DVC experiment, `overrides.Cell`) and the rows it reads from each cell's
`results/<dataset>/metrics.json` (PAL, its BP head, the variants of
`ablation`). The values of a grid follow the dataset: the paper's for its
datasets, scaled ones for the 20-class, 4-layer demo. Table 3's one cell
runs the variants of `pipelines.main` and then those of
`pipelines.ablation`: the whole ablation, whose report (every variant's row)
is also kept in `results/<dataset>/ablation/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from palpaper.overrides import Cell, GridError, fmt_value, get, make_cell
from palpaper.packaged import published

RATES = (0.1, 0.3, 0.5, 0.7, 0.9)
TYPES = ("text", "image", "both")  # the paper's column order within a rate
STEP_RATES = (0.1, 0.5, 0.7)
MISSING_WORDS = {"text": "text missing", "image": "image missing", "both": "both"}


@dataclass(frozen=True)
class Column:
    """A column (or row) of a result's table: its label and its cell."""

    key: str
    label: str
    cell: Cell


@dataclass(frozen=True)
class Result:
    """One of the paper's results: what it is, its cells, the rows it reads."""

    id: str
    paper: str  # where it is in the paper
    title: str
    rows: tuple[str, ...]  # row keys of metrics.json, in table order
    variants: tuple[str, ...] | None  # pipelines.main for its cells; None: as is
    # its cells run pipelines.main, then these variants and pipelines.baselines
    # where main lacks them (Tables 1-2 need ACIL, the `frozen` variant, and PAL
    # whatever main a rehearsal committed)
    baselines: tuple[str, ...] | None = None
    # its cells run these pipelines' lists (pipelines.<name>) one after the
    # other as pipelines.main, in table order
    pipelines: tuple[str, ...] | None = None
    # a folder of results/<dataset>/ that gets its one cell's whole report
    report: str | None = None
    keeps_features: bool = False  # varies solve.* only: the analytic stages rerun
    figure: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    # with `--baselines cited` its rows of CITED are the paper's numbers
    # (a result that runs the baselines and does not cite leaves them out)
    cites: bool = False

    @property
    def runs_baselines(self) -> bool:
        """Whether its cells run the paper's prompt baselines (Tables 1-2 and
        the per-step figures): `--baselines cited` runs none of CITED's."""
        return self.baselines is not None

    def columns(
        self, params: Mapping[str, Any], runs: Sequence[int] | None, cite: bool = False
    ) -> list[Column]:
        """The result's columns in the paper's order, each with its cell;
        `cite`: the route `--baselines cited` (a result that runs the
        baselines runs none of the variants of CITED's rows)."""
        base: dict[str, Any] = {}
        if self.variants is not None:
            base["pipelines.main"] = list(self.variants)
        elif self.pipelines is not None:
            lists = [get(params, f"pipelines.{p}") for p in self.pipelines]
            base["pipelines.main"] = [v for names in lists for v in names]
        elif self.baselines is not None:
            main = list(get(params, "pipelines.main"))
            extra = (params.get("pipelines") or {}).get("baselines") or []
            for v in (*self.baselines, *extra):
                main += [v] if v not in main else []
            if cite:  # the route `--baselines cited`
                main = [v for v in main if v not in cited_variants(params, self.id)]
            base["pipelines.main"] = main
        if runs is not None:
            base["protocol.runs"] = list(runs)
        return [
            Column(key, label, make_cell(params, {**base, **changes}))
            for key, label, changes in _GRIDS[self.id](params)
        ]


# the methods Tables 1-2 compare PAL with, by the paper's names: `pal-paper
# run missing --baselines cited` takes their rows from the paper
# (published.yaml) and runs none of their variants
CITED = ("MAP", "MSP", "L2P", "DualPrompt", "RebQ")


def paper_of(params: Mapping[str, Any], variant: str, rid: str) -> str | None:
    """The paper's name of a variant's row in result `rid` (params
    `ablation.<variant>.paper`: one text, or result id -> text), or None."""
    row = (params.get("ablation") or {}).get(variant)
    paper = row.get("paper") if isinstance(row, Mapping) else None
    return paper.get(rid) if isinstance(paper, Mapping) else paper


def cited_variants(params: Mapping[str, Any], rid: str) -> dict[str, str]:
    """Variant -> the paper's name, for the params' rows that result `rid`
    names as one of CITED (the five compared methods of Tables 1-2)."""
    out = {}
    for variant in params.get("ablation") or {}:
        name = paper_of(params, variant, rid)
        if name in CITED:
            out[variant] = name
    return out


def check_cite(ids: Sequence[str], params: Mapping[str, Any]) -> None:
    """`--baselines cited` for results `ids` on these params: one of them
    runs the baselines, and Tables 1-2 have the paper's numbers for
    data.dataset; else one line."""
    if not any(RESULTS[rid].runs_baselines for rid in ids):
        raise GridError(
            f"--baselines cited: {', '.join(ids)} "
            f"{'runs' if len(ids) == 1 else 'run'} no baseline (missing, Tables "
            "1-2, and steps do)"
        )
    dataset = str(get(params, "data.dataset"))
    has = published()["missing"]
    if dataset not in has:
        raise GridError(
            f"--baselines cited: the paper has no numbers for data.dataset "
            f"'{dataset}' (Tables 1-2 give {' and '.join(has)}); nothing to "
            "cite: run the baselines (--baselines measured)"
        )


def _is_demo(params: Mapping[str, Any]) -> bool:
    return get(params, "data.dataset") == "demo"


def _missing(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (
            f"{t}-{rate:g}",
            f"{rate:.0%} {MISSING_WORDS[t]}",
            {"data.missing_type": t, "data.missing_rate": rate},
        )
        for rate in RATES
        for t in TYPES
    ]


def _steps(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (
            f"both-{rate:g}",
            f"missing rate {rate:g}",
            {"data.missing_type": "both", "data.missing_rate": rate},
        )
        for rate in STEP_RATES
    ]


def _base(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [("base", "the committed scenario", {})]


def _prompt(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    if _is_demo(params):  # the demo's ViLT has 4 layers; its pool 20, length 8
        layers = [[0], [3], [0, 1], [2, 3], [0, 1, 2, 3]]
        lengths = [2, 4, 8, 16]
        pools = [5, 10, 20, 40]
    else:  # ViLT-B/32, 12 layers; the paper: layers 0-7, length 8, pool 128
        layers = [
            list(range(0, 4)),
            list(range(4, 8)),
            list(range(0, 8)),
            list(range(4, 12)),
            list(range(0, 12)),
        ]
        lengths = [2, 4, 8, 16, 32]
        pools = [16, 32, 64, 128, 256]
    out: list[tuple[str, str, dict[str, Any]]] = []
    for v in layers:
        out.append(
            (f"layers-{fmt_value(v)}", f"layers {fmt_value(v)}", {"prompt.layers": v})
        )
    for n in lengths:
        out.append((f"length-{n}", f"length {n}", {"prompt.length": n}))
    for n in pools:
        out.append((f"pool-{n}", f"pool size {n}", {"prompt.pool_size": n}))
    return out


def _upsampling(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    # the paper's 8k / 15k / 20k around its 15k, scaled to the committed width:
    # the preset's 15000 gives the paper's widths, a rehearsal's 1024 (or the
    # demo's) widths a CPU solves in seconds
    width = int(get(params, "solve.width"))
    widths = {"8k": round(width * 8 / 15), "15k": width, "20k": round(width * 4 / 3)}
    pairs = [("8k", 1.0), ("15k", 1.0), ("15k", 0.5), ("15k", 0.1), ("20k", 1.0)]
    return [
        (
            f"{size}-{eta:g}",
            f"{widths[size]} ({size}), η {eta:g}",
            {"solve.width": widths[size], "solve.eta": eta},
        )
        for size, eta in pairs
    ]


# every head of solve.heads (solver.api.HEADS, checked by a test)
HEAD_NAMES = ("ridge", "ridge_all", "air", "dsal", "ncm", "lda")


def _heads(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every head at the committed η, and the ridge with each η rule."""
    eta = get(params, "solve.eta")
    return [
        ("fixed", f"η {fmt_value(eta)}", {"solve.heads": list(HEAD_NAMES)}),
        (
            "auto",
            "η auto (ridge: the current task's rule)",
            {"solve.heads": ["ridge", "ridge_all"], "solve.eta": "auto"},
        ),
    ]


def _tasks(params: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    dataset = get(params, "data.dataset")
    ks = {"demo": [2, 5, 10, 20], "n24news": [3, 6, 12, 24]}.get(
        dataset, [5, 10, 20, 50]
    )
    return [(f"K-{k}", f"K = {k}", {"data.tasks": k}) for k in ks]


# Tables 1-2's methods in the paper's order (the prompt baselines, ACIL as the
# `frozen` variant, PAL), then PAL's BP head and the never-trained prompts
PAPER_ROWS = ("map", "msp", "l2p", "dualprompt", "rebq", "frozen", "pal", "bp", "init")

_GRIDS = {
    "missing": _missing,
    "steps": _steps,
    "ablation": _base,
    "prompt": _prompt,
    "upsampling": _upsampling,
    "tasks": _tasks,
    "stability": _base,
    "heads": _heads,
}

RESULTS = {
    r.id: r
    for r in (
        Result(
            "missing",
            "Tables 1-2",
            "Acc and FG (%) under 15 missing-modality scenarios, missing in "
            "training and test",
            rows=PAPER_ROWS,
            variants=None,
            baselines=("pal", "frozen"),
            cites=True,
        ),
        Result(
            "steps",
            "Figures (accuracy at each step)",
            "Accuracy (%) over the seen tasks after each step, both modalities "
            "missing at rate 0.1, 0.5 and 0.7",
            rows=PAPER_ROWS,
            variants=None,
            baselines=("pal", "frozen"),
            figure=True,
        ),
        Result(
            "ablation",
            "Table 3",
            "Ablation of the prompt module",
            rows=("pal", "frozen", "bp", "shared", "vector"),
            variants=None,
            pipelines=("main", "ablation"),
            report="ablation",
        ),
        Result(
            "prompt",
            "Figures (prompt layers, pool size, prompt length)",
            "PAL's Acc and FG (%) against the prompt layers, length and pool size",
            rows=("pal",),
            variants=("pal",),
            figure=True,
        ),
        Result(
            "upsampling",
            "Table 4",
            "Up-sampling width and regularisation η",
            rows=("pal",),
            variants=None,
            keeps_features=True,
        ),
        Result(
            "tasks",
            "Table 5",
            "Acc and FG (%) against the number of steps K",
            rows=("pal",),
            variants=("pal",),
        ),
        Result(
            "stability",
            "Figure (stability and plasticity)",
            "Accuracy (%) after the last step on the first task's classes "
            "(stability) and on the later tasks' (plasticity), with and without "
            "the AL module",
            rows=("pal", "bp"),
            variants=None,
            figure=True,
        ),
        Result(
            "heads",
            "beyond the paper",
            "Acc, FG, Last and AIA (%) of each closed-form head of solve.heads on "
            "the same cached features",
            rows=("pal", "init", "frozen"),
            variants=None,
            keeps_features=True,
        ),
    )
}


def result(name: str) -> Result:
    try:
        return RESULTS[name]
    except KeyError:
        raise GridError(
            f"no result '{name}'; the results: {', '.join(RESULTS)}"
        ) from None
