"""`pal-paper submit` against a real SLURM: a one-node cluster started here
(tests/slurm_cluster.py), the committed demo, CPU only.

- Table 4's five cells as one array job (the README's commands, verbatim), a
  running task cancelled with scancel, the same commands again: the finished
  cells kept, the rest run, the table equal to the committed one; every cell
  finished once.
- A cell given a time limit shorter than itself: signalled ahead of the
  limit, requeued, resumed from its finished steps, finished once.
- A second account in a shared group, with the group's cache (USAGE's
  commands, verbatim): its run restores the first user's outputs from the
  shared run-cache and links them, no copy.

The features come from the clone's DVC cache when `make run` made them (as
`.ci/run` does before the tests); otherwise the project reproduces them
first (about 7 minutes more). Where SLURM or root is missing the tests skip,
unless PAL_REQUIRE_SLURM=1 (set by .ci/run) makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    committed,
    lock_moves,
    reproduced_as_committed,
    table_means_close,
)
from scratch_project import BIN, ROOT
from slurm_cluster import Cluster, missing

from solver.compare import TOLERANCE

pytestmark = pytest.mark.slow  # a real SLURM: about 6 minutes on 2 cores

REQUIRED = os.environ.get("PAL_REQUIRE_SLURM") == "1"
USER, GROUP = "palslurm2", "palslurm"
UPSAMPLING = "results/paper/demo/upsampling.md"


def _unless(ok: bool, why: str) -> None:
    if not ok:
        (pytest.fail if REQUIRED else pytest.skip)(why)


def block(doc: str, name: str) -> str:
    """The fenced block after `<!-- ci: NAME -->` in `doc` (as .ci/run reads
    the README's)."""
    lines = (ROOT / doc).read_text().splitlines()
    start = lines.index(f"<!-- ci: {name} -->") + 2
    end = lines.index("```", start)
    return "\n".join(lines[start:end])


ADMIN = "/usr/sbin:/sbin:/usr/bin:/bin"  # where useradd & co. live, off a user's PATH


def tool(name: str) -> str:
    """`name`'s path, found in the system's admin folders too (CI runs with
    PATH=/usr/bin:/bin, where groupadd and useradd are not)."""
    return shutil.which(name, path=ADMIN) or name


def sh(
    code: str, cwd: Path, env: dict[str, str], user: str | None = None
) -> subprocess.CompletedProcess:
    """`code` in bash -euo pipefail (as user `user`), output kept."""
    args = ["bash", "-euo", "pipefail", "-c", code]
    if user is not None:
        args = [
            tool("runuser"),
            "-u",
            user,
            "--",
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            *args,
        ]
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{code}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A folder every user reaches (pytest's own is the owner's alone)."""
    _unless(not missing(), f"SLURM or munge not installed ({', '.join(missing())})")
    _unless(os.geteuid() == 0, "starting slurmd and adding a user need root")
    folder = Path(tempfile.mkdtemp(prefix="pal-slurm-"))
    folder.chmod(0o755)
    yield folder
    if not os.environ.get("PAL_SLURM_KEEP"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(base: Path) -> Iterator[Cluster]:
    c = Cluster(base / "cluster")
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def second_user() -> Iterator[str]:
    """A second account, in the group the cache belongs to."""
    subprocess.run([tool("groupadd"), "-f", GROUP], check=True)
    subprocess.run([tool("useradd"), "-m", "-G", GROUP, USER], check=True)
    closed = _closed_folders(Path(os.path.realpath(sys.executable)))
    for folder in closed:  # the venv's interpreter, e.g. under ~/.pyenv
        _unless(
            shutil.which("setfacl", path=ADMIN) is not None, f"{folder}: no setfacl"
        )
        subprocess.run([tool("setfacl"), "-m", f"u:{USER}:x", folder], check=True)
    yield USER
    for folder in closed:
        subprocess.run([tool("setfacl"), "-x", f"u:{USER}", folder], check=True)
    subprocess.run([tool("userdel"), "-r", USER], capture_output=True)
    subprocess.run([tool("groupdel"), GROUP], capture_output=True)


def _closed_folders(path: Path) -> list[str]:
    """The folders above `path` that other users cannot enter."""
    return [str(p) for p in path.parents if not p.stat().st_mode & 0o001]


def user_env(cluster: Cluster, project: Path, home: str) -> dict[str, str]:
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(project),
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        **cluster.env,
    }


@pytest.fixture(scope="module")
def project(base: Path, cluster: Cluster, second_user: str) -> tuple[Path, dict]:
    """The committed project, cloned, on the group's cache (USAGE's commands)
    seeded from this clone's cache; every output checked out."""
    cache = base / "cache"
    path = base / "a"
    env = user_env(cluster, path, os.environ.get("HOME", "/root"))
    env.update(CACHE=str(cache), GROUP=GROUP)
    sh(block("docs/USAGE.md", "group-cache"), base, env)
    sh(f"git clone -q {ROOT} {path}", base, env)
    sh(block("docs/USAGE.md", "member-cache"), path, env)
    seeded = subprocess.run(
        f"dvc remote add --local seed {ROOT / '.dvc/cache'} && "
        "dvc pull -q -r seed dvc.yaml",
        shell=True,
        cwd=path,
        env=env,
        capture_output=True,
    )
    if (
        seeded.returncode != 0
        and (ROOT / "dvc.lock").is_file()
        and not lock_moves(ROOT)
    ):
        # another CPU kind: this clone's `make run` made its own bytes (the
        # committed ones' hashes moved), which the cache holds under its lock
        shutil.copy(ROOT / "dvc.lock", path / "dvc.lock")
        shutil.copytree(
            ROOT / "results/demo", path / "results/demo", dirs_exist_ok=True
        )
        seeded = subprocess.run(
            "dvc pull -q -r seed dvc.yaml", shell=True, cwd=path, env=env
        )
    if seeded.returncode != 0:  # no `make run` here: the features made afresh
        sh("dvc repro dvc.yaml", path, env)
    assert reproduced_as_committed(path, env) == ""
    # on another CPU kind the lock's hashes and the demo's report moved within
    # the rule: its user commits them, as grids are experiments on a commit
    if sh("git status --porcelain", path, env).stdout:
        sh("git commit -qam 'the lock and results of this machine'", path, env)
    return path, env


