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

import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.outputs import write_bytes_atomic
from palcore.params import Source, section_value
from pipeline import contract_code as code
from pipeline import contracts as con

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
            written.append(out / stage / f"{variant}.json")
            write_bytes_atomic(written[-1], con.stamp_bytes(record))
    return written


# --- baselines: which code each unit's outputs are proven against ----------


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True
    )
    if done.returncode:
        raise con.ContractError(
            f"git {' '.join(args[:2])}: {done.stderr.strip() or 'failed'} "
            "(pal contracts verify needs the project's git history)"
        )
    return done.stdout


def _versions_at(root: Path, commit: str) -> dict[str, int]:
    try:
        text = _git(root, "show", f"{commit}:{con.VERSIONS_FILE}")
    except con.ContractError:
        return {}
    return con.parse_versions(text, f"{commit}:{con.VERSIONS_FILE}").versions


@dataclass(frozen=True)
class Check:
    """A comparison to make: `unit`'s outputs with the code of `old` (a
    commit) and `new` (a commit, or None: the working tree); `equal`: what
    its version says they must be."""

    unit: str
    old: str
    new: str | None
    equal: bool


def checks(root: Path = con.ROOT) -> list[Check]:
    """Per unit: equality with the commit that set its version (none when it
    was raised in the working tree), and, when it was raised, a difference
    from the code of the commit that set the version before."""
    now = con.read_versions(root).versions
    history = _git(root, "log", "--format=%H", "--", con.VERSIONS_FILE).split()
    held = [(c, _versions_at(root, c)) for c in history]  # newest first
    out = []
    for unit, version in sorted(now.items()):
        runs = _runs(unit, held)  # [(version, the commit that set it)], newest first
        if runs and runs[0][0] == version:
            out.append(Check(unit, runs[0][1], None, equal=True))
            runs = runs[1:]
            new = out[-1].old
        else:
            new = None  # raised in the working tree
        if runs:
            out.append(Check(unit, runs[0][1], new, equal=False))
    return out


def _runs(unit: str, held: list[tuple[str, dict[str, int]]]) -> list[tuple[int, str]]:
    """The versions `unit` had, newest first, each with the oldest commit of
    its run (the one that set it); stops where the unit was not yet there."""
    out: list[tuple[int, str]] = []
    for commit, versions in held:
        if unit not in versions:
            break
        if out and out[-1][0] == versions[unit]:
            out[-1] = (versions[unit], commit)
        else:
            out.append((versions[unit], commit))
    return out


def _tree(root: Path, commit: str | None, where: Path) -> Path:
    """The project's packages and params at `commit` (None: the working tree)."""
    if commit is None:
        return root
    where.mkdir(parents=True, exist_ok=True)
    paths = ["palcore", "pipeline", "solver", "params.yaml", con.VERSIONS_FILE]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", commit, *paths],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def _code_of(tree: Path, unit: str) -> dict[str, str]:
    files = code.unit_files(tree).get(unit, [])
    return {f: code.code_digest(tree / f) for f in files}


# --- verify: run the fixture with both versions, compare, record -----------


@dataclass
class Outcome:
    """What `verify` found: a line per unit that failed, per unit checked."""

    problems: list[str]
    ran: dict[str, list[str]]  # unit → the jobs that compared it
    skipped: list[str]  # units whose code equals their baseline's


