"""The DVC pipeline end to end, with real `dvc` in a temporary git repository.

A copy of the project (code, dvc.yaml) with tiny params and 2 runs runs `dvc
repro`; then a change to `solve.eta` must rerun only the analytic stage
(`solve` and `evaluate`, each once for every run and variant), reusing the
cached features, and a second `dvc repro` must do nothing.

The module reproduces one project and commits its lock and results; every
test that changes something works in its own clone sharing that cache, so
the tests hold in any order.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import PAL_JOINT, pal_paper
from scratch_project import BIN, TINY, make_scratch_project

pytestmark = pytest.mark.slow  # a real `dvc repro` of every stage: about 3 minutes

STAGES = (
    "demo",
    "prepare",
    "contracts",
    "pixels",
    "frozen",
    "tune",
    "extract",
    "solve",
    "evaluate",
)
GPU_STAGES = {"pixels", "frozen", "tune", "extract"}  # keyed on their contracts
# a comment in one file of each folder of code: no GPU stage may rerun
COMMENTED = (
    "palcore/errors.py",
    "pipeline/data/loader.py",
    "pipeline/model/encoder.py",
    "pipeline/methods/pal.py",
    "pipeline/stages/tune.py",
    "solver/rls.py",
    "palpaper/plan.py",
)
RUNS = (0, 1)
VARIANTS = ("pal", "init", "frozen")


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out}"
    return out


def _ran(output: str) -> set[str]:
    """Stage names without their @run/variant, of the stages that ran."""
    return {
        s
        for s in STAGES
        if f"Running stage '{s}'" in output or f"Running stage '{s}@" in output
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    path = tmp_path_factory.mktemp("pipeline")
    env = make_scratch_project(path, TINY)
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == set(STAGES), out
    _run(["git", "add", "-A"], path, env)
    _run(["git", "commit", "-qm", "repro"], path, env)
    return path, env


@pytest.fixture
def work(
    repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> tuple[Path, dict[str, str]]:
    """A clone of the reproduced project at its commit, outputs checked out
    from the shared cache: a test may change it freely."""
    path, env = repo
    clone = tmp_path / "work"
    _run(["git", "clone", "-q", str(path), str(clone)], tmp_path, env)
    _run(
        [str(BIN / "dvc"), "cache", "dir", "--local", str(path / ".dvc/cache")],
        clone,
        env,
    )
    _run([str(BIN / "dvc"), "checkout", "-q", "dvc.yaml"], clone, env)
    return clone, dict(env, PYTHONPATH=str(clone))


def test_repro_writes_results(repo: tuple[Path, dict[str, str]]) -> None:
    path, _ = repo
    for name in (
        "metrics.json",
        "table.md",
        "table.csv",
        "accuracy_matrix.csv",
        "accuracy_matrix.png",
        "accuracy_matrix.pdf",
        "step_accuracy.csv",
        "step_accuracy.png",
        "step_accuracy.pdf",
        "headline/pal.json",
    ):
        assert (path / "results/demo" / name).stat().st_size > 0, name
    for variant in VARIANTS:
        for run in RUNS:
            for step in ("step_01", "step_02"):
                assert (
                    path / f"data/extract/{variant}/{run}/{step}/train.h5"
                ).is_file()
            assert (path / f"data/solve/{variant}/{run}/weights.h5").is_file()
    metrics = json.loads((path / "results/demo/metrics.json").read_text())
    assert metrics["runs"] == list(RUNS)
    assert set(metrics) == {"runs", "vary", "pal", "bp", "init", "frozen"}
    assert len(metrics["pal"]["acc"]["runs"]) == len(RUNS)


def test_second_repro_runs_nothing(work: tuple[Path, dict[str, str]]) -> None:
    path, env = work
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == set(), out
    assert "Data and pipelines are up to date." in out


def test_comment_edits_rerun_no_gpu_stage_nor_a_grid_cell(
    work: tuple[Path, dict[str, str]],
) -> None:
    """A comment in a file of each folder of code: the cheap stages whose code
    it is rerun (to the same bytes), the GPU stages do not, and a grid cell
    queued afterwards runs only its analytic stages."""
    path, env = work
    dvc = str(BIN / "dvc")
    for rel in COMMENTED:
        with (path / rel).open("a") as f:
            f.write("\n# a note that changes no code\n")
    pal = path / "pipeline/methods/pal.py"  # and a docstring: no code either
    pal.write_text(pal.read_text().replace('"""', '"""A docstring edited. ', 1))
    dry = _run([dvc, "repro", "--dry"], path, env)
    assert _ran(dry) == {"demo", "prepare", "contracts", "solve", "evaluate"}, dry
    out = _run([dvc, "repro"], path, env)
    assert not _ran(out) & GPU_STAGES, out
    assert _run(["git", "status", "--porcelain", "results"], path, env) == ""
    _run(["git", "commit", "-qam", "comments"], path, env)
    _run([dvc, "exp", "run", "--queue", "-S", "solve.eta=0.5"], path, env)
    heads = ["-S", "solve.heads=[ridge,ridge_all,ncm]"]  # the heads: analytic too
    _run([dvc, "exp", "run", "--queue", *heads, "-n", "heads"], path, env)
    out = _run([dvc, "exp", "run", "--run-all"], path, env)
    assert re.findall(r"Running stage '(\w+)'", out) == ["solve", "evaluate"] * 2, out
    refs = _run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], path, env)
    ref = next(r for r in refs.split() if r.endswith("/heads"))
    table = _run(["git", "show", f"{ref}:results/demo/heads.md"], path, env)
    scores = table.split("\n\n")[0]  # the η per step follow, apart
    rows = re.findall(r"^\| (\w+) \| (\w+) \| \d", scores, re.M)
    assert [head for variant, head in rows if variant == "pal"] == [
        "ncm",
        "ridge",
        "ridge_all",
    ], table


def test_an_edit_of_pal_stops_repro_then_a_raise_retunes_its_chains(
    work: tuple[Path, dict[str, str]],
) -> None:
    """What a method researcher meets: never the old features reused silently
    for new code, but one line naming the file, the units and the commands;
    `dvc status` then names the contracts stage only. After `pal contracts
    raise`, `dvc repro` retunes the chains of PAL's and RebQ's method (here
    pal and init) and nothing else, with no proof run."""
    path, env = work
    dvc = str(BIN / "dvc")
    pal = path / "pipeline/methods/pal.py"
    assert PAL_JOINT in pal.read_text()
    pal.write_text(pal.read_text().replace(PAL_JOINT, PAL_JOINT + " * 1.001"))
    proc = subprocess.run([dvc, "repro"], cwd=path, env=env, capture_output=True)
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode != 0, out
    assert _ran(out) == {"contracts"}, out
    units = "extract.pal extract.rebq tune.pal tune.rebq"
    assert (
        "pipeline/methods/pal.py changed: code of extract.pal, tune.pal (pal.py is "
        "its module), extract.rebq, tune.rebq (rebq.py imports pal.py). A refactor: "
        "`pal contracts verify`" in out
    ), out
    assert f"`pal contracts raise {units}`, then `dvc repro`" in out, out
    check = subprocess.run(
        [str(BIN / "pal"), "check"], cwd=path, env=env, capture_output=True, text=True
    )
    assert check.returncode == 1
    assert "Error: contracts: pipeline/methods/pal.py changed" in check.stderr
    status = _run([dvc, "status"], path, env)
    assert re.findall(r"^(\S+):$", status, re.M) == ["contracts"], status

    _run([str(BIN / "pal"), "contracts", "raise", *units.split()], path, env)
    out = _run([dvc, "repro"], path, env)
    chains = set(re.findall(r"Running stage '((?:tune|extract)@[a-z]+)-\d'", out))
    assert chains == {"tune@pal", "tune@init", "extract@pal", "extract@init"}, out
    assert not _ran(out) & {"pixels", "frozen", "prepare", "demo"}, out
    assert "Data and pipelines are up to date." in _run([dvc, "status"], path, env)


def _clone_with_own_cache(
    repo: tuple[Path, dict[str, str]], tmp_path: Path, link: str | None = None
) -> tuple[Path, Path, dict[str, str]]:
    """A clone of the reproduced project with a copy of its cache of its own
    (cache.type `link` when given), every output checked out: (the clone,
    its cache, its env)."""
    path, env = repo
    dvc = str(BIN / "dvc")
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(path), str(clone)], tmp_path, env)
    env = dict(env, PYTHONPATH=str(clone))
    cache = tmp_path / "cache"
    shutil.copytree(path / ".dvc" / "cache", cache)
    _run([dvc, "cache", "dir", "--local", str(cache)], clone, env)
    if link is not None:
        _run([dvc, "config", "--local", "cache.type", link], clone, env)
    _run([dvc, "checkout", "-q", "dvc.yaml"], clone, env)
    return clone, cache, env


def test_a_flipped_bit_behind_a_hard_link_is_found_and_repaired(
    repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """With the link cache (`cache.type hardlink`), an in-place write to a
    shard is a write to its cache object. A bit flipped there, mtime kept:
    `dvc status` is clean, but the solve refuses the shard in one line (the
    lock keeps its weights), `pal verify` names the cache object to drop and
    the stage to rerun, and that repair restores the shard byte for byte."""
    import os

    dvc = str(BIN / "dvc")
    clone, cache, env = _clone_with_own_cache(repo, tmp_path, "hardlink")
    shard = clone / "data/extract/pal/0/step_02/train.h5"
    assert shard.stat().st_nlink == 2  # the workspace's name and the cache's
    good, st, lock = shard.read_bytes(), shard.stat(), (clone / "dvc.lock").read_text()
    with shard.open("r+b") as f:  # in place, as root writes through the link
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0x40]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    status = _run([dvc, "status"], clone, env)
    assert "Data and pipelines are up to date." in status
    solve = subprocess.run(
        [dvc, "repro", "-f", "-s", "solve"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert solve.returncode != 0
    rel = "data/extract/pal/0/step_02/train.h5"
    assert (
        f"Error: {rel}: its bytes differ from the md5 that dvc.lock recorded when "
        "stage extract@pal-0 wrote it (damaged since)" in solve.stdout + solve.stderr
    )
    assert (clone / "dvc.lock").read_text() == lock  # nothing wrong reached it
    verify = subprocess.run(
        [str(BIN / "pal"), "verify", "--stage", "extract@pal-0"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 1
    errors = [x for x in verify.stderr.splitlines() if x.startswith("Error")]
    import hashlib

    md5 = hashlib.md5(good).hexdigest()
    obj = cache / "files" / "md5" / md5[:2] / md5[2:]
    repair = f"rm {obj} && dvc repro -f -s extract@pal-0"
    assert errors == [
        f"Error: {rel} (stage extract@pal-0): damaged, and so is its cache object "
        f"(the same file: a hard link): `{repair}`"
    ]
    obj.unlink()  # the repair it names
    _run([dvc, "repro", "-f", "-s", "extract@pal-0"], clone, env)
    assert shard.read_bytes() == good
    _run([dvc, "repro"], clone, env)  # the solve DVC cleared before it failed
    left = clone / "data/tune/pal/0.partial"  # a stopped run's, then a restore
    (left / "step_01").mkdir(parents=True)
    (left / "step_01" / "SHA256SUMS").write_text("{}")
    out = _run([str(BIN / "pal"), "verify"], clone, env)
    assert "output files match" in out
    assert "removed data/tune/pal/0.partial: unfinished work beside a complete " in out
    assert not left.exists()


def test_pal_verify_fails_on_what_it_cannot_check_and_its_repairs_work(
    repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A folder output whose manifest left the cache (a partial copy, `dvc
    gc`) and a cache object whose path is a folder: each one line with its
    repair and exit 1, never "files match"; each repair, run as named, makes
    `pal verify` pass."""
    dvc, pal = str(BIN / "dvc"), str(BIN / "pal")
    clone, cache, env = _clone_with_own_cache(repo, tmp_path)
    lock = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]

    def verify(stage: str) -> subprocess.CompletedProcess:
        cmd = [pal, "verify", "--stage", stage]
        return subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)

    md5 = lock["extract@pal-0"]["outs"][0]["md5"]
    (cache / "files" / "md5" / md5[:2] / md5[2:]).unlink()
    done = verify("extract@pal-0")
    assert done.returncode == 1 and "files match" not in done.stdout
    repair = "dvc repro -f -s extract@pal-0"
    assert [x for x in done.stderr.splitlines() if x.startswith("Error")] == [
        "Error: data/extract/pal/0 (stage extract@pal-0): its manifest "
        f"{md5} is not in DVC's cache, so none of its files can be checked: "
        f"`dvc fetch extract@pal-0` from a remote, or `{repair}`"
    ]
    _run([dvc, "repro", "-f", "-s", "extract@pal-0"], clone, env)  # the repair
    assert verify("extract@pal-0").returncode == 0

    from palcore.recorded import recorded_outputs

    rec = recorded_outputs(clone)["data/solve/pal/0/weights.h5"]
    obj = cache / "files" / "md5" / rec.md5[:2] / rec.md5[2:]
    obj.unlink()
    obj.mkdir()
    done = verify("solve")
    assert done.returncode == 1
    assert (
        f"Error: data/solve/pal/0/weights.h5 (stage solve): its cache object "
        f"{obj} is a folder: `rm -r {obj} && dvc commit -f solve`"
    ) in done.stderr
    obj.rmdir()  # the repair it names
    _run([dvc, "commit", "-f", "solve"], clone, env)
    assert verify("solve").returncode == 0


