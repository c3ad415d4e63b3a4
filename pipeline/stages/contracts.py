"""`pal contracts`: the output contracts' guard (`stamp`, the dvc.yaml stage
`contracts`), the raise of a unit's version (`raise`) and the proof
(`verify`, through `contract_proof`); DESIGN §2."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.outputs import write_bytes_atomic
from palcore.params import Source, section_value
from pipeline import contract_code as code
from pipeline import contracts as con
from pipeline.params import TuneParams
from pipeline.stages.contract_proof import Outcome, verify

log = logging.getLogger(__name__)


def write_stamps(params_file: str, out: Path, root: Path = con.ROOT) -> list[Path]:
    """The stamps of pixels and frozen, and of tune and extract per variant
    (each row of params' `ablation`), in `out`. A unit whose version was set
    by a raise adds the digest of the code that makes it (`code.made_by`):
    while the raise is unproven, each edit of that code makes its outputs
    again."""
    from palcore.paramsfile import read_params_file

    versions = con.read_versions(root)
    rows = read_params_file(params_file).get("ablation") or {}
    made_by = code.made_by(root)
    written = []
    for stage in con.STAGES:
        variants = sorted(rows) if stage in con.METHOD_STAGES else [None]
        for variant in variants:
            record = con.stamp(stage, None, versions)  # pixels, frozen
            if variant is None and (keys := data_keys_set(Source(Path(params_file)))):
                record["data"] = keys  # the listing's keys newer than stamps
            if variant is not None:
                source = Source(Path(params_file), variant=variant)
                enabled = section_value(source, "prompt", "enabled")
                method = section_value(source, "prompt", "method")
                method = method if enabled is not False else None
                if method is not None and method not in code.method_names(root):
                    raise con.ContractError(
                        f"ablation.{variant}: prompt.method '{method}' is no method "
                        f"(known: {', '.join(code.method_names(root))}); `pal check` "
                        "names every such key"
                    )
                record = con.stamp(stage, method, versions)
                if stage == "tune" and (keys := tune_keys_set(source)):
                    record["tune"] = keys
            method = record.get("method")
            units = [stage, f"{stage}.{method}"] if method else [stage]
            if drafts := {u: made_by[u] for u in units if u in made_by}:
                record["code"] = drafts
            name = f"{stage}.json" if variant is None else f"{stage}/{variant}.json"
            written.append(out / name)
            write_bytes_atomic(written[-1], con.stamp_bytes(record))
    return written


def tune_keys_set(source: Source) -> dict[str, Any]:
    """The tune keys added after tunings were first recorded
    (`palcore.params.RECORDED_IF_SET`) that the variant of `source` sets to
    other than their default. The tune stage is keyed on them through its
    stamp, not its params: declared by tune, they would be new params to the
    dvc.lock of every workspace made before them, and DVC would rerun every
    tuning there with the same bytes. Unset, the stamp keeps its bytes."""
    values = {
        "decay": section_value(source, "tune", "decay"),
        "beta2": section_value(source, "tune", "beta2"),
        "clip_norm": section_value(source, "tune", "clip_norm"),
    }
    defaults = {f.name: f.default for f in dataclasses.fields(TuneParams)}
    return {k: v for k, v in values.items() if v != defaults[k]}


def data_keys_set(source: Source) -> dict[str, Any]:
    """The data keys added after the listing stages' outputs were first
    recorded (`palcore.params.RECORDED_IF_SET`) that `source` sets: pixels
    and frozen are keyed on them through their stamps, as tune is on
    `tune_keys_set`. Unset, the stamps keep their bytes."""
    values = {"label_count": section_value(source, "data", "label_count")}
    return {k: v for k, v in values.items() if v is not None}


def former_stamps(out: Path) -> list[Path]:
    """The stamps a former `stamp` left in `out` (`<stage>.json`, and
    `<stage>/<variant>.json` for tune and extract). Anything else there is
    not the project's to delete: a ContractError naming it, nothing touched."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise con.ContractError(f"{out}: not a folder (--out names the stamps' folder)")
    stamps, others = [], []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).parts
        if path.is_dir():
            if len(rel) > 1 or rel[0] not in con.METHOD_STAGES:
                others.append(path)
        elif path.suffix == ".json" and (
            (len(rel) == 1 and path.stem in con.STAGES)
            or (len(rel) == 2 and rel[0] in con.METHOD_STAGES)
        ):
            stamps.append(path)
        else:
            others.append(path)
    if others:
        raise con.ContractError(
            f"{out}: holds {others[0].relative_to(out)} and {len(others) - 1} more "
            "that are not contract stamps; nothing was deleted: --out names the "
            "stamps' own folder (default data/contracts)"
        )
    return stamps


# --- the commands -------------------------------------------------------------


@click.group("contracts")
def cli() -> None:
    """The output contracts of pixels, frozen, tune and extract (DESIGN §2).

    Those stages are keyed on their data, params and contract versions
    (contracts.yaml), not on their code's bytes: `verify` proves that changed
    code makes the same outputs, `stamp` (a dvc.yaml stage) refuses code that
    was not proven.
    """


@cli.command("stamp")
@params_option
@folder_option("out", "data/contracts", "Output folder for the stamps.")
@clean_errors
def stamp_cmd(params_file: str, out: str) -> None:
    """Check the code against contracts.lock, then write the stamps.

    One line and exit 1 when a contracted stage's code differs from what its
    contract was verified with; else one stamp per stage and variant (the
    rows of params' `ablation`): the contract versions its output is made
    under. Reads params prompt.method, prompt.enabled and ablation.
    """
    problem = code.guard_problem()
    if problem:
        raise con.ContractError(problem)
    out_dir = Path(out)
    former = former_stamps(out_dir)
    written = write_stamps(params_file, out_dir)
    for path in set(former) - set(written):  # a variant's row gone from params
        path.unlink()
    log.info("contracts: %d stamps in %s", len(written), out_dir)


