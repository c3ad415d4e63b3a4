"""Cells as DVC experiments: queue them, run DVC's queue, find their results.

Every cell is an experiment on the commit the grid runs from (the baseline),
named `<baseline short hash>-<cell name>` (`grids.Cell.name`: its overrides).
A finished experiment is a git ref `refs/exps/<baseline[:2]>/<baseline[2:]>/
<name>` (how DVC stores them); its `results/<dataset>/metrics.json` is read
from that commit with `git show`, so collecting needs neither the workspace
nor the cache. A cell that finished
is never queued again on the same baseline: an interrupted grid resumes with
the cells it lacks.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from palcore.errors import PalError
from palpaper import workers
from palpaper.grids import Cell, GridError, get
from palpaper.workers import alive

log = logging.getLogger(__name__)

# the stage each cell runs with its ancestors: every result reads evaluate's
# report; a preset's chain starts at its data, so the demo's stages never run
TARGET = "evaluate"


class ExperimentError(PalError):
    """git or DVC refused, or a cell has no usable result."""


def _tool(name: str) -> str:
    """The command `name`: beside this Python (the venv) first, then PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ExperimentError(f"'{name}' not found: install the project (README)")
    return found


def _env() -> dict[str, str]:
    """The environment of DVC and its queue workers: this Python's scripts
    folder first on PATH, so the stages' `pal` and `pal-solver` are found as
    in the shell that runs `dvc repro` (pal-paper may run unactivated)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    scripts = Path(sys.executable).parent
    if (scripts / "pal").exists():
        env["PATH"] = os.pathsep.join([str(scripts), env.get("PATH", "")])
    return env


def _run(args: Sequence[str], cwd: Path, detached: bool = False) -> str:
    """Run a git or DVC command; a failure is an `ExperimentError` with its
    message whole (`_message`).

    `detached`: the command leaves processes behind (DVC's queue workers),
    so its output goes to a file they may keep open, not a pipe to wait on.
    """
    with tempfile.TemporaryFile(mode="w+") as log_file:
        out = log_file if detached else subprocess.PIPE
        try:
            proc = subprocess.run(
                list(args),
                cwd=cwd,
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if detached else subprocess.PIPE,
                text=True,
            )
        except FileNotFoundError:
            raise ExperimentError(f"'{args[0]}' not found") from None
        if detached:
            log_file.seek(0)
            stdout, stderr = log_file.read(), ""
        else:
            stdout, stderr = proc.stdout, proc.stderr
    if proc.returncode != 0:
        what = " ".join(Path(args[0]).name if i == 0 else a for i, a in enumerate(args))
        raise ExperimentError(f"{what}: {_message(stderr or stdout)}")
    return stdout


def _message(output: str) -> str:
    """A failed command's message, whole, on one line: DVC's from its first
    `ERROR` line on (the message may wrap over several lines), else the
    last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("ERROR")), len(lines) - 1
    )
    return " ".join(lines[start:])


class QueueDamaged(ExperimentError):
    """A file of DVC's queue that DVC cannot read: every queue command fails."""


