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
- `tune.device` and `extract.device` can run here;
- the dataset lists (its reader runs, no image is opened): classes and
  samples per split.

Not a stage: nothing is written.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from palcore.cliutil import params_option
from palcore.errors import PalError
from palcore.params import (
    ProtocolParams,
    Source,
    load_section,
    pipeline_variants,
    read_params_file,
)
from pipeline.params import SECTIONS, DataParams, ModelParams

# every section a params file may hold
KNOWN = [*SECTIONS, "solve", "evaluate", "protocol", "ablation", "pipelines"]
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
    from solver.params import EvaluateParams, SolveParams

    sections = {**SECTIONS, "solve": SolveParams, "evaluate": EvaluateParams}
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
        from pipeline.backbone import backbone_folder

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
    from pipeline.backbone import resolve_device

    problems = []
    for section in ("tune", "extract"):
        device = load_section(path, section, SECTIONS[section]).device
        problems += _load(resolve_device, device, f"{section}.device")
    return [f"{path}: {p}" for p in problems]


def check_data(path: Path) -> tuple[list[str], str]:
    """The dataset's listing: problems, and a summary line."""
    from pipeline.datasets import read_dataset

    data = load_section(path, "data", DataParams)
    if not Path(data.root).is_dir():  # check_paths names it, or the demo makes it
        return [], f"data: {data.dataset}, made by the demo stage"
    try:
        listing = read_dataset(data)
    except PalError as exc:
        return [f"{path}: {exc}"], ""
    counts: dict[str, int] = {}
    for s in listing.samples:
        counts[s.split] = counts.get(s.split, 0) + 1
    splits = ", ".join(f"{n} {split}" for split, n in sorted(counts.items()))
    return [], f"data: {data.dataset}, {len(listing.classes)} classes; {splits}"


@click.command("check")
@params_option
def cli(params_file: str) -> None:
    """Check the params, paths, devices and data before `dvc repro`.

    Prints every problem as one line naming the file and key, and exits 1 if
    there is any; otherwise one summary line per check.
    """
    path = Path(params_file)
    try:
        problems = check_params(path)
    except PalError as exc:  # the file itself is unreadable
        raise click.ClickException(str(exc)) from None
    summary, seen = [], set()
    for pipeline_file in (Path("dvc.yaml"), Path("ablation/dvc.yaml")):
        if pipeline_file.is_file():
            problems += check_declared_keys(path, pipeline_file, seen)
    if not problems:  # the sections load: paths, devices and data can be read
        problems += check_paths(path) + check_devices(path)
        data_problems, line = check_data(path)
        problems += data_problems
        summary.append(line)
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    if problems:
        raise SystemExit(1)
    click.echo("\n".join([*summary, f"{path}: ready for dvc repro"]))
