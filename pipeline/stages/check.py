"""`pal check`: the params file, paths, devices and data, checked before `dvc
repro`, so that the project's one-line messages come before DVC's.

Every problem is one line `FILE: problem`, all of them at once, and the exit
status is 1 when there is any. Checked:

- every section of the file (unknown sections and keys, with the nearest known
  name; types and ranges), each variant's changes and each pipeline's list;
- the keys DVC declares for the stages are present (a key missing from the
  file would stop `dvc repro` with DVC's own message);
- `data.root` and `model.backbone` exist (a folder, or a hub id in the local
  HF cache), unless the demo stage makes them;
- the backbone fits the prompt settings of every variant the main pipeline
  runs (its config.json: layers, hidden size against the pool size, text
  positions against `model.max_text_len`);
- `tune.device` and `extract.device` can run here;
- the dataset lists (its reader runs, no image is opened; its ids are
  unique and its texts valid Unicode, as `pal prepare` requires): classes and
  samples per split, and its classes split into `data.tasks` tasks.

`pal-paper run` runs the same checks (`check_all`) on each cell's params
before it queues anything.

Not a stage: nothing is written.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import params_option
from palcore.errors import PalError
from palcore.params import (
    ProtocolParams,
    Source,
    load_section,
)
from palcore.paramsfile import read_params_file
from palcore.variants import pipeline_variants
from pipeline.contract_code import guard_problem
from pipeline.params import (
    SECTIONS,
    DataParams,
    ExtractParams,
    ModelParams,
    PromptParams,
    TuneParams,
)
from pipeline.sections import KNOWN_SECTIONS, PARAM_CLASSES

KNOWN = list(KNOWN_SECTIONS)
DEMO_OUTPUTS = "data/demo"


def check_params(path: Path) -> list[str]:
    """Problems of the params file's sections, variants and pipelines."""
    raw = read_params_file(path)
    problems = []
    for section in raw:
        if section not in KNOWN:
            near = difflib.get_close_matches(section, KNOWN, n=1)
            hint = (
                f"did you mean '{near[0]}'?" if near else f"known: {', '.join(KNOWN)}"
            )
            problems.append(f"{path}: unknown section '{section}' ({hint})")
    sections = {k: c for k, c in PARAM_CLASSES.items() if k != "protocol"}
    for section, cls in sections.items():
        problems += _load(load_section, path, section, cls)
    problems += _load(load_section, path, "protocol", ProtocolParams)
    lists = raw.get("pipelines")
    for name in lists if isinstance(lists, dict) else {}:
        problems += _load(pipeline_variants, path, name)
    rows = raw.get("ablation")
    for variant in rows if isinstance(rows, dict) else {}:
        for section, cls in sections.items():  # each variant's changes
            problems += _load(load_section, Source(path, 0, variant), section, cls)
    return list(dict.fromkeys(problems))


def _load(fn, *args) -> list[str]:
    """[] when `fn(*args)` works, else its one-line error."""
    try:
        fn(*args)
    except PalError as exc:
        return [str(exc)]
    return []


def check_declared_keys(
    path: Path, pipeline_file: Path, seen: set[str] | None = None
) -> list[str]:
    """Keys the pipeline file declares as params that the params file lacks
    (each once: `seen` holds the keys already reported)."""
    seen = set() if seen is None else seen
    import yaml

    raw = read_params_file(path)
    spec = yaml.safe_load(pipeline_file.read_text()) or {}
    problems = []
    for stage in (spec.get("stages") or {}).values():
        body = stage.get("do", stage)
        for key in body.get("params", []) or []:
            if not isinstance(key, str) or "${" in key:
                continue  # per-variant keys: checked with the variants
            node = raw
            for part in key.split("."):
                if key in seen:
                    break
                if not isinstance(node, dict) or part not in node:
                    seen.add(key)
                    problems.append(
                        f"{path}: '{key}' is missing ({pipeline_file} declares it)"
                    )
                    break
                node = node[part]
    return list(dict.fromkeys(problems))


def check_paths(path: Path) -> list[str]:
    """data.root and model.backbone exist, unless the demo stage makes them."""
    problems = []
    data = load_section(path, "data", DataParams)
    model = load_section(path, "model", ModelParams)
    made = lambda p: Path(p).as_posix().startswith(DEMO_OUTPUTS)  # noqa: E731
    if not made(data.root) and not Path(data.root).is_dir():
        problems.append(f"{path}: data.root '{data.root}' is no folder")
    if not made(model.backbone):
        from pipeline.model.backbone import backbone_folder

        found = _load(backbone_folder, model.backbone)
        if not found and not Path(model.backbone).exists():
            name = model.backbone.rstrip("/").rsplit("/", 1)[-1]
            found = [
                f"model.backbone '{model.backbone}' is a hub id, and `dvc repro` "
                "needs a folder (the stages' dependency): run `pal backbone "
                f"{model.backbone} --link models/{name}` and set model.backbone: "
                f"models/{name}"
            ]
        problems += found
    return [p if p.startswith(str(path)) else f"{path}: {p}" for p in problems]