def wait_jobs(
    env: dict[str, str], cwd: Path, jobs: list[str] | None = None, limit: float = 600
) -> None:
    """Until SLURM's queue holds none of `jobs` (array tasks too), or none."""
    deadline = time.monotonic() + limit
    while True:
        queued = sh("squeue -h -o %i", cwd, env).stdout.split()
        if not [j for j in queued if jobs is None or j.split("_")[0] in jobs]:
            return
        assert time.monotonic() < deadline, sh("squeue", cwd, env).stdout
        time.sleep(2)


def submitted(path: Path, out: str) -> tuple[Path, list[str]]:
    """The submission folder and the two job ids of `submit`'s output."""
    m = re.search(r"as array job (\d+) .* as job (\d+) after it", out)
    assert m, out
    for sub in (path / ".dvc/tmp/slurm").glob("*-*/submission.json"):
        if json.loads(sub.read_text())["array"] == m.group(1):
            return sub.parent, [m.group(1), m.group(2)]
    raise AssertionError(f"no submission of job {m.group(1)}")


@pytest.fixture(scope="module")
def long_cell(project: tuple[Path, dict]) -> tuple[Path, list[str]]:
    """A prompt cell of two runs (two tunes of 5 steps, their extractions,
    the analytic stages: about 2 minutes of work) under a 1-minute limit,
    submitted first: it runs beside Table 4's grid (one CPU each)."""
    path, env = project
    cmd = (
        "pal-paper submit prompt --runs 0,1 --cells length-2 --gpus-per-task 0 "
        "--time 0:00:50 --mem 100M --sbatch-arg=--comment=pal-test"
    )
    out = sh(cmd, path, env).stdout
    assert "submitted 1 cells" in out and "(1 min a task)" in out, out
    sub, jobs = submitted(path, out)
    script = (sub / "task.sh").read_text().splitlines()
    for line in (
        "#SBATCH --time=1",
        "#SBATCH --mem=100M",
        "#SBATCH --comment=pal-test",
    ):
        assert line in script, script  # sbatch took each: the job runs
    return sub, jobs


def logs(folder: Path) -> str:
    """The task logs of the submissions under `folder`, every try."""
    return "".join(p.read_text() for p in sorted(folder.glob("**/task-*.out")))


def _mid_cell(sub: Path) -> int | None:
    """The index of a task whose cell runs (`dvc exp run` started, not ended)."""
    for log in sorted(sub.glob("task-*.out")):
        text = log.read_text()
        if "palpaper.cluster: dvc exp run" in text and "Ran experiment" not in text:
            return int(log.stem.split("-")[1])
    return None


