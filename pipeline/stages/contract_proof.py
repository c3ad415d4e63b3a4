"""The proof of an output contract (DESIGN §2): the fixture's outputs against
those recorded when each unit's version was set.

`reference/` holds, per job of the fixture (`contract_runs`), the leaves of
its outputs (`pipeline.sameness`: floats whole, exact values as digests) in
`<job>.npz`, and in `index.json` the versions of the units its outputs depend
on; `vilt.safetensors` is the tiny ViLT's weights that every run reads, so
the inputs are the same floats on every machine. `verify` runs the fixture
once, with the working tree's code:

* a job made under its recorded contract (every version as recorded) must
  make the same outputs as its reference, however many refactors came since:
  drift stays bounded by the rule, never summed over steps;
* a unit raised since its jobs were recorded must make other outputs on at
  least one of them, unless `reasons` in contracts.yaml says why not;
* the jobs whose contract moved (and new jobs) are then recorded anew.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from palcore.outputs import write_bytes_atomic
from pipeline import contract_code as code
from pipeline import contracts as con
from pipeline.sameness import Leaves, compare_leaves, folder_leaves
from pipeline.stages import contract_runs as runs

REFERENCE = "reference"  # under the project's root
INDEX = "index.json"
WEIGHTS = "vilt.safetensors"
EXACT = "__exact__"  # the .npz entry holding the exact leaves' digests
RECORD_HINT = "`pal contracts verify` records it; commit reference/ and contracts.lock"


def read_index(root: Path = con.ROOT) -> dict[str, Any]:
    """reference/index.json: {"jobs": {job: {unit: version}}}."""
    path = root / REFERENCE / INDEX
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = None
    if not isinstance(index, dict) or not isinstance(index.get("jobs"), dict):
        why = "damaged" if path.is_file() else "not found"
        raise con.ContractError(f"{path}: {why}; `git checkout {REFERENCE}`")
    return index


def reference_leaves(job: str, root: Path = con.ROOT) -> Leaves:
    """The recorded leaves of `job`'s outputs."""
    path = root / REFERENCE / f"{job}.npz"
    try:
        with np.load(path) as held:
            flat: dict[str, Any] = {k: held[k] for k in held.files if k != EXACT}
            flat |= json.loads(str(held[EXACT]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise con.ContractError(
            f"{path}: unreadable ({err}); `git checkout` it"
        ) from None
    out: Leaves = {}
    for name, leaf in flat.items():
        file, _, key = name.partition(":")
        out.setdefault(file, {})[key] = leaf
    return out


def write_leaves(path: Path, leaves: Leaves) -> None:
    """`leaves` as an .npz of the same bytes for the same leaves (entries in
    order, no timestamps): floats as arrays, the digests as one JSON entry."""
    floats: dict[str, np.ndarray] = {}
    exact: dict[str, str] = {}
    for file, keys in leaves.items():
        for key, leaf in keys.items():
            if isinstance(leaf, np.ndarray):
                floats[f"{file}:{key}"] = leaf
            else:
                exact[f"{file}:{key}"] = leaf
    floats[EXACT] = np.array(json.dumps(exact, sort_keys=True))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(floats):
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(entry, "w") as f:
                np.lib.format.write_array(f, floats[name])
    write_bytes_atomic(path, buffer.getvalue())


# --- verify: run the fixture once, judge each job against its reference -------


@dataclass
class Outcome:
    """What `verify` found: a line per failure, the jobs judged, the jobs
    whose reference is recorded anew (or would be, when not recording)."""

    problems: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    recorded: list[str] = field(default_factory=list)


def verify(
    root: Path = con.ROOT,
    units: set[str] | None = None,
    everything: bool = False,
    coverage: Path | None = None,
    work: Path | None = None,
    record: bool = True,
    new_inputs: bool = False,
) -> Outcome:
    """Run the fixture's jobs that `units` (default: those whose code or
    version moved; `everything`: all) reach, and judge each against its
    reference; with `record` and no problem, record the jobs whose contract
    moved. `new_inputs`: the inputs changed (the demo, prepare, the fake
    trees, a library), so every job is recorded anew, with the code as
    contracts.lock records it. `coverage`: where to write which lines of
    each unit the runs reached (`coverage_report`)."""
    proof, outcome = _Proof(root), Outcome()
    if new_inputs and proof.moved:
        outcome.problems.append(
            f"--new-inputs records every job anew, so it takes the code as "
            f"{con.RECORD_FILE} records it: {', '.join(sorted(proof.moved))} "
            "moved; prove or raise them first"
        )
        return outcome
    todo = proof.todo(units, everything or new_inputs)
    if not todo:
        return outcome
    weights = root / REFERENCE / WEIGHTS
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        inputs, out = Path(tmp) / "inputs", runs.Version(root, Path(tmp) / "out")
        runs.build_inputs(root, inputs, None if new_inputs else weights)
        cover = Path(tmp) / ".coverage" if coverage else None
        runs.run_version(out, runs.with_needs(todo), inputs, cover=cover)
        if coverage is not None and cover is not None:
            write_bytes_atomic(coverage, coverage_report(cover, root).encode())
        proof.judge(todo, out.work, outcome)
        if not record:
            outcome.problems += [proof.unrecorded(n) for n in outcome.recorded]
        elif not outcome.problems:
            if new_inputs:
                shutil.copyfile(inputs / runs.VILT_WEIGHTS, weights)
            proof.record(outcome.recorded, out.work)
    return outcome


@dataclass
class _Proof:
    """The record a proof judges by: the reference's index, the versions in
    contracts.yaml, the units whose code moved from contracts.lock."""

    root: Path
    index: dict[str, Any] = field(init=False)
    versions: con.Versions = field(init=False)
    moved: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.index = read_index(self.root)
        self.versions = con.read_versions(self.root)
        self.moved = set(code.changed_units(self.root))

    def contract(self, job: runs.Job) -> dict[str, int]:
        return {u: self.versions.versions.get(u, 0) for u in runs.contract_units(job)}

    def todo(self, units: set[str] | None, everything: bool) -> list[runs.Job]:
        """The jobs to judge: those whose outputs depend on a unit whose code
        moved (downstream jobs too: they judge what a checkpoint computes),
        and those whose contract is not their reference's (or that have
        none); all of them with `everything`; of `units` when given."""
        out = []
        for job in runs.jobs():
            mine = runs.contract_units(job)
            stale = self.index["jobs"].get(job.name) != self.contract(job)
            if (units is None or mine & units) and (
                everything or stale or mine & self.moved
            ):
                out.append(job)
        return out

    def judge(self, todo: list[runs.Job], work: Path, outcome: Outcome) -> None:
        """Each job against its reference: the same under the same contract;
        a raised unit's jobs (downstream too) other, at least one of them,
        or a stated reason."""
        raised: dict[str, list[bool]] = {}  # unit → per job of it: differs?
        blamed: set[str] = set()
        for job in todo:
            outcome.ran.append(job.name)
            held, now = self.index["jobs"].get(job.name), self.contract(job)
            if held is None:
                outcome.recorded.append(job.name)
                continue
            diff = compare_leaves(
                reference_leaves(job.name, self.root), folder_leaves(work / job.name)
            )
            if held == now:
                outcome.problems += self.differs(job, diff, blamed) if diff else []
                continue
            outcome.recorded.append(job.name)
            for unit in now:
                if held.get(unit) != now[unit]:
                    raised.setdefault(unit, []).append(bool(diff))
        for unit, differs in sorted(raised.items()):
            key = f"{unit}@{self.versions.of(unit)}"
            if not any(differs) and key not in self.versions.reasons:
                outcome.problems.append(
                    f"{unit}: version raised to {self.versions.of(unit)} but its "
                    "outputs are the same as its reference's: state why under "
                    f"reasons ('{key}: ...') in {con.VERSIONS_FILE}, or keep the "
                    "version"
                )

    def differs(self, job: runs.Job, diff: list[Any], blamed: set[str]) -> list[str]:
        """One line per unit to blame for `job`'s outputs moving under the
        same contract: the units it depends on whose code moved (each blamed
        once), or, none moved, the job itself."""
        files = ", ".join(str(d) for d in diff[:3])
        suspects = runs.contract_units(job) & self.moved
        if not suspects:
            return [
                f"{job.name}: its outputs differ from its reference ({files}) "
                "though no code of its units moved: a library or the fixture's "
                "inputs (the demo, prepare, the fake trees) moved them beyond the "
                "rule; if so, `pal contracts verify --new-inputs` records every "
                "job anew"
            ]
        units = sorted(suspects - blamed)
        blamed.update(units)
        return [
            f"{unit}: the outputs of the working tree differ from the reference "
            f"of {unit} {self.versions.of(unit)} ({job.name}: {files}) under "
            f"the same contract: raise versions.{unit} in {con.VERSIONS_FILE}"
            for unit in units
        ]

    def unrecorded(self, name: str) -> str:
        """When not recording: why a job's reference is not its contract's
        (a raise not yet recorded, a new job)."""
        held = self.index["jobs"].get(name)
        now = self.contract(next(j for j in runs.jobs() if j.name == name))
        if held is None:
            return f"{name}: no reference: {RECORD_HINT}"
        raised = [f"{u} {v} → {now[u]}" for u, v in held.items() if now.get(u) != v]
        return f"{name}: its reference is of {', '.join(raised)}: {RECORD_HINT}"

    def record(self, names: list[str], work: Path) -> None:
        """The references of jobs `names` from their outputs in `work`, and
        the index."""
        for job in runs.jobs():
            if job.name in names:
                leaves = folder_leaves(work / job.name)
                write_leaves(self.root / REFERENCE / f"{job.name}.npz", leaves)
                self.index["jobs"][job.name] = dict(sorted(self.contract(job).items()))
        self.index["jobs"] = dict(sorted(self.index["jobs"].items()))
        text = json.dumps(self.index, indent=1, sort_keys=True) + "\n"
        write_bytes_atomic(self.root / REFERENCE / INDEX, text.encode())


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
