"""One cell of a grid as one SLURM array task (`pal-paper task`, what the
batch script of `pal-paper submit` runs).

DVC's queue copies the project into `.dvc/tmp/exps/tmp…` for each try of an
experiment and a killed try's copy is dropped, with tune's finished steps
(`<out>.partial/`) in it. On a cluster the try is the array task, and its copy
is a clone of the project kept on the shared file system,
`.dvc/tmp/slurm/cells/<experiment>/`, one per cell: the cell runs there as
DVC's queue worker runs it in its copy, `dvc exp run -n <experiment> -S …
evaluate`, with the project's DVC cache (its run-cache too), and leaves the
same experiment ref, which the task pushes to the project. A requeued or
resubmitted task finds its clone with the finished stages (DVC's run-cache)
and the finished steps of the interrupted one (`<out>.partial/`), and goes on
from there; a cell whose experiment the project has is never run again.

Signals: SIGUSR1 (`sbatch --signal=B:USR1@…`, ahead of the time limit)
stops the cell as Ctrl-C does, then requeues the task (`scontrol requeue`);
SIGTERM (scancel, pre-emption) stops it the same way and leaves the rest to
SLURM (a pre-empted task of a `--requeue` job comes back by itself).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from palcore.outputs import write_bytes_atomic
from palpaper.experiments import TARGET
from palpaper.tools import ExperimentError, find_tool, run_tool, tool_env

log = logging.getLogger(__name__)

GRACE_S = 60.0  # a stopped cell's time to end before it is killed
STOPPED = 3  # the task's exit status when a signal stopped its cell


def exp_ref(baseline: str, name: str) -> str:
    return f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}"


def has_ref(root: Path, ref: str) -> bool:
    proc = subprocess.run(
        ["git", "rev-parse", "-q", "--verify", ref], cwd=root, capture_output=True
    )
    return proc.returncode == 0


def write_state(path: Path, **state: Any) -> None:
    write_bytes_atomic(path, json.dumps(state, sort_keys=True).encode())


def prepare_clone(origin: Path, clone: Path, baseline: str, copies: list[str]) -> None:
    """The cell's clone of `origin` at `baseline`, made once (a temporary
    name, then renamed): the project's DVC cache and its cache settings, the
    untracked inputs linked from `origin`, the baseline's outputs checked out.
    A later try keeps what the one before left (`dvc exp run` sorts it out)."""
    if clone.is_dir():
        return
    tmp = clone.with_name(f"{clone.name}.tmp{os.getpid()}")
    clone.parent.mkdir(parents=True, exist_ok=True)
    run_tool(["git", "clone", "-q", "--no-checkout", str(origin), str(tmp)], origin)
    run_tool(["git", "checkout", "-q", "--detach", baseline], tmp)
    dvc = find_tool("dvc")
    cache = run_tool([dvc, "cache", "dir"], origin).strip()
    run_tool([dvc, "cache", "dir", "--local", cache], tmp)
    for key in ("cache.type", "cache.shared", "core.site_cache_dir"):
        try:
            value = run_tool([dvc, "config", key], origin).strip()
        except ExperimentError:  # not set (DVC 3.x: exit 251)
            continue
        if value:  # not set (some DVC versions: exit 0, no output)
            run_tool([dvc, "config", "--local", key, value], tmp)
    for rel in copies:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).symlink_to((origin / rel).resolve())
    try:  # the baseline's outputs, linked from the cache: unchanged stages skip
        run_tool([dvc, "checkout", "--allow-missing"], tmp)
    except ExperimentError as exc:  # `dvc exp run` restores or reruns them
        log.warning("%s", exc)
    tmp.rename(clone)


class Stop:
    """SIGUSR1 and SIGTERM stop the cell as Ctrl-C: SIGINT to the task's
    process group (DVC and the stage it runs; this process ignores it)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.running = False
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal is None:
            log.info("%s: stopping the cell", signal.Signals(signum).name)
        self.signal = self.signal or signum
        if self.running:
            self.interrupt()

    def interrupt(self) -> None:
        # ignored here only now: DVC and its stages would inherit SIG_IGN
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if os.getpgid(0) == os.getpid():  # the batch script exec'd this
            os.killpg(os.getpid(), signal.SIGINT)


# What a `dvc exp run` stopped by a signal can leave in the clone's git:
# git's and dulwich's lock files (`.git/index.lock`, `.git/objects/xx/….lock`:
# the next run fails on them, "File exists"), its queue entry (the workspace
# stash: the next run would run every entry it finds) and its executor's refs.
RUN_REFS = ("refs/exps/stash", "refs/exps/exec")