def test_table4_as_an_array_job_scancel_and_the_same_command_again(
    project: tuple[Path, dict], long_cell: tuple[Path, list[str]]
) -> None:
    path, env = project
    head = sh("git rev-parse --short=7 HEAD", path, env).stdout.strip()
    dry = sh(block("docs/USAGE.md", "slurm-submit"), path, env).stdout.splitlines()
    for line in (
        "#SBATCH --array=0-4%8",
        "#SBATCH --time=20",
        "#SBATCH --mem=500M",
        "#SBATCH --exclusive",
        "#SBATCH --signal=B:USR1@180",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ):
        assert line in dry, dry
    assert not any("--gres" in line for line in dry), dry  # CPU only
    assert not Path(dry[0].split()[1]).parent.exists()  # a dry run writes nothing
    readme = block("README.md", "slurm")
    out = sh(readme, path, env).stdout
    assert "submitted 5 cells" in out, out
    assert out.splitlines()[1].startswith(f"5 cells on {head}: "), out
    sub, jobs = submitted(path, out)
    again = sh(readme.splitlines()[0], path, env).stdout  # while the tasks run
    held = re.match(
        r"(\d) cells still in SLURM's queue \(running or waiting\): kept$", again
    )
    assert held and int(held.group(1)) >= 1 and "submitted" not in again, again
    # a task mid-cell (its `dvc exp run` started) once another finished: cancelled
    deadline = time.monotonic() + 400
    while (victim := _mid_cell(sub)) is None or "finished:" not in logs(sub):
        assert time.monotonic() < deadline, logs(sub)
        time.sleep(1)
    sh(f"scancel {jobs[0]}_{victim}", path, env)
    wait_jobs(env, path, jobs)
    status = sh("pal-paper status upsampling", path, env).stdout
    assert "stopped (job " in status and "SIGTERM" in status, status

    out = sh(readme, path, env).stdout  # the same commands again
    assert "submitted 1 cells" in out, out
    wait_jobs(env, path, submitted(path, out)[1])
    status = sh("pal-paper status upsampling", path, env).stdout.splitlines()
    assert status[0] == f"5 cells on {head}: 5 finished", (status, logs(sub.parent))
    got = (path / UPSAMPLING).read_text().split("\n", 1)[1]
    want = committed(UPSAMPLING).split("\n", 1)[1]
    assert table_means_close(got, want, TOLERANCE) == ""
    text = logs(path / ".dvc/tmp/slurm")
    for line in status[1:6]:
        cell = line.split(":")[0].strip()
        assert text.count(f"cell {cell} finished:") == 1, text


def test_a_cell_longer_than_its_time_limit_is_requeued_and_resumed(
    project: tuple[Path, dict], long_cell: tuple[Path, list[str]]
) -> None:
    """SIGUSR1 comes 20 to 50 s into each try of `long_cell`, so it takes
    several tries; each goes on from what the ones before finished."""
    path, env = project
    sub, jobs = long_cell
    assert "#SBATCH --signal=B:USR1@10" in (sub / "task.sh").read_text()
    wait_jobs(env, path, jobs, limit=900)
    cell = json.loads((sub / "submission.json").read_text())["cells"][0]["name"]
    text = (sub / "task-0.out").read_text()
    tries = re.findall(rf"cell {re.escape(cell)}: try (\d+)", text)
    stops = text.count("stopped by SIGUSR1 ahead of the time limit: requeued")
    assert len(tries) >= 2 and stops == len(tries) - 1, text
    assert text.count(f"cell {cell} finished:") == 1, text
    # each try after the first went on from the finished steps or stages
    later = text.split("try 2 (", 1)[1]
    assert "reusing steps 1-" in later or "is cached - skipping run" in later, text
    status = sh("pal-paper status prompt --runs 0,1", path, env).stdout
    assert f"  {cell}: finished" in status, status


def test_a_second_user_shares_the_group_cache(
    project: tuple[Path, dict], base: Path, cluster: Cluster, second_user: str
) -> None:
    """User 2 (in the cache's group, the first user's cells finished) clones
    the project onto the group's cache with USAGE's commands and runs Table
    4's first cell: solve comes from the first user's run (the shared
    run-cache), its outputs are links to the same cache files, no copy."""
    a, a_env = project
    first = "pal-paper submit upsampling --cells width=546 --gpus-per-task 0"
    head = sh("git rev-parse --short=7 HEAD", a, a_env).stdout.strip()
    if not (a / f".dvc/tmp/slurm/cells/{head}-width=546").is_dir():  # run alone
        sh(first, a, a_env)
        wait_jobs(a_env, a)
    b = base / "b"
    b.mkdir()
    shutil.chown(b, second_user, GROUP)
    env = user_env(cluster, b, f"/home/{second_user}")
    env.update(CACHE=str(base / "cache"), GROUP=GROUP)
    # git refuses a repository another user owns until it is declared safe
    sh(f"git config --global --add safe.directory {a}/.git", b, env, user=second_user)
    sh(f"git clone -q {a} .", b, env, user=second_user)
    sh(block("docs/USAGE.md", "member-cache"), b, env, user=second_user)
    assert "submitted 1 cells" in sh(first, b, env, user=second_user).stdout
    wait_jobs(env, b)
    text = logs(b / ".dvc/tmp/slurm")
    assert "cell width=546 finished:" in text, text
    assert "Stage 'solve' is cached - skipping run" in text, text
    cells = ".dvc/tmp/slurm/cells"
    mine = b / cells / f"{head}-width=546" / "data/solve"
    theirs = a / cells / f"{head}-width=546" / "data/solve"
    files = sorted(p.relative_to(mine) for p in mine.rglob("*") if not p.is_dir())
    assert files
    for rel in files:
        link = mine / rel
        assert link.is_symlink()
        target = link.resolve()
        assert target == (theirs / rel).resolve()  # the first user's file
        assert target.is_relative_to(base / "cache")
        assert target.stat().st_nlink == 1 and target.stat().st_uid == 0  # no copy