def check_devices(path: Path) -> list[str]:
    from pipeline.model.device import resolve_device

    problems = []
    for section in ("tune", "extract"):
        # SECTIONS maps both sections to a params class with a `device` field
        params: TuneParams | ExtractParams = load_section(
            path, section, SECTIONS[section]
        )
        problems += _load(resolve_device, params.device, f"{section}.device")
    return [f"{path}: {p}" for p in problems]


def check_cache(root: Path) -> list[str]:
    """DVC's cache must take the outputs: a read-only one is otherwise found
    only after a stage's work (and a GPU stage's hours)."""
    from palcore.recorded import cache_dir

    if not (root / ".dvc").is_dir():
        return []
    cache = cache_dir(root)
    where = cache if cache.exists() else cache.parent
    if where.is_dir() and os.access(where, os.W_OK | os.X_OK):
        return []
    return [
        f"DVC's cache {cache} is not writable: no stage's output could be kept "
        '(`dvc cache dir` chooses another; docs/USAGE.md, "Sharing the feature '
        'cache")'
    ]


def check_solve_memory(path: Path, memory_gib: float | None = None) -> list[str]:
    """The solve against the memory of the device solve.device resolves to
    here (`memory_gib`: another machine's, given by hand)."""
    from solver.api import SolveParams, check_memory, get_backend

    params = load_section(path, "solve", SolveParams)
    try:
        if memory_gib is not None:
            where, have = "the memory given (--solve-memory)", int(memory_gib * 2**30)
            gpu = params.device != "cpu"  # auto: the machine it runs on may have one
        else:  # quietly: the solve logs which backend it runs on, not the check
            quiet = logging.getLogger("solver.backend")
            level = quiet.level
            quiet.setLevel(logging.WARNING)
            try:
                backend = get_backend(params.device)
            finally:
                quiet.setLevel(level)
            (where, have), gpu = backend.memory(), backend.name == "cupy"
        check_memory(params, where, have, gpu)
    except PalError as exc:
        return [f"{path}: {exc}"]
    return []


def check_data(
    path: Path, listings: dict[Any, Any] | None = None
) -> tuple[list[str], str]:
    """The dataset's listing: problems (its reader's, and its classes against
    `data.tasks`), and a summary line. `listings` keeps each folder's listing
    for the next call (the cells of a grid share their dataset)."""
    from pipeline.data.datasets import read_dataset
    from pipeline.data.listing import check_unique_ids
    from pipeline.data.protocol import task_sizes

    data = load_section(path, "data", DataParams)
    if not Path(data.root).is_dir():  # check_paths names it, or the demo makes it
        return [], f"data: {data.dataset}, made by the demo stage"
    key = (data.dataset, str(data.root), data.text_field, data.label_count)
    listings = {} if listings is None else listings
    try:
        if key not in listings:
            listing = read_dataset(data)
            check_unique_ids(listing)  # and its texts valid Unicode, as prepare
            listings[key] = listing
        listing = listings[key]
        task_sizes(len(listing.classes), data.tasks, data.allow_uneven)
    except PalError as exc:
        return [f"{path}: {exc}"], ""
    problems = [f"{path}: {p}" for p in _empty_tasks(path, data, listing)]
    if problems:
        return problems, ""
    counts: dict[str, int] = {}
    for s in listing.samples:
        counts[s.split] = counts.get(s.split, 0) + 1
    splits = ", ".join(f"{n} {split}" for split, n in sorted(counts.items()))
    kind, problems = "classes", []
    if any(s.labels for s in listing.samples):
        mean = sum(len(s.labels) for s in listing.samples) / len(listing.samples)
        kind = f"labels (multi-label, {mean:.2f} a sample)"
        problems = _multi_label_solve(path, data.dataset)
    return problems, (
        f"data: {data.dataset}, {len(listing.classes)} {kind} in {data.tasks} "
        f"tasks; {splits}"
    )


def _multi_label_solve(path: Path, dataset: str) -> list[str]:
    """The solve's η rule and heads on a multi-label dataset: `solve` refuses
    `eta: auto` and `solve.heads` there (they score single-label rows)."""
    from solver.api import SolveParams

    solve = load_section(path, "solve", SolveParams)
    keys = ["solve.eta: auto"] * solve.is_auto + ["solve.heads"] * bool(solve.heads)
    return [
        f"{path}: {key}: data.dataset {dataset} is multi-label; the η rules "
        "and heads score single-label rows (a fixed solve.eta, or a list, fits it)"
        for key in keys
    ]


