"""The slow scenes of tests/test_faults.py: faults met by real runs of the
commands, in subprocesses. Each injects its fault, runs the command a user
runs, applies the repair the command's line names, runs the same command
again, and returns what the table checks: the first run (its exit status
and the line it printed) and the (rerun output, clean reference) pairs that
must hold the same bytes.

- A full disk (a small tmpfs: needs root, as the project's CI and GPU
  containers run) in `pal pixels`, `pal extract` and `pal-solver solve`;
- a damaged image name in `pixels.h5` (outside the pixels' checksums);
- SIGTERM, a batch scheduler's stop, to `pal-paper run` with two workers
  (a project whose one stage stands in for the pipeline, DVC's real queue).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from pipeline.stages import contract_runs as runs

ROOT = Path(__file__).resolve().parents[1]
REF_JOBS = ("pixels/food101", "pixels/demo", "frozen/demo", "tune/pal", "extract/pal")


@dataclass
class Made:
    """The contracts' fixture inputs and a clean run of REF_JOBS on them."""

    inputs: Path
    ref: Path  # the clean outputs, by job name
    params: dict[str, Path]  # params file by fixture dataset


def make(root: Path) -> Made:
    inputs = root / "inputs"
    runs.build_inputs(ROOT, inputs)
    ref = runs.Version(ROOT, root / "ref")
    jobs = [j for j in runs.jobs() if j.name in REF_JOBS]
    runs.run_version(ref, jobs, inputs)
    return Made(inputs, ref.work, _absolute(ref.params))


def _absolute(params: dict[str, Path]) -> dict[str, Path]:
    """The fixture's params with their paths absolute: they are relative to
    the folder its jobs run in, and the fault commands run elsewhere."""
    for path in params.values():
        raw = yaml.safe_load(path.read_text())
        for section, key in (("data", "root"), ("model", "backbone")):
            raw[section][key] = str((path.parent.parent / raw[section][key]).resolve())
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return params


@dataclass
class Outcome:
    first: subprocess.CompletedProcess  # the run that met the fault
    same: list[tuple[Path, Path]] = field(default_factory=list)  # after repair
    notes: list[str] = field(default_factory=list)  # other lines it must print


def command(tool: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", tool, *map(str, args)],
        capture_output=True,
        text=True,
        **kw,
    )


# ------------------------------------------------------------ a full disk


class Tmpfs:
    """A tmpfs mounted at `where`, resized by `size(kB)`; unmounted by close."""

    def __init__(self, where: Path) -> None:
        self.where = where
        where.mkdir()

    def size(self, kb: int) -> Path:
        opts = f"remount,size={kb}k" if self.mounted() else f"size={kb}k"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.where)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        return self.where

    def mounted(self) -> bool:
        return f" {self.where} " in Path("/proc/mounts").read_text()

    def close(self) -> None:
        if self.mounted():
            subprocess.run(["umount", str(self.where)], check=True)


def pixels_full(made: Made, scratch: Path, disk: Tmpfs) -> Outcome:
    out = disk.size(300) / "pixels"
    args = ("pixels", "--params", made.params["food101"], "--out", out)
    first = command("pipeline", *args)
    assert list(out.iterdir()) == []  # no temporary file left
    disk.size(4096)  # the repair: free space there
    assert command("pipeline", *args).returncode == 0
    return Outcome(first, [(out, made.ref / "pixels/food101")])


def extract_args(made: Made, out: Path, pixels: Path | None = None) -> list:
    """Run with `cwd=made.ref`: the tuning's checkpoint names its backbone
    relative to the folder the fixture's jobs ran in."""
    ref = made.ref
    return [
        "extract",
        "--params",
        made.params["demo"],
        "--variant",
        "pal",
        "--prepare",
        made.inputs / "prepare/demo",
        "--tune",
        ref / "tune/pal",
        "--pixels",
        pixels or ref / "pixels/demo",
        "--frozen",
        ref / "frozen/demo",
        "--out",
        out,
    ]


def extract_full(made: Made, scratch: Path, disk: Tmpfs) -> Outcome:
    out = disk.size(48) / "extract"  # step 1's shards fit, step 2's do not
    args = extract_args(made, out)
    first = command("pipeline", *args, cwd=made.ref)
    partial = out.with_name("extract.partial")
    assert sorted(p.name for p in (partial / "step_01").iterdir()) == [
        "SHA256SUMS",
        "test.h5",
        "train.h5",
    ]  # its finished step kept
    assert not list(partial.rglob(".*.tmp.*"))
    disk.size(1024)
    again = command("pipeline", *args, cwd=made.ref)
    assert again.returncode == 0, again.stderr
    return Outcome(
        first,
        [(out, made.ref / "extract/pal")],
        ["reused steps 1 of an interrupted run"],
    )


