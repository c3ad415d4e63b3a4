"""`pal-paper run --gpus`: one DVC queue worker per card, through DVC's real
queue, on a project whose one stage stands in for the pipeline.

The stage records the `CUDA_VISIBLE_DEVICES` it ran under (fake ids: no GPU
is needed to pin a worker), when it started and ended, and writes a report
whose numbers follow from the cell's params, so a table made by pinned
workers can be compared with one worker's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import committed_params, pal_paper

from palpaper.grids import RESULTS
from palpaper.workers import GpuListError, group_alive, parse_gpus, wall_hours

BIN = Path(sys.executable).parent

STAGE = """\
import json, os, sys, time
import yaml
p = yaml.safe_load(open("params.yaml"))
cell = f"{p['solve']['width']}-{p['solve']['eta']}"
gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
def note(what):
    with open(os.environ["PAL_RECORD"], "a") as f:
        f.write(f"{what} {cell} {gpu} {time.time():.3f}\\n")
note("start")
time.sleep(float(os.environ.get("PAL_STAGE_SECONDS", "2")))
acc = 40 + p["solve"]["width"] / 100 + p["solve"]["eta"]
row = {"acc": {"mean": acc, "std": 1.0, "runs": []},
       "fg": {"mean": acc / 10, "std": 0.5, "runs": []}}
