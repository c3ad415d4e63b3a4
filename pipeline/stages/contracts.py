"""`pal contracts`: the output contracts' guard and their proof (DESIGN §2).

* `pal contracts stamp` is the dvc.yaml stage `contracts`, upstream of pixels,
  frozen, tune and extract: it stops `dvc repro` with one line when the code
  of a contracted stage differs from `contracts.lock` (features in the cache
  were made by other code), and writes each stage's and variant's stamp
  (`data/contracts/tune/pal.json`), which those stages depend on.
* `pal contracts verify` proves it: each unit whose code differs from the
  commit that set its version (or, for a version raised in the working tree,
  from HEAD) runs on the tiny fixture (`contract_runs`) with both versions of
  the code, outputs compared byte for byte. Equal outputs under an unchanged
  version, or different outputs under a raised one, are recorded in
  `contracts.lock`; anything else is one line naming the unit and what to do.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.outputs import write_bytes_atomic
from palcore.params import Source, section_value
from pipeline import contract_code as code
from pipeline import contracts as con
from pipeline.params import TuneParams
from pipeline.stages.contract_proof import Outcome, coverage_report, verify

log = logging.getLogger(__name__)


def write_stamps(params_file: str, out: Path) -> list[Path]:
    """The stamps of pixels and frozen, and of tune and extract per variant
    (each row of params' `ablation`), in `out`."""
    from palcore.paramsfile import read_params_file

    versions = con.read_versions()
    rows = read_params_file(params_file).get("ablation") or {}
    written = []
    for stage in con.STAGES:
        if stage not in con.METHOD_STAGES:
            written.append(out / f"{stage}.json")
            write_bytes_atomic(
                written[-1], con.stamp_bytes(con.stamp(stage, None, versions))
            )
            continue
        for variant in sorted(rows):
            source = Source(Path(params_file), variant=variant)
            enabled = section_value(source, "prompt", "enabled")
            method = section_value(source, "prompt", "method")
            record = con.stamp(
                stage, method if enabled is not False else None, versions
            )
            if stage == "tune" and (keys := tune_keys_set(source)):
                record["tune"] = keys
            written.append(out / stage / f"{variant}.json")
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
    shutil.rmtree(out_dir, ignore_errors=True)
    written = write_stamps(params_file, out_dir)
    log.info("contracts: %d stamps in %s", len(written), out_dir)


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
    work: str | None,
) -> None:
    """Prove changed code makes the same outputs; record it in contracts.lock.

    Each unit (a stage, or a stage's method: tune.pal) whose code differs from
    the commit that set its version runs on a tiny fixture (every method, the
    pixel cache on and off, a resumed tune, both real dataset layouts, a
    2-rank extract) with both versions of the code: equal outputs, byte for
    byte, or (a version raised in contracts.yaml) other ones, unless
    `reasons` says why not. Exit 1 with one line per failing unit.
    """
    known = set(con.read_versions().versions)
    unknown = sorted(set(units) - known)
    if unknown:
        raise con.ContractError(
            f"unknown unit {unknown[0]} (known: {', '.join(sorted(known))})"
        )
    cover = Path(tempfile.mkdtemp()) / ".coverage" if coverage_file else None
    work_dir = Path(work) if work else None
    every = everything or bool(coverage_file)
    outcome = verify(
        units=set(units) or None, everything=every, coverage=cover, work=work_dir
    )
    _report(outcome, cover, coverage_file)
    record = code.current_record(units=sorted(units) if units else None)
    code.write_record({**code.read_record(), **record} if units else record)
    click.echo(f"verified: {code.RECORD_FILE} records the code of every unit checked")


def _report(outcome: Outcome, cover: Path | None, coverage_file: str | None) -> None:
    """What `verify` compared and skipped, the coverage report; the failures
    as one error (a line each)."""
    for unit, names in sorted(outcome.ran.items()):
        click.echo(f"{unit}: compared on {len(names)} jobs ({', '.join(names)})")
    if outcome.skipped:
        same = ", ".join(sorted(set(outcome.skipped)))
        click.echo(f"code as at the commit of its version: {same}")
    if cover is not None:
        write_bytes_atomic(coverage_file, coverage_report(cover).encode())
        click.echo(f"coverage of each unit: {coverage_file}")
    if outcome.problems:
        raise con.ContractError("\n".join(outcome.problems))


def adoptable(params_file: str, lock: Path) -> list[tuple[str, Path, dict]]:
    """The contracted stages a lock file lists whose output folder is here:
    (stage name, output folder, the contract its stamp names)."""
    import shlex

    import yaml

    versions = con.read_versions()
    stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {})
    out = []
    for name, entry in stages.items():
        words = shlex.split(entry.get("cmd", ""))
        if words[:1] != ["pal"] or len(words) < 2 or words[1] not in con.STAGES:
            continue
        folder = Path(words[words.index("--out") + 1]) if "--out" in words else None
        if folder is None or not folder.is_dir():
            continue
        method = None
        if "--variant" in words:
            source = Source(
                Path(params_file), variant=words[words.index("--variant") + 1]
            )
            if section_value(source, "prompt", "enabled") is not False:
                method = section_value(source, "prompt", "method")
        out.append((name, folder, con.stamp(words[1], method, versions)))
    return out


@cli.command("adopt")
@params_option
@clean_errors
def adopt_cmd(params_file: str) -> None:
    """Move a workspace reproduced before contracts onto them.

    For a workspace whose `dvc status` was clean on the commit before output
    contracts (docs/USAGE.md, "Output contracts"): runs the `contracts`
    stage, writes contract.json (version 1: the code those outputs were
    made by) into each contracted output whose contract is still version 1
    and `dvc commit`s those stages of dvc.yaml, so their new keys (the
    stamps) are recorded against the outputs already there. An output whose
    contract was raised since is not adopted (other code would make other
    bytes): the next `dvc repro` makes it again, and the stages after it.
    """
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc"
    _run([dvc, "repro", "--single-item", "contracts"])
    lock = Path("dvc.lock")
    found = adoptable(params_file, lock) if lock.is_file() else []
    kept = [(n, f, r) for n, f, r in found if first_contract(r)]
    for _, folder, record in kept:
        write_bytes_atomic(folder / con.STAMP_NAME, con.stamp_bytes(record))
    names = [name for name, _, _ in kept]
    if names:
        _run([dvc, "commit", "--force", "--quiet", *names])
    line = f"dvc.yaml: {len(names)} stages adopted"
    if len(found) > len(kept):
        raised = sorted(
            {_contract_name(r) for _, _, r in found if not first_contract(r)}
        )
        line += (
            f"; {len(found) - len(kept)} rerun at the next dvc repro (their "
            f"contract was raised since: {', '.join(raised)})"
        )
    click.echo(line)


def first_contract(record: dict) -> bool:
    """Whether a stamp names version 1 of each unit: the contract of the code
    before contracts, the one an adopted output was made by."""
    return record["version"] == 1 and record.get("method_version") in (None, 1)


def _contract_name(record: dict) -> str:
    """`tune 2`, `tune.map 2`: the raised units of a stamp."""
    names = [f"{record['stage']} {record['version']}"] * (record["version"] != 1)
    if record.get("method_version") not in (None, 1):
        names.append(f"{record['stage']}.{record['method']} {record['method_version']}")
    return ", ".join(names)


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise con.ContractError(f"{' '.join(cmd[:3])}: {' '.join(tail)}")