@cli.command("raise")
@click.argument("units", nargs=-1, required=True, metavar="UNIT...")
@clean_errors
def raise_cmd(units: tuple[str, ...]) -> None:
    """Raise UNITs' versions in contracts.yaml: their outputs are made again.

    For an edit meant to change outputs (the guard's line names the units):
    each UNIT goes to one above contracts.lock's version, once however
    often it is raised before the proof. `dvc repro` then remakes their
    outputs with no proof run, and again after each further edit of their
    code; the proof (`pal contracts verify`, and the test suite) runs once
    the change is committed. A new method's units (`tune.toy extract.toy`)
    are added to contracts.yaml at 1.
    """
    path = con.ROOT / con.VERSIONS_FILE
    known = con.read_versions(con.ROOT).versions
    methods = code.method_names(con.ROOT)
    new = {f"{s}.{m}" for s in con.METHOD_STAGES for m in methods} - set(known)
    unknown = [u for u in units if u not in known and u not in new]
    if unknown:
        raise con.ContractError(
            f"unknown unit {unknown[0]} (known: {', '.join(sorted({*known, *new}))})"
        )
    record = code.read_record(con.ROOT)
    text = path.read_text(encoding="utf-8")
    for unit in units:
        target = record.get(unit, {}).get("version", 0) + 1
        if unit not in known:  # a new method's
            text = con.add_version(text, unit, target)
            click.echo(f"{unit}: new, {target}")
            known[unit] = target
            continue
        if known[unit] >= target:
            click.echo(f"{unit}: already {known[unit]}, above contracts.lock's")
            continue
        line = re.compile(rf"^(\s+{re.escape(unit)}:\s*){known[unit]}\b", re.M)
        text, n = line.subn(rf"\g<1>{target}", text, count=1)
        if n != 1:
            raise con.ContractError(f"{path}: no line '{unit}: {known[unit]}'")
        click.echo(f"{unit}: {known[unit]} -> {target}")
        known[unit] = target
    con.parse_versions(text, str(path))
    write_bytes_atomic(path, text.encode())


@cli.command("verify")
@click.option(
    "--unit",
    "units",
    multiple=True,
    metavar="UNIT",
    help="Check only UNIT (e.g. tune.pal); repeatable. Default: all.",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Run the fixture for every unit, changed or not.",
)
@click.option(
    "--coverage",
    "coverage_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the fixture's coverage of each unit here "
    "(the lines it does not reach, file by file).",
)
@click.option(
    "--new-inputs",
    is_flag=True,
    help="Record every job's reference anew: after a change of the fixture's "
    "inputs (the demo, prepare, the fake trees), with the code as "
    "contracts.lock records it.",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for the fixture's temporary files (default: the system's).",
)
@clean_errors
def verify_cmd(
    units: tuple[str, ...],
    everything: bool,
    coverage_file: str | None,
    new_inputs: bool,
    work: str | None,
) -> None:
    """Prove changed code makes the same outputs; record it in contracts.lock.

    The jobs of each unit (a stage, or a stage's method: tune.pal) whose code
    or version moved run on a tiny fixture (every method, the pixel cache on
    and off, a resumed tune, the Food101, N24News and files layouts, a
    2-rank extract), about a minute for all of them on 2 cores. Each job's
    outputs are compared with its reference (reference/, recorded when its
    units' versions were set): the same (exact values equal, floats within
    pipeline.sameness.RTOL), or, for a version raised in contracts.yaml,
    other ones unless `reasons` says why not; then the raised jobs are
    recorded anew. Exit 1 with one line per failure.
    """
    known = set(con.read_versions().versions)
    unknown = sorted(set(units) - known)
    if unknown:
        raise con.ContractError(
            f"unknown unit {unknown[0]} (known: {', '.join(sorted(known))})"
        )
    try:
        outcome = verify(
            units=set(units) or None,
            everything=everything or bool(coverage_file),
            coverage=Path(coverage_file) if coverage_file else None,
            work=Path(work) if work else None,
            new_inputs=new_inputs,
        )
    except KeyboardInterrupt:
        raise con.ContractError(
            f"interrupted: nothing recorded, {code.RECORD_FILE} unchanged and "
            "the fixture's temporary files removed; rerun `pal contracts verify`"
        ) from None
    _report(outcome, coverage_file)
    record = code.current_record(units=sorted(units) if units else None)
    code.write_record({**code.read_record(), **record} if units else record)
    click.echo(f"verified: {code.RECORD_FILE} records the code of every unit checked")


def _report(outcome: Outcome, coverage_file: str | None) -> None:
    """What `verify` ran and recorded, the coverage report; the failures as
    one error (a line each)."""
    judged = [n for n in outcome.ran if n not in outcome.recorded]
    recorded = [] if outcome.problems else outcome.recorded
    for title, names in (
        ("compared with their reference", judged),
        ("recorded anew", recorded),
    ):
        if names:
            click.echo(f"{title}: {len(names)} jobs ({', '.join(names)})")
    if not outcome.ran:
        click.echo("nothing to run: no unit's code or version moved (--all: every job)")
    if coverage_file and outcome.ran:
        click.echo(f"coverage of each unit: {coverage_file}")
    if outcome.problems:
        raise con.ContractError("\n".join(outcome.problems))
