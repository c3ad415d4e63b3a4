"""Cells on DVC's experiment queue: queued, run by its workers, waited for.

`Repo` is the project's git repository with its finished experiments
(`refs.ExperimentRefs`) and DVC's queue: each cell is queued as the
experiment `<baseline short hash>-<cell name>` and run by DVC's queue
workers, or by workers pinned to a card (`palpaper.workers`). A cell that
finished is never queued again on the same baseline: an interrupted grid
resumes with the cells it lacks.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from palpaper import workers
from palpaper.overrides import Cell
from palpaper.refs import ExperimentRefs
from palpaper.tools import ExperimentError, find_tool, run_tool, tool_env
from palpaper.workers import alive

log = logging.getLogger(__name__)

# the stage each cell runs with its ancestors: every result reads evaluate's
# report; a preset's chain starts at its data, so the demo's stages never run
TARGET = "evaluate"


class QueueDamaged(ExperimentError):
    """A file of DVC's queue that DVC cannot read: every queue command fails."""


class Repo(ExperimentRefs):
    """The project's git repository, its DVC experiments and DVC's queue."""

    def queue_status(self) -> dict[str, str]:
        """Task name -> status (Queued, Running, Success, Failed) in DVC's queue;
        a damaged file in the queue is a QueueDamaged naming it."""
        out = self._dvc("queue", "status")
        status: dict[str, str] = {}
        lines = out.splitlines()
        for line in lines[1:]:
            if not line.strip() or line.startswith("Worker status"):
                break
            parts = line.split()
            if len(parts) >= 4:
                status[parts[1]] = parts[-1]
        return status

    def _dvc(self, *args: str, detached: bool = False) -> str:
        """A DVC command in the project; when it fails over a damaged file of
        DVC's queue (which fails every queue command), a QueueDamaged naming
        that file and its repair."""
        try:
            return run_tool([find_tool("dvc"), *args], self.root, detached=detached)
        except ExperimentError as exc:
            damaged = self.damaged_queue_file()
            if damaged is None:
                raise
            raise QueueDamaged(
                f"{damaged}: a damaged file in DVC's queue ({exc}): `rm {damaged}` "
                "(finished cells are kept: they are experiments, not queue files)"
            ) from None

    def damaged_queue_file(self) -> Path | None:
        """The first file of DVC's celery queue that is not the JSON it
        writes (a write cut short), relative to the project."""
        celery = self.root / ".dvc" / "tmp" / "exps" / "celery"
        for path in sorted(p for p in celery.rglob("*") if p.is_file()):
            if path.suffix not in (".msg", ".json"):
                continue
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                return path.relative_to(self.root)
        return None

    def stale(self, name: str) -> bool:
        """Whether the task `name`, which DVC's queue lists as Running, lost
        its process (a killed worker, a restarted machine): DVC keeps a
        `<task>.json` with the pid beside each task's `<task>.run` info file;
        the newest of a name's is the task's (older ones are earlier tries)."""
        pids = []
        for info in (self.root / ".dvc/tmp/exps/run").glob("*/*.run"):
            try:
                if json.loads(info.read_text()).get("name") != name:
                    continue
                pid = json.loads(info.with_suffix(".json").read_text())["pid"]
                pids.append((info.stat().st_mtime_ns, int(pid)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return bool(pids) and not alive(max(pids)[1])

    def interrupted(self, name: str) -> bool:
        """Whether the task `name` is listed as Running but lost its process,
        checked twice: a task that ends between DVC's listing and the pid
        check is not interrupted."""
        if not self.stale(name):
            return False
        time.sleep(1.0)
        return self.queue_status().get(name) == "Running" and self.stale(name)

    def kill(self, name: str) -> None:
        """Mark a task whose process is gone as failed (`dvc queue kill`) and
        remove its temporary copy of the project; a task that is no longer
        running needs nothing."""
        try:
            self._dvc("queue", "kill", name)
        except ExperimentError as exc:
            if "not a valid running experiment" not in str(exc):
                raise
        self.remove_copies(name)

    def remove_copies(self, name: str) -> list[Path]:
        """Remove the temporary copies (`.dvc/tmp/exps/tmp…`) that the tries
        of task `name` left behind: a killed worker never cleans up its own.
        Returns the folders removed."""
        exps = (self.root / ".dvc/tmp/exps").resolve()
        removed = []
        for info in exps.glob("run/*/*.run"):
            try:
                doc = json.loads(info.read_text())
                if doc.get("name") != name:
                    continue
                folder = Path(doc["root_dir"]).resolve()
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if folder.parent == exps and folder.name.startswith("tmp"):
                if folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
        return removed

    def queue(self, cell: Cell, copy_paths: Sequence[str] = ()) -> None:
        """Queue the cell as an experiment of the stages `evaluate` needs
        (never the demo's unless the data is the demo's); `copy_paths` go
        into its temporary copy (`cells.untracked_inputs`)."""
        copies = [a for p in copy_paths for a in ("--copy-paths", p)]
        self._dvc(
            "exp",
            "run",
            "--queue",
            "-n",
            self.exp_name(cell),
            *copies,
            *cell.set_args,
            TARGET,
        )

    def requeue(self, cell: Cell, copy_paths: Sequence[str] = ()) -> None:
        """Queue a cell again whose task was interrupted."""
        self.kill(self.exp_name(cell))
        self.forget(self.exp_name(cell))
        self.queue(cell, copy_paths)

    def forget(self, name: str) -> None:
        """Drop a failed task of this name from DVC's queue."""
        self._dvc("queue", "remove", name)

    def start(self, jobs: int, gpus: Sequence[str] | None = None) -> None:
        """Start `jobs` queue workers, or one pinned to each of `gpus`
        (`palpaper.workers`); they run until the queue is empty."""
        if gpus:
            workers.start(self.root, gpus, find_tool("dvc"), tool_env())
            return
        self._dvc("queue", "start", "-j", str(jobs), detached=True)

    def stop(self) -> None:
        """End the workers and the cells they run (`dvc queue stop --kill`, and
        the pinned workers); a killed cell is queued again by the next run."""
        self._dvc("queue", "stop", "--kill")
        workers.stop(self.root)


# A task that a worker is taking from DVC's queue is for a moment in neither its
# queued nor its running list: a cell counts as lost only after this many polls
LOST_POLLS = 3


def wait(
    repo: Repo,
    cells: Sequence[Cell],
    jobs: int,
    gpus: Sequence[str] | None = None,
    poll: float = 5.0,
    progress: Callable[[int], None] | None = None,
    copy_paths: Sequence[str] = (),
) -> dict[str, str]:
    """Wait until every cell finished or failed; name -> 'done' or 'failed'.

    Starts workers again when cells are still queued and nothing has run for
    two polls (the workers exited or were killed).
    """
    names = {repo.exp_name(c) for c in cells}
    seen = 0
    idle = 0
    absent: dict[str, int] = {}  # pending cell -> polls in a row DVC lists it nowhere
    while True:
        done = names & set(repo.finished())
        status = repo.queue_status()
        failed = {n for n in names - done if status.get(n) == "Failed"}
        if len(done) != seen and progress is not None:
            progress(len(done) - seen)
            seen = len(done)
        pending = names - done - failed
        if not pending:
            return {n: "done" if n in done else "failed" for n in names}
        _requeue_interrupted(repo, cells, pending, status, copy_paths)
        absent = _count_absent(absent, pending, status)
        idle = _keep_workers(repo, jobs, gpus, pending, status, idle)
        time.sleep(poll)


def _requeue_interrupted(
    repo: Repo,
    cells: Sequence[Cell],
    pending: set[str],
    status: dict[str, str],
    copy_paths: Sequence[str],
) -> None:
    """Queue again each pending cell listed as Running whose process is gone
    (`Repo.interrupted`); `status` then lists it as Queued."""
    for c in cells:
        name = repo.exp_name(c)
        if name in pending and status.get(name) == "Running" and repo.interrupted(name):
            log.info("cell %s lost its process: queued again", c.name)
            repo.requeue(c, copy_paths)
            status[name] = "Queued"


def _count_absent(
    absent: dict[str, int], pending: set[str], status: dict[str, str]
) -> dict[str, int]:
    """Pending cell -> polls in a row that DVC's queue lists it nowhere, this
    poll counted; a cell absent for LOST_POLLS polls is an ExperimentError."""
    absent = {n: absent.get(n, 0) + 1 for n in pending if n not in status}
    lost = {n for n, polls in absent.items() if polls >= LOST_POLLS}
    if lost:
        raise ExperimentError(
            f"cell '{sorted(lost)[0]}' is neither finished nor in DVC's queue "
            "(removed by hand?); run the command again to queue it"
        )
    return absent


def _keep_workers(
    repo: Repo,
    jobs: int,
    gpus: Sequence[str] | None,
    pending: set[str],
    status: dict[str, str],
    idle: int,
) -> int:
    """Start workers again where queued cells lack them: a pinned worker that
    died, or none running for two polls; returns the polls in a row that none
    ran (`idle`, this poll counted)."""
    if gpus and any(status.get(n) == "Queued" for n in pending):
        repo.start(jobs, gpus)  # a pinned worker that died: its card again
    idle = idle + 1 if "Running" not in status.values() else 0
    if idle >= 2:
        log.info("cells are queued and none runs; starting the workers")
        repo.start(jobs, gpus)
        idle = 0
    return idle