def test_eta_change_reruns_only_the_analytic_stages(
    work: tuple[Path, dict[str, str]],
) -> None:
    path, env = work
    params = yaml.safe_load((path / "params.yaml").read_text())
    params["solve"]["eta"] = 0.1
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    status = _run([str(BIN / "dvc"), "status"], path, env)
    # stage names are the unindented "name:" lines of `dvc status`
    changed = {
        line[:-1]
        for line in status.splitlines()
        if line.endswith(":") and not line[:1].isspace()
    }
    # evaluate checks the weights against solve.* (width, seed, method, dtype, η)
    assert changed == {"solve", "evaluate"}, status

    before = (path / "data/extract/pal/1/step_01/train.h5").read_bytes()
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == {"solve", "evaluate"}, out
    # one process each, every chain in it
    assert out.count("Running stage ") == 2, out
    assert out.count("INFO solver.solve: solve: chain ") == len(VARIANTS) * len(RUNS)
    assert (path / "data/extract/pal/1/step_01/train.h5").read_bytes() == before


def test_queued_grid_reuses_cached_features(work: tuple[Path, dict[str, str]]) -> None:
    path, env = work
    dvc = str(BIN / "dvc")
    _run(
        [
            dvc,
            "exp",
            "run",
            "--queue",
            "-S",
            "solve.eta=0.5,2",
        ],
        path,
        env,
    )
    out = _run([dvc, "exp", "run", "--run-all"], path, env)
    assert out.count("Running stage 'solve'") == 2, out  # one per experiment
    assert _ran(out) == {"solve", "evaluate"}, out
    table = _run(
        [
            dvc,
            "exp",
            "show",
            "--csv",
            "--drop",
            ".*",
            "--keep",
            "^solve.eta$|.*/headline/pal.json:acc$",
        ],
        path,
        env,
    )
    rows = [line.split(",") for line in table.strip().splitlines()[1:]]
    # rows: the workspace, HEAD (eta 1.0), then the two experiments
    grid = {r[-1]: float(r[-2]) for r in rows}
    for eta in ("0.5", "2"):
        assert 0.0 <= grid[eta] <= 100.0, table
    assert len(rows) == 4, table


