"""bench/gpu_check.py as it runs on a GPU box: the project on PYTHONPATH, no
dvc on PATH, started from outside the repository; here at its smallest scale
on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402

STAGES = ["prepare", "tune", "extract", "solve", "evaluate"]
# after: the pixel cache and the frozen queries once per dataset, read by tune
# and extract; before (the legacy path): as the pipeline ran without them
ONCE = ["prepare", "pixels", "frozen", "tune", "extract", "solve", "evaluate"]


@pytest.mark.slow
def test_gpu_check_at_its_smallest_scale_writes_the_report(tmp_path):
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--scale",
           "smallest", "--device", "cpu", "--out", str(out),
           "--parts", "tests,solver,paths,rehearsal,cells", "--jobs", "1,2",
           "--workdir", str(tmp_path / "work")]  # fmt: skip
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "cells.log",
        "gpu_tests.log",
        "rehearsal-legacy.log",
        "rehearsal.log",
        "report.json",
        "report.md",
        "solver.log",
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["scale"] == "smallest" and report["versions"]["card"] is None
    # without a GPU every test marked gpu is skipped, all others deselected
    # (and test_dvc_deps.py as a whole where dvc is not installed)
    skipped = 9 + (importlib.util.find_spec("dvc") is None)
    assert report["tests"]["exit"] == 0
    assert report["tests"]["summary"].startswith(f"{skipped} skipped, ")
    solver = report["solver"]
    assert (solver["exit"], solver["rows"], solver["width"]) == (0, 2000, 1024)
    assert solver["backend"] == "NumPy (solve.device cpu)"
    rehearsal = report["rehearsal"]
    assert rehearsal["exit"] == 0 and list(rehearsal["stages"]) == ONCE
    assert list(report["rehearsal_legacy"]["stages"]) == STAGES
    # the new path's tune reads the stored queries: no frozen pass of its own
    assert rehearsal["queries"]["seconds"] == 0.0
    assert report["rehearsal_legacy"]["queries"]["seconds"] > 0
    assert rehearsal["setup"]["runner"] == "direct"  # no dvc on PATH
    assert rehearsal["setup"]["photos"] == 11 * 3 - 1 + 11 * 2
    assert rehearsal["train_samples"] == 10 * 3  # the smallest class dropped
    assert set(rehearsal["projections"]) == {"UPMC-Food101", "N24News"}
    # before and after: the image path in one process, a rehearsal per path
    paths = report["paths"]
    assert paths["exit"] == 0 and list(paths["paths"]) == ["legacy", "new"]
    legacy, new = paths["paths"]["legacy"], paths["paths"]["new"]
    # uint8 against float32 + int64 mask: 3 bytes a canvas position against 20
    assert legacy["extract"]["bytes_per_batch"] > 6 * new["extract"]["bytes_per_batch"]
    assert new["extract"]["syncs_per_batch"] < legacy["extract"]["syncs_per_batch"]
    assert paths["feature_cosine_min"] >= 0.9999
    assert report["rehearsal_legacy"]["exit"] == 0
    # plan all's tunings and extractions, priced at each path's projection
    tunings, extractions = report["plan"]["counts"]
    assert tunings > 0 and extractions > 0
    assert set(report["plan"]["paths"]) == {"legacy", "new"}
    for p in report["plan"]["paths"].values():
        minutes = tunings * p["tune_min"] + extractions * p["extract_min"]
        assert p["plan_all_h"] == round((minutes + p["once_min"]) / 60, 1)
    assert report["plan"]["paths"]["legacy"]["once_min"] == 0.0
    assert report["plan"]["paths"]["new"]["once_min"] > 0.0
    # several cells on one device: 1, then 2 tunes side by side, each on its
    # own folder; every training sample of both counted
    cells = report["cells"]
    assert cells["exit"] == 0 and list(cells["jobs"]) == ["1", "2"]
    one, two = cells["jobs"]["1"], cells["jobs"]["2"]
    assert one["speedup"] == 1.0 and two["samples_per_s"] > 0
    assert round(two["samples_per_s"] / one["samples_per_s"], 2) == two["speedup"]
    md = (out / "report.md").read_text().splitlines()
    assert md[0] == "# GPU check on no GPU (CPU only)"
    assert "## Rehearsal: one run of PAL on a Food101-shaped tree" in md
    assert "## The image path, before (legacy) and after" in md
    assert "## Several cells on one card (`pal-paper run -j N`)" in md


def test_missing_packages_are_named_in_one_line():
    needed = {"numpy": "numpy", "no_such_module_xyz": "no-such-dist"}
    assert gpu_check.missing_packages(needed) == ["no-such-dist"]
    assert gpu_check.missing_line(["h5py", "click"]) == (
        "gpu_check: missing h5py, click; on a machine with a registry run "
        '`make wheels PACKAGES="h5py click"`, send wheels/ with the tree (carry '
        "it) and first run `python3 -m pip install --no-index --find-links wheels "
        "h5py click`"
    )


def test_versions_older_than_the_known_good_ones_are_refused():
    assert gpu_check._older("2.10.1+cu128", "2.11.0")
    assert not gpu_check._older("2.11.0+cu130", "2.11.0")
    assert not gpu_check._older("5.24.0", "5.17.0")


def test_unknown_part_is_one_line(tmp_path, capsys):
    assert gpu_check.main(["--parts", "tests,gpu", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "gpu_check: --parts: unknown part 'gpu'\n"


@pytest.mark.slow
def test_the_contracts_part_compares_the_fixture_twice_and_with_a_baseline(tmp_path):
    """On a GPU it shows whether the card repeats its bytes and how far an
    older tree's outputs are; here on the CPU, both byte for byte."""
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    names = ["palcore", "pipeline", "solver", "params.yaml", "contracts.yaml"]
    tree = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", *names],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(baseline)], input=tree, check=True)
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "gpu_check.py"),
        "--parts",
        "contracts",
        "--units",
        "tune.pal",
        "--device",
        "cpu",
        "--baseline",
        str(baseline),
        "--out",
        str(out),
        "--workdir",
        str(tmp_path / "w"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    c = json.loads((out / "report.json").read_text())["contracts"]
    jobs = ["tune/pal", "tune/pal-decode", "tune/pal-resume"]
    assert (c["exit"], c["device"], c["jobs"]) == (0, "cpu", 3)
    assert c["repeat"] == {"identical": jobs, "differ": {}}
    assert c["baseline"] == {"identical": jobs, "differ": {}}
    assert "- the same code twice: 3 of 3 jobs byte-identical" in (
        (out / "report.md").read_text()
    )