def _empty_tasks(path: Path, data: DataParams, listing: Any) -> list[str]:
    """A task with no training or no test sample in some run's class order
    (`pal prepare` refuses it too): one line per run."""
    from pipeline.data.listing import per_class
    from pipeline.data.protocol import (
        class_order,
        empty_task_line,
        empty_tasks,
        placing_class,
        task_sizes,
    )

    if data.per_class is not None:
        listing = per_class(listing, data.per_class)
    protocol = load_section(path, "protocol", ProtocolParams)
    lines = []
    for run in protocol.runs:
        seed = load_section(Source(path, run), "data", DataParams).class_order_seed
        order = class_order(listing.classes, seed)
        sizes = task_sizes(len(order), data.tasks, data.allow_uneven)
        label_of = {name: i for i, name in enumerate(order)}
        pairs = [
            (placing_class(s.labels, s.class_name, label_of), s.split)
            for s in listing.samples
        ]
        empty = empty_tasks(pairs, order, sizes)
        if empty:
            lines.append(f"run {run}: data: " + empty_task_line(*empty[0]))
    return lines


def check_backbone(path: Path) -> tuple[list[str], str]:
    """The backbone's config.json against the prompt settings of each variant
    the main pipeline runs: problems, and a summary line ('' when the demo
    makes the backbone or check_paths reports it missing)."""
    from pipeline.methods import method_class
    from pipeline.model.backbone import backbone_folder

    model = load_section(path, "model", ModelParams)
    data = load_section(path, "data", DataParams)
    try:
        config = json.loads(
            (backbone_folder(model.backbone) / "config.json").read_text()
        )
        depth, dim = int(config["num_hidden_layers"]), int(config["hidden_size"])
        positions = int(config.get("max_position_embeddings", 40))
    except (PalError, OSError, ValueError, KeyError, TypeError):
        return [], ""  # missing (check_paths says so) or not a ViLT (tune says why)
    found: dict[str, str] = {}  # problem -> the first variant that has it
    for variant in pipeline_variants(path, "main"):
        prompt = load_section(Source(path, 0, variant), "prompt", PromptParams)
        if prompt.enabled:
            check = method_class(prompt.method).check
            for p in _load(check, prompt, data.tasks, dim, depth):
                found.setdefault(p, variant)
    problems = [
        f"{path}: {'' if v == 'pal' else f'variant {v!r}: '}{p} "
        f"(model.backbone '{model.backbone}')"
        for p, v in found.items()
    ]
    text = f"text positions {positions}"
    if model.max_text_len > positions:  # the backbone stretches its table
        text += f", stretched to model.max_text_len {model.max_text_len}"
    summary = f"backbone: {model.backbone}, {depth} layers, hidden {dim}, {text}"
    return problems, summary


def check_all(
    path: Path,
    listings: dict[Any, Any] | None = None,
    memory_gib: float | None = None,
) -> tuple[list[str], list[str]]:
    """Every check of `pal check` on the params file at `path`, from the
    current folder (a project's root): (problems, summary lines)."""
    problems = check_params(path)
    loads = not problems
    guard = guard_problem()  # the cached features' code (DESIGN §2)
    problems += [f"contracts: {guard}"] if guard else []
    problems += check_cache(Path.cwd())
    summary: list[str] = []
    seen: set[str] = set()
    if Path("dvc.yaml").is_file():
        declared = check_declared_keys(path, Path("dvc.yaml"), seen)
        problems, loads = problems + declared, loads and not declared
    # the sections load: paths, devices and data can be read (a stale guard
    # or cache hides none of their problems)
    if loads:
        problems += check_paths(path) + check_devices(path)
        problems += check_solve_memory(path, memory_gib)
        data_problems, line = check_data(path, listings)
        backbone_problems, backbone_line = check_backbone(path)
        problems += data_problems + backbone_problems
        summary += [x for x in (line, backbone_line) if x]
    return problems, summary


@click.command("check")
@params_option
@click.option(
    "--solve-memory",
    "memory_gib",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="GIB",
    help="Check the solve against this much memory (the GiB of the machine "
    "or GPU it will run on) instead of this machine's.",
)
def cli(params_file: str, memory_gib: float | None) -> None:
    """Check the params, paths, devices and data before `dvc repro`.

    Also: the contracts' guard (the GPU stages' code), a task without training
    or test samples in any run, and the solve's memory against the device
    solve.device resolves to. Prints every problem as one line naming the
    file and key, and exits 1 if there is any; otherwise one summary line per
    check.
    """
    path = Path(params_file)
    try:
        problems, summary = check_all(path, memory_gib=memory_gib)
    except PalError as exc:  # the file itself is unreadable
        raise click.ClickException(str(exc)) from None
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    if problems:
        raise SystemExit(1)
    click.echo("\n".join([*summary, f"{path}: ready for dvc repro"]))