def test_shared_cache_lets_a_clone_skip_every_stage(
    repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """With the cache shared, `dvc checkout` restores every output and `dvc
    repro` runs nothing; `dvc repro` alone restores every per-chain stage
    from the run cache and reruns only evaluate, whose report files live in
    git, not in the cache, and the contracts guard (seconds, the same
    bytes)."""
    path, env = repo
    dvc = str(BIN / "dvc")
    for name, checkout in (("clone", True), ("bare", False)):
        clone = tmp_path / name
        _run(["git", "clone", "-q", str(path), str(clone)], tmp_path, env)
        cache = str(path / ".dvc" / "cache")
        _run([dvc, "cache", "dir", "--local", cache], clone, env)
        if checkout:
            _run([dvc, "checkout", "dvc.yaml"], clone, env)  # the main pipeline's
        out = _run([dvc, "repro"], clone, dict(env, PYTHONPATH=str(clone)))
        # the contracts stage's stamps persist (a refused edit keeps them), and
        # DVC restores no persistent output from its run cache: the guard runs
        assert _ran(out) == (set() if checkout else {"contracts", "evaluate"}), out
        assert (clone / "data/extract/pal/1/step_02/test.h5").is_file()
        assert _run(["git", "status", "--porcelain"], clone, env) == ""


def test_a_cell_the_data_cannot_take_is_stopped_before_queuing(
    work: tuple[Path, dict[str, str]],
) -> None:
    path, env = work
    head = _run(["git", "rev-parse", "HEAD"], path, env).strip()[:7]
    # 5 tasks for the tiny demo's 4 classes: `pal check` on the cell's params
    # stops it before anything is queued. Nothing activated: pal-paper finds
    # its tools beside its Python
    bare = dict(env, PATH="/usr/bin:/bin")
    out = pal_paper(path, bare, "run", "tasks", "--cells", "tasks=5+main=pal")
    assert out.returncode == 1
    cell = "Error: cell 'tasks=5+main=pal' (data.tasks=5 pipelines.main=[pal]): "
    assert out.stderr.splitlines()[-2:] == [
        f"{cell}params.yaml: data.tasks: 5 tasks for 4 classes; every task needs "
        "at least one class",
        f"{cell}params.yaml: prompt.pool_size 4 is smaller than the number of "
        "tasks (5): each task needs ≥ 1 component (model.backbone 'data/demo/vilt')",
    ]
    assert f"{head}-tasks=5+main=pal" not in _run(
        [str(BIN / "dvc"), "queue", "status"], path, env
    )
    out = pal_paper(path, env, "collect", "tasks")
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f"Error: tasks: none of its 4 cells finished on {head}; nothing written "
        "(run: pal-paper run tasks)"
    )


