"""palbench/gpu_check.py as it runs on a GPU box: the project on PYTHONPATH, no
dvc on PATH, started from outside the repository; here at its smallest scale
on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import committed

from palbench import gpu_check
from palpaper.grids import RESULTS
from palpaper.plan import plan_report

ROOT = Path(__file__).resolve().parents[1]

# the pixel cache and the frozen queries once per dataset, read by tune and extract
ONCE = ["prepare", "pixels", "frozen", "tune", "extract", "solve", "evaluate"]
NAMES = ["palcore", "pipeline", "solver", "params.yaml", "contracts.yaml"]


def archived(commit: str, folder: Path) -> Path:
    """`git archive commit` of the project's code into `folder`/baseline: an
    older tree, made by `--baseline COMMIT`'s own code."""
    return gpu_check.gpu_paths.baseline_tree(commit, folder)


def gpu_tests() -> int:
    """How many tests are marked gpu (pytest's own collection of them)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu"]
    cmd += ["-p", "no:cacheprovider", str(ROOT / "tests")]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout
    return sum(line.startswith("tests/") for line in out.splitlines())


@pytest.mark.slow
def test_gpu_check_at_its_smallest_scale_writes_the_report(tmp_path):
    """Before and after are two trees: the committed one archived (the
    baseline) and this one, each measured by its own processes."""
    baseline = archived("HEAD", tmp_path)
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    cmd = [
        *(sys.executable, "-m", "palbench.gpu_check"),
        *("--scale", "smallest", "--device", "cpu", "--out", str(out)),
        *("--parts", "tests,solver,paths,rehearsal,cells", "--jobs", "1,2"),
        *("--baseline", str(baseline), "--workdir", str(tmp_path / "work")),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "cells.log",
        "gpu_tests.log",
        "rehearsal-before.log",
        "rehearsal.log",
        "report.json",
        "report.md",
        "solver.log",
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["scale"] == "smallest" and report["versions"]["card"] is None
    assert report["baseline"] == str(baseline)
    # without a GPU every test marked gpu is skipped, all others deselected
    # (and test_dvc_deps.py as a whole where dvc is not installed)
    skipped = gpu_tests() + (importlib.util.find_spec("dvc") is None)
    assert report["tests"]["exit"] == 0
    assert report["tests"]["summary"].startswith(f"{skipped} skipped, ")
    solver = report["solver"]
    assert (solver["exit"], solver["rows"], solver["width"]) == (0, 2000, 1024)
    assert solver["backend"] == "NumPy (solve.device cpu)"
    rehearsal, before = report["rehearsal"], report["rehearsal_before"]
    assert rehearsal["exit"] == 0 and before["exit"] == 0
    # each rehearsal ran its own tree's code
    assert rehearsal["setup"]["tree"] == str(ROOT)
    assert before["setup"]["tree"] == str(baseline)
    for r in (rehearsal, before):
        assert list(r["stages"]) == ONCE
        # tune reads the stored queries: no frozen pass of its own
        assert r["queries"]["seconds"] == 0.0
        assert r["setup"]["runner"] == "direct"  # no dvc on PATH
        assert r["setup"]["photos"] == 11 * 3 - 1 + 11 * 2
        assert r["train_samples"] == 10 * 3  # the smallest class dropped
        assert set(r["projections"]) == {"UPMC-Food101", "N24News"}
    # before and after: the image path in one process per tree, same photos
    paths = report["paths"]
    assert paths["exit"] == 0 and list(paths["paths"]) == ["before", "after"]
    old, new = paths["paths"]["before"], paths["paths"]["after"]
    assert (old["tree"], new["tree"]) == (str(baseline), str(ROOT))
    # the same code on the same inputs: the same batches and features
    assert old["extract"]["bytes_per_batch"] == new["extract"]["bytes_per_batch"]
    assert old["extract"]["syncs_per_batch"] == new["extract"]["syncs_per_batch"]
    assert paths["feature_cosine_min"] >= 0.9999
    # plan all's tunings and extractions, priced at each tree's projection
    # (the default route's: the baselines measured)
    tunings, extractions = report["plan"]["counts"]
    food = yaml.safe_load(committed("configs/food101.yaml"))
    (grid,) = plan_report(list(RESULTS), food, None, "food101")["datasets"]
    rows = grid["routes"]["measured"]["results"]
    assert tunings == sum(r["tunings"] for r in rows) > 0
    assert extractions == sum(r["extractions"] for r in rows) > 0
    assert set(report["plan"]["paths"]) == {"before", "after"}
    for p in report["plan"]["paths"].values():
        minutes = tunings * p["tune_min"] + extractions * p["extract_min"]
        assert p["plan_all_h"] == round((minutes + p["once_min"]) / 60, 1)
        assert p["once_min"] > 0.0
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
    assert (
        "## Rehearsal: one run of PAL on a Food101-shaped tree (before: the "
        "--baseline tree)" in md
    )
    assert "## The image path, before (--baseline) and after" in md
    assert "## Several cells on one card (`pal-paper run -j N`)" in md


def test_a_baseline_commit_is_archived_into_the_workdir(tmp_path):
    """--baseline COMMIT: the commit's code, not the workspace's."""
    tree = gpu_check.gpu_paths.baseline_tree("HEAD", tmp_path)
    assert tree == tmp_path / "baseline"
    assert sorted(p.name for p in tree.iterdir()) == sorted(NAMES)
    committed = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD:pipeline/model/method.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (tree / "pipeline/model/method.py").read_text() == committed
    assert gpu_check.gpu_paths.baseline_tree(None, tmp_path) is None
    assert gpu_check.gpu_paths.baseline_tree(str(tree), tmp_path) == tree


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
def test_the_contracts_part_compares_the_fixture_twice_and_with_the_reference(
    tmp_path,
):
    """On a GPU it shows whether the card repeats its outputs and how far they
    are from the CPU's reference, by the rule for the same output; here on
    the CPU, the same."""
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    cmd = [
        sys.executable,
        *("-m", "palbench.gpu_check"),
        *("--parts", "contracts", "--units", "tune.pal", "--device", "cpu"),
        *("--out", str(out), "--workdir", str(tmp_path / "w")),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    c = json.loads((out / "report.json").read_text())["contracts"]
    jobs = ["tune/pal", "tune/pal-decode", "tune/pal-resume"]
    assert (c["exit"], c["device"], c["jobs"]) == (0, "cpu", 3)
    judged = {"identical": jobs, "within_gpu_rtol": [], "differ": {}}
    assert c["repeat"] == c["reference"] == judged
    md = (out / "report.md").read_text()
    for title in ("the same code twice", "against reference/"):
        assert (
            f"- {title}: 3 of 3 jobs the same (floats within 0.0001 of "
            "their scale), 0 within the card's 0.02"
        ) in md