def solve_full(made: Made, scratch: Path, disk: Tmpfs) -> Outcome:
    def args(out: Path) -> tuple:
        return (
            "solve",
            "--params",
            made.params["demo"],
            "--features",
            made.ref / "extract/pal",
            "--out",
            out,
            "--eta",
            "1",
            "--width",
            "8192",
            "--device",
            "cpu",
        )

    out = disk.size(100) / "solve"
    first = command("solver", *args(out))
    assert not list(out.iterdir())  # no temporary file left
    disk.size(65536)
    again = command("solver", *args(out))
    assert again.returncode == 0, again.stderr
    clean = command("solver", *args(scratch / "solve-ref"))
    assert clean.returncode == 0, clean.stderr
    return Outcome(first, [(out, scratch / "solve-ref")])


# ------------------------------------------------------------ pixels.h5 names


def pixels_name_damaged(made: Made, scratch: Path, disk: Tmpfs) -> Outcome:
    """One bit of an image name flipped, the names still in order (outside a
    DVC project, where no md5 was recorded): the reader that wants the image
    finds its name one byte away and says the cache is damaged, naming
    `pal pixels`; rerun, it gives the clean bytes, and extract the clean
    features."""
    import shutil

    pixels = scratch / "pixels"
    shutil.copytree(made.ref / "pixels/demo", pixels)
    path = pixels / "pixels.h5"
    data = bytearray(path.read_bytes())
    names = sorted(p.name for p in (made.inputs / "demo").rglob("*.png"))
    at = data.find(names[0].encode())
    assert at > 0
    data[at] ^= 0x1D  # t -> i: the class folder's names stay in order
    path.write_bytes(bytes(data))
    out = scratch / "extract"
    args = extract_args(made, out, pixels)
    first = command("pipeline", *args, cwd=made.ref)
    assert not out.exists()
    params = made.params["demo"]
    assert (
        command("pipeline", "pixels", "--params", params, "--out", pixels).returncode
        == 0
    )
    again = command("pipeline", *args, cwd=made.ref)
    assert again.returncode == 0, again.stderr
    return Outcome(
        first,
        [(pixels, made.ref / "pixels/demo"), (out, made.ref / "extract/pal")],
    )


# ------------------------------------------------------------ SIGTERM to a grid


def sigterm_grid(made: Made, scratch: Path, disk: Tmpfs) -> Outcome:
    """SIGTERM while both workers run a cell; the rerun resumes, and the
    table it renders is that of a grid run without a stop."""
    from test_paper_gpus import make_project, records, spans

    from palpaper.workers import group_alive

    root = scratch / "grid"
    root.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "DVC_NO_ANALYTICS": "1",
        "PAL_RECORD": str(root / "record.txt"),
    }
    bin_ = Path(sys.executable).parent
    repo = make_project(root / "stopped")
    proc = subprocess.Popen(
        [str(bin_ / "pal-paper"), "run", "upsampling", "--gpus", "0,1"],
        cwd=repo,
        env=dict(env, PAL_STAGE_SECONDS="6"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while len({g for w, _, g, _ in records(root / "record.txt") if w == "start"}) < 2:
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(
                f"the two cards never both ran a cell: {proc.communicate()}"
            )
        time.sleep(0.5)
    pids = [
        int(p.read_text().split()[0])
        for p in sorted((repo / ".dvc/tmp/exps/celery").glob("pal-gpu-*.pid"))
    ]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)  # reaped: no zombie left
    first = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    time.sleep(1.0)
    assert len(pids) == 2 and not any(group_alive(pid) for pid in pids)
    ended = len(spans(records(root / "record.txt")))
    again = subprocess.run(
        [str(bin_ / "pal-paper"), "run", "upsampling", "--gpus", "0,1"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    assert f"{ended} finished before (kept)" in again.stderr
    clean = make_project(root / "clean")
    done = subprocess.run(
        [str(bin_ / "pal-paper"), "run", "upsampling"],
        cwd=clean,
        env=dict(env, PAL_STAGE_SECONDS="0"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    table = "results/paper/demo/upsampling.md"
    return Outcome(first, [(repo / table, clean / table)])


Scenario = Callable[[Made, Path, Tmpfs], Outcome]