def test_two_machines_share_features_run_cache_and_a_resumed_grid(
    work: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Machine A (a clone with the features) and machine B (a clone of the
    team's git remote with an empty cache of its own) share a local-path DVC
    remote and a bare git remote, with the commands of docs/USAGE.md: B pulls
    A's features and an η change reruns only the analytic stages; A's tuned
    experiment, pushed with its run-cache, is restored on B instead of tuned
    again. Then Table 4 (width × η): A runs cells 1 and 3 and renders a
    partial table; B runs its share (--shard 2/2: cells 2 and 4); A pulls B's
    experiments and the grid queues only the cell it still lacks. Every cell
    reruns only the analytic stages, and the table holds each experiment's
    numbers."""
    from palpaper.grids import RESULTS

    a, env = work
    dvc = str(BIN / "dvc")
    b, b_env = _machine_b_shares_a_features_and_run_cache(a, env, tmp_path)

    # Table 4 on A: cells 1 and 3 first, a partial table
    head = _run(["git", "rev-parse", "HEAD"], a, env).strip()
    params = yaml.safe_load((a / "params.yaml").read_text())
    cols = RESULTS["upsampling"].columns(params, None)
    names = [c.cell.name for c in cols]
    first = pal_paper(a, env, "run", "upsampling", "--cells", f"{names[0]},{names[2]}")
    assert first.returncode == 0, first.stderr
    assert f"5 cells on {head[:7]}" not in first.stderr  # --cells: 2 of them
    assert "2 cells on" in first.stderr and "2 queued now" in first.stderr
    out = pal_paper(a, env, "collect", "upsampling")  # a partial grid
    assert out.returncode == 0, out.stderr
    lacking = [n for n in names if n not in (names[0], names[2])]
    assert out.stderr.splitlines()[0] == (
        "WARNING palpaper.collect: upsampling: 3 of 5 cells marked – (no finished "
        f"experiment on {head[:7]}: {', '.join(lacking)}); run them: pal-paper run "
        f"upsampling --cells {','.join(lacking)}"
    )
    partial = (a / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert [line.endswith("| – | – |") for line in partial[4:]] == [
        False,
        True,
        False,
        True,
        True,
    ]

    # B's share; its experiments travel through git; A queues only cell 5
    out = pal_paper(b, b_env, "run", "upsampling", "--shard", "2/2")
    assert out.returncode == 0, out.stderr
    assert "2 cells on" in out.stderr and "1 finished before" not in out.stderr
    _run([dvc, "exp", "push", "origin", "--run-cache"], b, b_env)
    _run([dvc, "exp", "pull", "team"], a, env)
    out = pal_paper(a, env, "run", "upsampling")
    assert out.returncode == 0, out.stderr
    assert (
        f"5 cells on {head[:7]}: 4 finished before (kept), 1 queued now, "
        "0 already queued" in out.stderr
    )
    assert f"queued cell {names[4]}" in out.stderr
    lines = (a / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert lines[2] == "| Width and η | Acc | FG |"
    expected = []
    for c in cols:
        ref = f"refs/exps/{head[:2]}/{head[2:]}/{head[:7]}-{c.cell.name}"
        m = json.loads(
            _run(["git", "show", f"{ref}:results/demo/metrics.json"], a, env)
        )
        acc, fg = m["pal"]["acc"], m["pal"]["fg"]
        assert m["runs"] == list(RUNS)
        expected.append(
            f"| {c.label} | {acc['mean']:.2f} ± {acc['std']:.2f} | "
            f"{fg['mean']:.2f} ± {fg['std']:.2f} |"
        )
        on_b = c.cell.name in (names[1], names[3])  # B's share ran in B's queue
        logs = _run(
            [dvc, "queue", "logs", f"{head[:7]}-{c.cell.name}"],
            b if on_b else a,
            b_env if on_b else env,
        )
        assert _ran(logs) <= {"solve", "evaluate"}, logs  # from the cached features
    assert lines[4:] == expected


def _machine_b_shares_a_features_and_run_cache(
    a: Path, env: dict[str, str], tmp_path: Path
) -> tuple[Path, dict[str, str]]:
    """Machine B, a clone of the team's git remote with an empty cache of its
    own: it pulls A's features (an η change reruns only the analytic stages)
    and A's tuned experiment with its run-cache (restored, not tuned again)."""
    dvc = str(BIN / "dvc")
    origin, store = tmp_path / "origin.git", tmp_path / "store"
    _run(["git", "init", "-q", "--bare", str(origin)], tmp_path, env)
    # machine A: the team's remotes; its features; a tuned experiment
    _run(["git", "remote", "add", "team", str(origin)], a, env)
    _run([dvc, "remote", "add", "-d", "store", str(store)], a, env)
    _run(["git", "commit", "-qam", "the team's DVC remote"], a, env)
    _run(["git", "push", "-q", "team", "HEAD:main"], a, env)
    _run([dvc, "push", "-q", "dvc.yaml"], a, env)
    lr = [
        "-S",
        "tune.lr=0.002",
        "-S",
        "pipelines.main=[pal]",
        "-S",
        "protocol.runs=[0]",
    ]
    out = _run([dvc, "exp", "run", "-n", "lr", *lr], a, env)
    assert "Running stage 'tune@pal-0'" in out, out
    _reset(a, env)
    _run([dvc, "exp", "push", "team", "lr", "--run-cache"], a, env)

    # machine B: a clone of the team's repository, its own (empty) cache
    b = tmp_path / "b"
    _run(["git", "clone", "-q", "-b", "main", str(origin), str(b)], tmp_path, env)
    b_env = dict(env, PYTHONPATH=str(b))
    _run([dvc, "pull", "-q", "dvc.yaml"], b, b_env)
    out = _run([dvc, "exp", "run", "-S", "solve.eta=0.5"], b, b_env)
    assert _ran(out) == {"solve", "evaluate"}, out
    _reset(b, b_env)
    _run([dvc, "exp", "pull", "origin", "lr", "--run-cache"], b, b_env)
    out = _run([dvc, "exp", "run", *lr], b, b_env)
    assert "Stage 'tune@pal-0' is cached - skipping run" in out, out
    assert "Stage 'extract@pal-0' is cached - skipping run" in out, out
    assert _ran(out) == {"evaluate"}, out  # its report files live in git
    _reset(b, b_env)
    return b, b_env


def _reset(path: Path, env: dict[str, str]) -> None:
    """Back to the commit after a `dvc exp run` in the workspace."""
    _run(["git", "checkout", "-q", "--", "."], path, env)
    _run([str(BIN / "dvc"), "checkout", "-q", "dvc.yaml"], path, env)