def verify(
    root: Path = con.ROOT,
    units: set[str] | None = None,
    everything: bool = False,
    coverage: Path | None = None,
    work: Path | None = None,
) -> Outcome:
    """Make every check of `checks(root)` (for `units`, default all): on the
    fixture when the two versions' code differ (or, `everything`, always)."""
    from pipeline.stages import contract_runs as runs

    todo = [c for c in checks(root) if units is None or c.unit in units]
    outcome = Outcome([], {}, [])
    reasons = con.read_versions(root).reasons
    versions = con.read_versions(root).versions
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmp = Path(tmp)
        trees: dict[str | None, Path] = {None: root}
        groups: dict[tuple[str, str | None], list[Check]] = {}
        for check in todo:
            for commit in (check.old, check.new):
                if commit not in trees:
                    trees[commit] = _tree(root, commit, tmp / "trees" / commit)
            same = _code_of(trees[check.old], check.unit) == _code_of(
                trees[check.new], check.unit
            )
            if same and not (everything and check.equal):
                if check.equal:
                    outcome.skipped.append(check.unit)
                elif f"{check.unit}@{versions[check.unit]}" not in reasons:
                    outcome.problems.append(_raised_but_equal(check, versions))
                continue
            groups.setdefault((check.old, check.new), []).append(check)
        if groups:
            inputs = tmp / "inputs"
            runs.build_inputs(root, inputs)
        for n, ((old, new), group) in enumerate(sorted(groups.items(), key=str)):
            jobs = runs.selected(c.unit for c in group)
            newer = runs.Version(trees[new], tmp / f"run{n}" / "new")
            older = runs.Version(trees[old], tmp / f"run{n}" / "old")
            names = {j.name for j in jobs}
            needed = [j for j in runs.jobs() if j.name in names or _needed(j, jobs)]
            cover = coverage if (coverage is not None and new is None) else None
            runs.run_version(newer, needed, inputs, newer, cover)
            runs.run_version(older, jobs, inputs, newer, None)
            for check in group:
                mine = [j for j in jobs if check.unit in j.units]
                outcome.ran[check.unit] = [j.name for j in mine]
                diff = {
                    j.name: runs.differences(older.work / j.name, newer.work / j.name)
                    for j in mine
                }
                diff = {k: v for k, v in diff.items() if v}
                if check.equal and diff:
                    outcome.problems.append(_differs(check, diff))
                if not check.equal and not diff:
                    if f"{check.unit}@{versions[check.unit]}" not in reasons:
                        outcome.problems.append(_raised_but_equal(check, versions))
    return outcome


def _needed(job, selected) -> bool:
    return any(job.name in s.needs for s in selected)


def _where(commit: str | None) -> str:
    return "the working tree" if commit is None else commit[:10]


def _differs(check: Check, diff: dict[str, list[str]]) -> str:
    job, files = next(iter(diff.items()))
    return (
        f"{check.unit}: the outputs of {_where(check.new)} differ from "
        f"{_where(check.old)}'s ({job}: {', '.join(files[:3])}) under the same "
        f"contract: raise versions.{check.unit} in {con.VERSIONS_FILE}"
    )


def _raised_but_equal(check: Check, versions: dict[str, int]) -> str:
    key = f"{check.unit}@{versions[check.unit]}"
    return (
        f"{check.unit}: version raised to {versions[check.unit]} at "
        f"{_where(check.new)} but its outputs equal {_where(check.old)}'s byte for "
        f"byte: state why under reasons ('{key}: ...') in {con.VERSIONS_FILE}, "
        "or keep the version"
    )


def coverage_report(data: Path, root: Path = con.ROOT) -> str:
    """Per unit: the share of its code's statements the fixture reached, and
    the lines it did not reach, file by file."""
    import coverage

    cov = coverage.Coverage(data_file=str(data))
    cov.combine(strict=False)
    cov.load()
    lines = []
    for unit, files in sorted(code.unit_files(root).items()):
        total = reached = 0
        missed = []
        for rel in files:
            _, statements, _, missing, text = cov.analysis2(str(root / rel))
            total += len(statements)
            reached += len(statements) - len(missing)
            if missing:
                missed.append(f"    {rel}: {text}")
        share = 100.0 * reached / max(total, 1)
        lines.append(f"{unit}: {share:.1f} % of {total} statements reached")
        lines += missed
    return "\n".join(lines) + "\n"


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
    2-rank extract) with both versions of the code; the outputs must be equal
    byte for byte. A version raised in contracts.yaml must instead change
    them, or state why under `reasons`. Exit 1 with one line per failing unit.
    """
    known = set(con.read_versions().versions)
    unknown = sorted(set(units) - known)
    if unknown:
        raise con.ContractError(
            f"unknown unit {unknown[0]} (known: {', '.join(sorted(known))})"
        )
    cover = Path(tempfile.mkdtemp()) / ".coverage" if coverage_file else None
    outcome = verify(
        units=set(units) or None,
        everything=everything or bool(coverage_file),
        coverage=cover,
        work=Path(work) if work else None,
    )
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
    record = code.current_record(units=sorted(units) if units else None)
    if units:
        record = {**code.read_record(), **record}
    code.write_record(record)
    click.echo(f"verified: {code.RECORD_FILE} records the code of every unit checked")
