"""A full disk is one line: `pal pixels`, `pal extract` and `pal-solver solve`
writing onto a small tmpfs end with the file, the space it needs and the
space free when it began, exit 1, no temporary file left (HDF5 segfaulted
here before), extract's finished steps kept; with room again, the same
command gives the bytes of a run that never met a full disk.

Needs root (to mount the tmpfs), as the project's CI and GPU containers run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.stages import contract_runs as runs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # the fixture's inputs, tune and extract: ~30 s
FULL = (
    r"^Error: {path}: the disk is full \(it needs about [0-9.]+ [kM]?B; "
    r"[0-9.]+ [kM]?B were free when it began\): free space there and rerun$"
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The contracts' fixture inputs, and pixels, frozen, tune and extract of
    the demo on an ordinary disk: the bytes a run without a full disk gives."""
    root = tmp_path_factory.mktemp("full")
    inputs = root / "inputs"
    runs.build_inputs(ROOT, inputs)
    ref = runs.Version(ROOT, root / "ref")
    jobs = [j for j in runs.jobs() if j.name in REF_JOBS]
    runs.run_version(ref, jobs, inputs, ref, None)
    return {"root": root, "inputs": inputs, "ref": ref.work, "params": ref.params}


REF_JOBS = ("pixels/food101", "pixels/demo", "frozen/demo", "tune/pal", "extract/pal")


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A tmpfs mounted at tmp_path/disk, sized by the test (`size(kB)`)."""
    where = tmp_path / "disk"
    where.mkdir()

    def size(kb: int) -> Path:
        opts = f"size={kb}k" if not _mounted(where) else f"remount,size={kb}k"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        return where

    yield size
    if _mounted(where):
        subprocess.run(["umount", str(where)], check=True)


def _mounted(path: Path) -> bool:
    return str(path) in Path("/proc/mounts").read_text()


def _pal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True
    )


def _last(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1]


def test_pixels_on_a_full_disk(made, tmpfs) -> None:
    disk = tmpfs(300)
    out = disk / "pixels"
    params = str(made["params"]["food101"])
    done = _pal("pixels", "--params", params, "--out", str(out))
    assert done.returncode == 1, done.stderr
    assert re.match(FULL.format(path=re.escape(str(out / "pixels.h5"))), _last(done))
    assert "Traceback" not in done.stderr
    assert list(out.iterdir()) == []  # no temporary file left
    tmpfs(4096)  # room again: the same command, the same bytes
    assert _pal("pixels", "--params", params, "--out", str(out)).returncode == 0
    ref = made["ref"] / "pixels/food101/pixels.h5"
    assert (out / "pixels.h5").read_bytes() == ref.read_bytes()


def test_extract_on_a_full_disk_keeps_its_finished_steps(made, tmpfs) -> None:
    disk = tmpfs(48)  # step 1's shards fit, step 2's do not
    out = disk / "extract"
    ref = made["ref"]
    args = [
        "extract",
        "--params",
        str(made["params"]["demo"]),
        "--variant",
        "pal",
        "--prepare",
        str(made["inputs"] / "prepare/demo"),
        "--tune",
        str(ref / "tune/pal"),
        "--pixels",
        str(ref / "pixels/demo"),
        "--frozen",
        str(ref / "frozen/demo"),
        "--out",
        str(out),
    ]
    done = _pal(*args)
    assert done.returncode == 1, done.stderr
    partial = disk / "extract.partial"
    step2 = partial / "step_02" / "train.h5"
    assert re.match(FULL.format(path=re.escape(str(step2))), _last(done))
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in (partial / "step_01").iterdir()) == [
        "SHA256SUMS",
        "test.h5",
        "train.h5",
    ]
    assert not [p for p in partial.rglob(".*.tmp.*")]
    tmpfs(1024)
    again = _pal(*args)
    assert again.returncode == 0, again.stderr
    assert "reused steps 1 of an interrupted run" in again.stderr
    for name in (
        "step_01/train.h5",
        "step_01/test.h5",
        "step_02/train.h5",
        "step_02/test.h5",
    ):
        assert (out / name).read_bytes() == (ref / "extract/pal" / name).read_bytes()


def test_solve_on_a_full_disk_leaves_no_temporary_file(made, tmpfs) -> None:
    disk = tmpfs(100)
    out = disk / "solve"
    args = [
        "solve",
        "--params",
        str(made["params"]["demo"]),
        "--features",
        str(made["ref"] / "extract/pal"),
        "--out",
        str(out),
        "--eta",
        "1",
        "--width",
        "8192",
        "--device",
        "cpu",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "solver", *args], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert re.match(FULL.format(path=re.escape(str(out / "weights.h5"))), _last(done))
    assert not list(out.iterdir())
