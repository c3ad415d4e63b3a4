"""The proof of an output contract (DESIGN §2): which code each unit's
outputs are compared against, and the comparison.

A unit's outputs must be the same (`pipeline.sameness`: exact values equal,
floats within `RTOL` of their scale, on any CPU kind) as those of the code of
the commit that set its version (`checks`); a version raised (at a commit, or in the
working tree) must instead change them, unless `reasons` in contracts.yaml
says why not. `verify` runs the fixture (`contract_runs`) with both
versions of the code where they differ, and `coverage_report` says which
lines of each unit the fixture reached.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import contract_code as code
from pipeline import contracts as con

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
    """Per unit: equality with the code its outputs' contract was set by (none
    when its version was raised in the working tree), and, when it was
    raised, a difference from the code of the commit that set the version
    before.

    A method's outputs (`tune.pal`'s) hold its stage's version too (`tune`),
    so their contract was set by the newer of the two commits that set them:
    after `tune` is raised, `tune.pal`'s code is held to the raise's commit,
    not to the older one that set `tune.pal` (between those two every job of
    `tune.pal` had its contract changed, and none would judge it)."""
    now = con.read_versions(root).versions
    history = _git(root, "log", "--format=%H", "--", con.VERSIONS_FILE).split()
    held = [(c, _versions_at(root, c)) for c in history]  # newest first
    runs = {unit: _runs(unit, held) for unit in now}  # newest first
    set_by = {u: r[0][1] for u, r in runs.items() if r and r[0][0] == now[u]}
    out = []
    for unit in sorted(now):
        earlier, stage = runs[unit], set_by.get(unit.split(".")[0])
        if unit in set_by:
            out.append(Check(unit, _newer(history, set_by[unit], stage), None, True))
            earlier = earlier[1:]
            new = set_by[unit]
        else:
            new = None  # raised in the working tree
        if earlier:  # the stage's version counts where it was set before `new`
            before = stage if new is None or _older(history, stage, new) else None
            out.append(Check(unit, _newer(history, earlier[0][1], before), new, False))
    return out


def _older(history: list[str], a: str | None, b: str) -> bool:
    """Whether commit `a` comes before commit `b` (`history`: newest first)."""
    return a is not None and history.index(a) > history.index(b)


def _newer(history: list[str], a: str, b: str | None) -> str:
    """The later of commits `a` and `b` (None: `a`)."""
    return a if b is None or not _older(history, a, b) else b


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


def archive_tree(root: Path, commit: str | None, where: Path) -> Path:
    """The project's packages and params at `commit` (None: the working tree),
    archived from git into `where` (bench/gpu_check.py's `--baseline COMMIT` too)."""
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
    fixture when the two versions' code differ (or, `everything`, always);
    `coverage`: a coverage.py data file for the working tree's runs."""
    from pipeline.stages import contract_runs as runs

    todo = [c for c in checks(root) if units is None or c.unit in units]
    outcome = Outcome([], {}, [])
    versions = con.read_versions(root)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        trees: dict[str | None, Path] = {None: root}
        groups: dict[tuple[str, str | None], list[Check]] = {}
        for check in todo:
            for commit in (check.old, check.new):
                if commit not in trees:
                    trees[commit] = archive_tree(
                        root, commit, Path(tmp) / "trees" / commit
                    )
            if _code_of(trees[check.old], check.unit) != _code_of(
                trees[check.new], check.unit
            ) or (everything and check.equal):
                groups.setdefault((check.old, check.new), []).append(check)
            elif check.equal:
                outcome.skipped.append(check.unit)
            elif not _reason(check, versions):
                outcome.problems.append(_raised_but_equal(check, versions))
        if groups:
            runs.build_inputs(root, Path(tmp) / "inputs")
        for n, ((old, new), group) in enumerate(sorted(groups.items(), key=str)):
            older = runs.Version(trees[old], Path(tmp) / f"run{n}" / "old")
            newer = runs.Version(trees[new], Path(tmp) / f"run{n}" / "new")
            cover = coverage if new is None else None
            raised = raised_units(_versions_at(root, old), _versions_of(root, new))
            _compare(group, older, newer, Path(tmp) / "inputs", cover, outcome, raised)
    return outcome


def _versions_of(root: Path, commit: str | None) -> dict[str, int]:
    """The versions at `commit` (None: the working tree's contracts.yaml)."""
    if commit is None:
        return con.read_versions(root).versions
    return _versions_at(root, commit)


def raised_units(old: dict[str, int], new: dict[str, int]) -> set[str]:
    """The units whose version differs between two contracts.yaml's."""
    return {u for u in new if old.get(u) != new[u]}


def judged_by(check: Check, jobs: list[Any], raised: set[str]) -> list[Any]:
    """The jobs whose outputs judge `check`: those of its unit. A check that
    its outputs are equal leaves out a job that also depends on a unit raised
    between the two versions (`tune/map` for `tune` when `tune.map` was
    raised): that job's contract, the versions of all its units, changed, so
    its outputs are made again whatever moved them."""
    mine = [j for j in jobs if check.unit in j.units]
    if not check.equal:
        return mine
    return [j for j in mine if not (j.units - {check.unit}) & raised]


def _compare(
    group: list[Check],
    older: Any,
    newer: Any,
    inputs: Path,
    cover: Path | None,
    outcome: Outcome,
    raised: set[str],
) -> None:
    """Run the jobs of the checks in `group` with both versions and judge
    each check by the differences of its jobs' outputs (`judged_by`; `raised`:
    the units whose version differs between the two)."""
    from pipeline.stages import contract_runs as runs

    jobs = runs.selected(c.unit for c in group)
    needed = {n for j in jobs for n in j.needs}
    inputs_too = [j for j in runs.jobs() if j in jobs or j.name in needed]
    runs.run_version(newer, inputs_too, inputs, newer, cover)
    # a job of a variant the older tree's params lack runs with the newer code only
    older_jobs = runs.runnable(jobs, runs.variants_of(older.code))
    runs.run_version(older, older_jobs, inputs, newer, None, keep_going=True)
    versions = con.read_versions()
    for check in group:
        mine = [j for j in judged_by(check, jobs, raised) if j in older_jobs]
        ran = outcome.ran.setdefault(check.unit, [])  # over its checks (old, new)
        ran += [j.name for j in mine if j.name not in ran]
        diff = {
            j.name: runs.differences(older.work / j.name, newer.work / j.name)
            for j in mine
        }
        diff = {k: v for k, v in diff.items() if v}
        if check.equal and diff:
            outcome.problems.append(_differs(check, diff))
        if not check.equal and not diff and not _reason(check, versions):
            outcome.problems.append(_raised_but_equal(check, versions))


def _reason(check: Check, versions: con.Versions) -> str | None:
    """The stated reason of a raise whose outputs are identical, if any."""
    return versions.reasons.get(f"{check.unit}@{versions.of(check.unit)}")


def _where(commit: str | None) -> str:
    return "the working tree" if commit is None else commit[:10]


def _differs(check: Check, diff: dict[str, list[str]]) -> str:
    job, files = next(iter(diff.items()))
    return (
        f"{check.unit}: the outputs of {_where(check.new)} differ from "
        f"{_where(check.old)}'s ({job}: {', '.join(files[:3])}) under the same "
        f"contract: raise versions.{check.unit} in {con.VERSIONS_FILE}"
    )


def _raised_but_equal(check: Check, versions: con.Versions) -> str:
    version = versions.of(check.unit)
    key = f"{check.unit}@{version}"
    return (
        f"{check.unit}: version raised to {version} at "
        f"{_where(check.new)} but its outputs are the same as "
        f"{_where(check.old)}'s: state why under reasons ('{key}: ...') in "
        f"{con.VERSIONS_FILE}, or keep the version"
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