os.makedirs("results/demo", exist_ok=True)
m = {"runs": p["protocol"]["runs"], "vary": [], "pal": row, "bp": row}
json.dump(m, open("results/demo/metrics.json", "w"))
note("end")
"""

DVC_YAML = {
    "stages": {
        "evaluate": {
            "cmd": "python3 stage.py",
            "deps": ["stage.py"],
            "params": ["solve", "protocol", "pipelines"],
            "metrics": [{"results/demo/metrics.json": {"cache": False}}],
        }
    }
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def make_project(path: Path) -> Path:
    path.mkdir()
    (path / "params.yaml").write_text(yaml.safe_dump(committed_params()))
    (path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    (path / "stage.py").write_text(STAGE)
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=path, check=True)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "project")
    return path


def records(path: Path) -> list[tuple[str, str, str, float]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(what, cell, gpu, float(t)) for what, cell, gpu, t in rows]


def spans(
    recs: list[tuple[str, str, str, float]],
) -> dict[str, tuple[str, float, float]]:
    """cell -> (gpu, start, end) of the runs that ended."""
    starts = {(c, g): t for what, c, g, t in recs if what == "start"}
    return {c: (g, starts[c, g], t) for what, c, g, t in recs if what == "end"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "DVC_NO_ANALYTICS": "1",
        "PAL_RECORD": str(tmp_path / "record.txt"),
    }


def test_gpu_lists_and_the_wall_time_on_several_cards() -> None:
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    assert parse_gpus("0,0") == ["0", "0"]  # two workers on card 0
    assert parse_gpus("") is None and parse_gpus(None) is None
    with pytest.raises(GpuListError, match=r"--gpus: .* got 'a,1' \('a' is not one\)"):
        parse_gpus("a,1")
    assert wall_hours([3.0, 3.0, 2.0, 2.0, 2.0], 1) == 12.0
    assert wall_hours([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0  # 3+2+2 | 3+2
    assert wall_hours([5.0, 1.0], 8) == 5.0  # never below the longest cell


@pytest.mark.slow
def test_each_cell_runs_once_on_one_card_the_cards_in_parallel(
    tmp_path: Path, env: dict[str, str]
) -> None:
    pinned = make_project(tmp_path / "pinned")
    out = pal_paper(pinned, env, "run", "upsampling", "--gpus", "3,5")
    assert out.returncode == 0, out.stderr
    assert "worker 1 started on GPU 3" in out.stderr
    assert "worker 2 started on GPU 5" in out.stderr
    recs = records(tmp_path / "record.txt")
    cols = RESULTS["upsampling"].columns(committed_params(), None)
    ran = spans(recs)
    assert len(ran) == len(cols) == 5
    assert [what for what, *_ in recs].count("start") == 5  # each cell once
    assert {g for g, _, _ in ran.values()} == {"3", "5"}  # on one id each, both ids
    by_card = {g: [(s, e) for gg, s, e in ran.values() if gg == g] for g in ("3", "5")}
    assert any(
        s3 < e5 and s5 < e3 for s3, e3 in by_card["3"] for s5, e5 in by_card["5"]
    ), ran  # the two cards ran cells at the same time

    single = make_project(tmp_path / "single")
    solo_env = dict(env, PAL_RECORD=str(tmp_path / "solo.txt"))
    out = pal_paper(single, solo_env, "run", "upsampling", "-j", "1")
    assert out.returncode == 0, out.stderr
    assert {g for g, _, _ in spans(records(tmp_path / "solo.txt")).values()} == {"none"}
    table = "results/paper/demo/upsampling.md"
    first = (pinned / table).read_text().splitlines()
    second = (single / table).read_text().splitlines()
    assert first[1:] == second[1:]  # line 0, the caption, names the commit
    assert len(first) == 4 + 5


@pytest.mark.slow
def test_a_worker_killed_mid_cell_and_a_rerun_completes_the_grid(
    tmp_path: Path, env: dict[str, str]
) -> None:
    repo = make_project(tmp_path / "project")
    slow = dict(env, PAL_STAGE_SECONDS="6")
    out = pal_paper(repo, slow, "run", "upsampling", "--gpus", "0,1", "--no-wait")
    assert out.returncode == 0, out.stderr
    record = tmp_path / "record.txt"
    deadline = time.time() + 120
    while not any(g == "1" for what, _, g, _ in records(record) if what == "start"):
        assert time.time() < deadline, "no cell started on card 1"
        time.sleep(0.5)
    pid_file = repo / ".dvc/tmp/exps/celery/pal-gpu-1.pid"
    pid = int(pid_file.read_text().split()[0])
    os.killpg(pid, signal.SIGKILL)  # the worker and its cell, mid-cell
    killed = [c for what, c, g, _ in records(record) if what == "start" and g == "1"]

    survivor = int((repo / ".dvc/tmp/exps/celery/pal-gpu-0.pid").read_text().split()[0])

    out = pal_paper(repo, env, "run", "upsampling", "--gpus", "0,1")
    assert out.returncode == 0, out.stderr
    # the grid done, no worker is left: the one beside the killed one too (it
    # can hang in its warm shutdown; else it exited by itself); pid files gone
    assert not list((repo / ".dvc/tmp/exps/celery").glob("pal-gpu-*.pid"))
    assert not group_alive(survivor) and not group_alive(pid)
    assert "was interrupted (its process is gone): queued again" in out.stderr or (
        "lost its process: queued again" in out.stderr
    ), out.stderr
    ran = spans(records(record))
    assert len(ran) == 5  # every cell finished
    assert killed[0] in ran
    lines = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert len(lines) == 4 + 5
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    assert len(refs) == 5  # one experiment per cell, the killed one included
    for ref in refs:
        m = json.loads(git(repo, "show", f"{ref}:results/demo/metrics.json"))
        assert f"| {m['pal']['acc']['mean']:.2f} ± 1.00 |" in "\n".join(lines)


@pytest.mark.slow
def test_ctrl_c_ends_every_worker_and_a_rerun_resumes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Ctrl-C in a terminal; SIGTERM, a batch scheduler's stop, is the same
    stop: a row of the fault table (tests/test_faults.py)."""
    sent = signal.SIGINT
    repo = make_project(tmp_path / "project")
    record = tmp_path / "record.txt"
    proc = subprocess.Popen(
        [str(BIN / "pal-paper"), "run", "upsampling", "--gpus", "0,1"],
        cwd=repo,
        env=dict(env, PAL_STAGE_SECONDS="6"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as typed in a terminal: a test run in the background (`make test &`)
        # would hand on an ignored SIGINT, and Python keeps it ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while len({g for what, _, g, _ in records(record) if what == "start"}) < 2:
        assert time.time() < deadline, "the two cards never both ran a cell"
        time.sleep(0.5)
    pids = [
        int(p.read_text().split()[0])
        for p in sorted((repo / ".dvc/tmp/exps/celery").glob("pal-gpu-*.pid"))
    ]
    assert len(pids) == 2
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.splitlines()[-1] == (
        "Error: interrupted: the grid's workers and their cells were stopped; "
        "finished cells are kept, `pal-paper run upsampling` runs the rest"
    )
    time.sleep(1.0)
    assert not any(group_alive(pid) for pid in pids)  # no worker, no cell of it
    ended = len(spans(records(record)))
    assert ended < 5  # stopped mid-grid

    out = pal_paper(repo, env, "run", "upsampling", "--gpus", "0,1")
    assert out.returncode == 0, out.stderr
    assert f"{ended} finished before (kept)" in out.stderr
    assert len(spans(records(record))) == 5