def clear_stopped_run(clone: Path) -> list[str]:
    """Delete what a stopped `dvc exp run` left in the clone's git: every
    `*.lock` file under `.git`, and RUN_REFS (the stash's entries with its
    ref). Only this cell's task uses the clone, and no other try of it runs
    now. What was deleted, `.git/…` files first."""
    git = clone / ".git"
    locks = sorted(p for p in git.rglob("*.lock") if p.is_file())
    for path in locks:
        path.unlink()
    refs = run_tool(["git", "for-each-ref", "--format=%(refname)", *RUN_REFS], clone)
    for ref in refs.split():
        # --no-deref: a symref itself, not its target
        run_tool(["git", "update-ref", "--no-deref", "-d", ref], clone)
    return [str(p.relative_to(clone)) for p in locks] + refs.split()


def run_cell(clone: Path, name: str, set_args: list[str], stop: Stop) -> int:
    """`dvc exp run -n NAME -S … evaluate` in the clone (its tracked files
    back at the baseline first, what a stopped try left of its run cleared;
    untracked files, `.partial/` among them, kept); its exit status. A stop
    signal ends it (SIGKILL after GRACE_S)."""
    if left := clear_stopped_run(clone):
        log.info("cleared what a stopped try left: %s", ", ".join(left))
    run_tool(["git", "checkout", "-q", "-f", "HEAD", "--", "."], clone)
    dvc = find_tool("dvc")
    if stop.signal is not None:  # stopped before the cell started
        return 128 + stop.signal
    args = [dvc, "exp", "run", "-n", name, *set_args, TARGET]
    log.info("%s", " ".join([Path(dvc).name, *args[1:]]))
    sys.stdout.flush()
    proc = subprocess.Popen(args, cwd=clone, env=tool_env(), stdin=subprocess.DEVNULL)
    stop.running = True
    if stop.signal is not None:  # a signal between the check and the start
        stop.interrupt()
    deadline = None
    while proc.poll() is None:
        time.sleep(0.5)
        if stop.signal is not None:
            deadline = deadline or time.monotonic() + GRACE_S
            if time.monotonic() > deadline:  # its stage ends with the job
                proc.kill()
    stop.running = False  # a signal now leaves the push alone
    return proc.returncode


def run_task(sub: Path, array: str, index: int) -> int:
    """Task `index` of array job `array`, of submission folder `sub`; the
    exit status (STOPPED: a signal stopped its cell)."""
    record = json.loads((sub / "submission.json").read_text())
    origin, baseline = Path(record["origin"]), record["baseline"]
    cell = record["cells"][index]
    name, ref = cell["exp"], exp_ref(baseline, cell["exp"])
    state = sub / f"task-{index}.json"
    job = f"{array}_{index}"
    tries = int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1
    stop = Stop()
    if has_ref(origin, ref):
        log.info("cell %s finished before: nothing to run", cell["name"])
        write_state(state, exp=name, state="finished", job=job)
        return 0
    clone = origin / ".dvc" / "tmp" / "slurm" / "cells" / name
    prepare_clone(origin, clone, baseline, record["copies"])
    host = os.uname().nodename
    log.info(
        "cell %s: try %d (job %s on %s) in %s", cell["name"], tries, job, host, clone
    )
    write_state(state, exp=name, state="running", job=job, node=host)
    rc = 0
    if not has_ref(clone, ref):
        rc = run_cell(clone, name, cell["set_args"], stop)
    if rc == 0 and has_ref(clone, ref):
        run_tool(["git", "push", "-q", str(origin), f"{ref}:{ref}"], clone)
        log.info("cell %s finished: experiment %s in the project", cell["name"], name)
        write_state(state, exp=name, state="finished", job=job)
        return 0
    if stop.signal is None:
        write_state(state, exp=name, state="failed", job=job, rc=rc)
        log.info("cell %s failed: `dvc exp run` exited with %d", cell["name"], rc)
        return 1
    why = signal.Signals(stop.signal).name
    write_state(state, exp=name, state="stopped", job=job, signal=why)
    if stop.signal == signal.SIGUSR1:  # the time limit is near: come back
        run_tool(["scontrol", "requeue", job], origin)
        log.info(
            "cell %s stopped by %s ahead of the time limit: requeued", cell["name"], why
        )
    else:
        log.info("cell %s stopped by %s (scancel or pre-emption)", cell["name"], why)
    return STOPPED