class Repo:
    """The project's git repository, its DVC experiments and DVC's queue."""

    def __init__(self, root: Path, baseline: str | None = None) -> None:
        self.root = root
        self.git = "git"
        try:
            self.baseline = _run(
                [self.git, "rev-parse", "--verify", f"{baseline or 'HEAD'}^{{commit}}"],
                root,
            ).strip()
        except ExperimentError:
            raise ExperimentError(
                f"{root}: no git commit '{baseline or 'HEAD'}' (a grid's cells "
                "are experiments on a commit)"
            ) from None

    @property
    def short(self) -> str:
        return self.baseline[:7]

    def exp_name(self, cell: Cell) -> str:
        """The cell's experiment name: the baseline's short hash, then the
        cell's name (DVC's queue lists tasks of every baseline by name)."""
        return f"{self.short}-{cell.name}"

    def dirty(self) -> list[str]:
        """Tracked files changed since the baseline commit."""
        out = _run(
            [self.git, "status", "--porcelain", "--untracked-files=no"], self.root
        )
        return [line[3:] for line in out.splitlines() if line.strip()]

    def finished(self, cells: Sequence[Cell] | None = None) -> dict[str, str]:
        """Experiment name -> commit, for the experiments on the baseline;
        with `cells`, only those whose commit holds the cell's params (a ref
        is trusted by its content, never its name alone: `holds`)."""
        done = self._refs()
        if cells is None:
            return done
        named = {self.exp_name(c): c for c in cells}
        return {
            n: sha
            for n, sha in done.items()
            if n not in named or self.holds(sha, named[n])
        }

    def holds(self, commit: str, cell: Cell) -> bool:
        """Whether `commit`'s params.yaml sets each of the cell's overrides."""
        import yaml

        def plain(value: Any) -> Any:
            return [plain(v) for v in value] if isinstance(value, tuple) else value

        text = self.show(commit, "params.yaml")
        try:
            params = yaml.safe_load(text or "") or {}
            return all(get(params, k) == plain(v) for k, v in cell.overrides)
        except (yaml.YAMLError, GridError, TypeError):
            return False

    def _refs(self) -> dict[str, str]:
        b = self.baseline
        out = _run(
            [
                self.git,
                "for-each-ref",
                "--format=%(objectname) %(refname)",
                f"refs/exps/{b[:2]}/{b[2:]}/",
            ],
            self.root,
        )
        done = {}
        for line in out.splitlines():
            sha, ref = line.split(" ", 1)
            done[ref.rsplit("/", 1)[-1]] = sha
        return done

    def other_baselines(self, cell_names: Sequence[str]) -> dict[str, int]:
        """Commit -> how many of `cell_names` finished on it, for the commits
        other than the baseline (a grid run before HEAD moved)."""
        out = _run(
            [self.git, "for-each-ref", "--format=%(refname)", "refs/exps/"], self.root
        )
        wanted = set(cell_names)
        counts: dict[str, int] = {}
        for ref in out.splitlines():
            parts = ref.split("/")
            if len(parts) != 5:
                continue
            base, name = parts[2] + parts[3], parts[4]
            if base == self.baseline or name[:8] != f"{base[:7]}-":
                continue
            if name[8:] in wanted:
                counts[base] = counts.get(base, 0) + 1
        return counts

    def show(self, commit: str, path: str) -> str | None:
        """The text of `path` at `commit`, or None when it has no such file."""
        proc = subprocess.run(
            [self.git, "show", f"{commit}:{path}"],
            cwd=self.root,
            capture_output=True,
            text=True,
        )
        return proc.stdout if proc.returncode == 0 else None

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
            return _run([_tool("dvc"), *args], self.root, detached=detached)
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
            workers.start(self.root, gpus, _tool("dvc"), _env())
            return
        self._dvc("queue", "start", "-j", str(jobs), detached=True)

    def stop(self) -> None:
        """End the workers and the cells they run (`dvc queue stop --kill`, and
        the pinned workers); a killed cell is queued again by the next run."""
        self._dvc("queue", "stop", "--kill")
        workers.stop(self.root)

    def report(self, commit: str, dataset: str) -> dict[str, bytes]:
        """The files evaluate wrote to `results/<dataset>/` in the experiment
        `commit` (that folder's own files, not its subfolders'): name -> bytes."""
        where = f"{commit}:results/{dataset}"
        listing = _run([self.git, "ls-tree", "-z", where], self.root)
        files = {}
        for entry in filter(None, listing.split("\0")):
            meta, name = entry.split("\t", 1)
            _, kind, sha = meta.split()
            if kind == "blob":
                files[name] = subprocess.run(
                    [self.git, "cat-file", "blob", sha],
                    cwd=self.root,
                    capture_output=True,
                    check=True,
                ).stdout
        return files

    def metrics(self, commit: str, dataset: str) -> dict[str, Any] | None:
        text = self.show(commit, f"results/{dataset}/metrics.json")
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None


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
        for c in cells:
            if (
                repo.exp_name(c) in pending
                and status.get(repo.exp_name(c)) == "Running"
                and repo.interrupted(repo.exp_name(c))
            ):
                log.info("cell %s lost its process: queued again", c.name)
                repo.requeue(c, copy_paths)
                status[repo.exp_name(c)] = "Queued"
        absent = {n: absent.get(n, 0) + 1 for n in pending if n not in status}
        lost = {n for n, polls in absent.items() if polls >= LOST_POLLS}
        if lost:
            raise ExperimentError(
                f"cell '{sorted(lost)[0]}' is neither finished nor in DVC's queue "
                "(removed by hand?); run the command again to queue it"
            )
        if gpus and any(status.get(n) == "Queued" for n in pending):
            repo.start(jobs, gpus)  # a pinned worker that died: its card again
        idle = idle + 1 if "Running" not in status.values() else 0
        if idle >= 2:
            log.info("cells are queued and none runs; starting the workers")
            repo.start(jobs, gpus)
            idle = 0
        time.sleep(poll)
