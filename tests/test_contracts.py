"""The output contracts of pixels, frozen, tune and extract (DESIGN §2).

The record: contracts.lock holds the code that every unit's contract was
verified with, and equals the code of the tree. The guard: a code edit that
the record does not hold stops `pal contracts stamp` (the dvc.yaml stage) and
`pal check` with one line; a comment edit does not. The proof: `pal contracts
verify` runs each unit whose code differs from the commit that set its
version on a tiny fixture, with both versions of the code, and compares the
outputs by the rule for the same output (pipeline.sameness); on scratch
clones of the project, a change of output without a raised version fails,
with it passes, a pure refactor passes, and a raised version whose outputs
are the same fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import PAL_JOINT, committed, committed_params

from pipeline import contract_code as code
from pipeline.contracts import STAGES, ContractError, read_versions
from pipeline.stages import contract_proof as proof
from pipeline.stages import contract_runs as runs
from pipeline.stages import contracts as guard

ROOT = Path(__file__).resolve().parents[1]
PAL = ROOT / "pipeline" / "methods" / "pal.py"
JOINT = PAL_JOINT
GIT = dict(
    GIT_AUTHOR_NAME="t",
    GIT_AUTHOR_EMAIL="t@example.com",
    GIT_COMMITTER_NAME="t",
    GIT_COMMITTER_EMAIL="t@example.com",
)


def test_the_record_holds_the_code_of_this_tree() -> None:
    """contracts.lock is what `pal contracts verify` wrote for this code: no
    unit differs (else the guard stops every `dvc repro`) but one raised above
    it and not yet proven (a draft: test_code_is_verified_against_each_contract
    proves it)."""
    assert set(code.changed_units()) <= set(code.drafted())
    record = code.read_record()
    assert set(record) <= set(read_versions().versions)
    files = {f for entry in record.values() for f in entry["code"]}
    assert files == set(code.watched_files())


def test_units_split_the_methods_from_their_stage() -> None:
    files = code.unit_files()
    assert set(files) == set(read_versions().versions)
    methods = {f"pipeline/methods/{m}.py" for m in code.method_names()}
    for stage in ("tune", "extract"):
        assert not methods & set(files[stage])  # a method's edit: its unit only
        assert f"pipeline/stages/{stage}.py" in files[stage]
        assert files[f"{stage}.pal"] == ["pipeline/methods/pal.py"]
        assert files[f"{stage}.rebq"] == [
            "pipeline/methods/pal.py",
            "pipeline/methods/rebq.py",
        ]  # RebQ builds on PAL's module: a PAL fix reaches RebQ too
        assert files[f"{stage}.dualprompt"] == [
            "pipeline/methods/dualprompt.py",
            "pipeline/methods/l2p.py",
        ]
    assert "pipeline/data/pixel_cache.py" in files["pixels"]
    assert "solver/shards.py" in files["extract"]  # the shard format it writes
    assert "pipeline/model/queries.py" in files["frozen"]


def test_code_digest_leaves_out_comments_and_blank_lines(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('x = 1  # one\ns = "# not a comment"\n')
    b.write_text('# a header\n\nx = 1\ns = "# not a comment"   \n\n')
    c.write_text('x = 1\ns = "# not a comment!"\n')
    assert code.code_digest(a) == code.code_digest(b)
    assert code.code_digest(a) != code.code_digest(c)  # a string is code


def test_code_digest_leaves_out_docstrings_not_strings(tmp_path: Path) -> None:
    files = {
        "plain": "def f(x):\n    return x + 1\n\n\nclass C:\n    y = 2\n",
        "documented": '"""Module."""\n\n\ndef f(x):\n    """One\n    line.\n    """\n'
        '    return x + 1\n\n\nclass C:\n    """A class."""\n\n    y = 2\n',
        "assigned": 'def f(x):\n    return x + 1\n\n\nclass C:\n    y = """2"""\n',
        "returned": 'def f(x):\n    return """x"""\n\n\nclass C:\n    y = 2\n',
    }
    digests = {}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
        digests[name] = code.code_digest(tmp_path / f"{name}.py")
    assert digests["plain"] == digests["documented"]
    assert len({digests["plain"], digests["assigned"], digests["returned"]}) == 3


def _copy(tmp_path: Path) -> Path:
    """The project's packages and contract files, copied."""
    for package in ("palcore", "pipeline", "solver"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc")
        )
    for name in ("contracts.yaml", "contracts.lock", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_the_guard_names_changed_code_and_passes_comments(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    pal = root / "pipeline" / "methods" / "pal.py"
    pal.write_text(pal.read_text() + "\n# a note on the method\n")
    assert code.guard_problem(root) is None  # a comment: no change of code
    assert JOINT in pal.read_text()
    pal.write_text(pal.read_text().replace(JOINT, JOINT + " * 1.001"))
    assert code.guard_problem(root) == (
        "pipeline/methods/pal.py changed: code of extract.pal, tune.pal (pal.py "
        "is its module), extract.rebq, tune.rebq (rebq.py imports pal.py). A "
        "refactor: `pal contracts verify` (proves the outputs the same, records "
        "it). A change of outputs: `pal contracts raise extract.pal extract.rebq "
        'tune.pal tune.rebq`, then `dvc repro` (docs/USAGE.md, "Output contracts")'
    )
    errors = root / "palcore" / "errors.py"
    errors.write_text(errors.read_text() + "\nX = 1\n")
    pal_units = {"tune.pal", "tune.rebq", "extract.pal", "extract.rebq"}
    assert set(code.changed_units(root)) == set(STAGES) | pal_units  # not map's


def test_a_raise_runs_without_a_proof_and_each_edit_moves_its_stamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edit loop: edit, `pal contracts raise`, `dvc repro`. A raised unit
    passes the guard with no proof; its stamps name the code's digest, so a
    further edit makes its outputs again, and other variants' stamps keep
    their bytes. A docstring edit changes nothing."""
    from click.testing import CliRunner

    root = _copy(tmp_path / "root")
    monkeypatch.setattr(guard.con, "ROOT", root)  # where `raise` edits
    params = str(root / "params.yaml")

    def stamps() -> dict[str, bytes]:
        out = tmp_path / "stamps"
        guard.write_stamps(params, out, root)
        return {
            p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.json")
        }

    before = stamps()
    pal = root / "pipeline" / "methods" / "pal.py"
    text = pal.read_text()
    pal.write_text(text.replace('"""', '"""Edited. ', 1))  # a docstring
    assert code.guard_problem(root) is None and stamps() == before
    pal.write_text(text.replace(JOINT, JOINT + " * 1.001"))
    assert code.guard_problem(root) is not None
    units = ["tune.pal", "extract.pal", "tune.rebq", "extract.rebq"]
    done = CliRunner().invoke(guard.cli, ["raise", *units, "tune.pal"])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        "tune.pal: 1 -> 2",
        "extract.pal: 1 -> 2",
        "tune.rebq: 2 -> 3",
        "extract.rebq: 1 -> 2",
        "tune.pal: already 2, above contracts.lock's",
    ]
    assert code.guard_problem(root) is None  # raised: no proof asked
    first = stamps()
    moved = sorted(k for k in before if first[k] != before[k])
    pal_or_rebq = sorted(
        k for k, v in before.items() if json.loads(v).get("method") in ("pal", "rebq")
    )
    assert moved == pal_or_rebq and "tune/map.json" not in moved
    assert {"tune/pal.json", "extract/rebq.json", "tune/init.json"} <= set(moved)
    pal_stamp = json.loads(first["tune/pal.json"])
    assert pal_stamp["method_version"] == 2 and set(pal_stamp["code"]) == {"tune.pal"}
    pal.write_text(text.replace(JOINT, JOINT + " * 1.002"))  # edited again
    again = stamps()
    assert sorted(k for k in first if again[k] != first[k]) == moved
    done = CliRunner().invoke(guard.cli, ["raise", "tune.pall"])
    assert done.exit_code == 1
    assert done.stderr.startswith("Error: unknown unit tune.pall (known: extract, ")


def test_stamps_name_each_variants_contract(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(committed("params.yaml"))
    written = guard.write_stamps(str(params), tmp_path / "out")
    rows = committed_params()["ablation"]
    assert len(written) == 2 + 2 * len(rows)
    v = read_versions().versions
    for stage in ("tune", "extract"):
        pal = json.loads((tmp_path / "out" / stage / "pal.json").read_text())
        assert pal == {
            "stage": stage,
            "version": v[stage],
            "method": "pal",
            "method_version": v[f"{stage}.pal"],
        }
        frozen = json.loads((tmp_path / "out" / stage / "frozen.json").read_text())
        assert frozen["method"] is None and frozen["method_version"] is None
        l2p = json.loads((tmp_path / "out" / stage / "l2p.json").read_text())
        assert l2p["method"] == "l2p"
    pixels = json.loads((tmp_path / "out" / "pixels.json").read_text())
    assert pixels == {"stage": "pixels", "version": v["pixels"]}


def test_stamp_deletes_only_stamps_and_refuses_a_folder_of_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pal contracts stamp --out DIR` into a folder holding anything but
    stamps (a mistyped `--out data`) deletes nothing and says so; a former
    run's stamp of a variant gone from params is removed, the rest rewritten."""
    from click.testing import CliRunner

    monkeypatch.setattr(guard.code, "guard_problem", lambda: None)
    params = tmp_path / "params.yaml"
    params.write_text(committed("params.yaml"))
    data = tmp_path / "data"
    raw = data / "raw" / "demo" / "captions.json"
    raw.parent.mkdir(parents=True)
    raw.write_text("{}")
    args = ["stamp", "--params", str(params), "--out"]
    done = CliRunner().invoke(guard.cli, [*args, str(data)])
    assert done.exit_code == 1
    assert done.stderr == (
        f"Error: {data}: holds raw and 2 more that are not contract stamps; "
        "nothing was deleted: --out names the stamps' own folder (default "
        "data/contracts)\n"
    )
    assert raw.read_text() == "{}" and sorted(data.rglob("*.json")) == [raw]
    out = tmp_path / "contracts"
    stale = out / "tune" / "gone.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    done = CliRunner().invoke(guard.cli, [*args, str(out)])
    assert done.exit_code == 0, done.output
    assert not stale.exists()
    assert len(list(out.rglob("*.json"))) == 2 + 2 * len(committed_params()["ablation"])


def test_tune_stamps_carry_the_later_tune_keys_only_when_set(tmp_path) -> None:
    """tune.decay, beta2 and clip_norm key a tuning through its stamp: absent
    at their defaults (a workspace made before them keeps its stamps' bytes,
    so DVC reruns no tuning), present where a variant or the base sets them."""
    params = tmp_path / "params.yaml"
    params.write_text(committed("params.yaml"))
    guard.write_stamps(str(params), tmp_path / "a")
    pal = json.loads((tmp_path / "a" / "tune" / "pal.json").read_text())
    assert sorted(pal) == ["method", "method_version", "stage", "version"]
    own = json.loads((tmp_path / "a" / "tune" / "l2p_own.json").read_text())
    assert own["tune"] == {"decay": "none", "beta2": 0.999, "clip_norm": 1.0}
    extract = json.loads((tmp_path / "a" / "extract" / "l2p_own.json").read_text())
    assert "tune" not in extract
    data = yaml.safe_load(params.read_text())
    data["tune"]["beta2"] = 0.95
    params.write_text(yaml.safe_dump(data))
    guard.write_stamps(str(params), tmp_path / "b")
    pal = json.loads((tmp_path / "b" / "tune" / "pal.json").read_text())
    assert pal["tune"] == {"beta2": 0.95}
    # the keys the stamp reads are exactly tune's RECORDED_IF_SET keys
    from pipeline.params import TuneParams

    later = {
        f.name
        for f in dataclasses.fields(TuneParams)
        if f.metadata.get("recorded_if_set")
    }
    assert later == {"decay", "beta2", "clip_norm"}


def test_the_fixture_reaches_every_unit() -> None:
    """Each unit has jobs; every method, the frozen variant, the pixel cache
    off, a resumed tune, both real layouts and a 2-rank extract are there."""
    jobs = runs.jobs()
    for unit in read_versions().versions:
        assert runs.selected([unit]), unit
    names = {j.name for j in jobs}
    assert {"pixels/food101", "pixels/n24news", "pixels/demo-off"} <= names
    assert {"tune/pal-resume", "tune/pal-decode", "extract/pal-2rank"} <= names
    assert {f"tune/{v}" for v in runs.VARIANTS} <= names
    assert [j.name for j in runs.selected(["tune.l2p"])] == ["tune/l2p", "tune/l2p_pp"]
    # a variant a tree's params lack (a row added since) is not run there
    assert runs.variants_of(ROOT) >= set(runs.VARIANTS)
    kept = runs.runnable(runs.selected(["extract.l2p"]), {"pal", "l2p"})
    assert [j.name for j in kept] == ["extract/l2p"]
    frozen = runs.selected(["frozen"])
    assert runs.runnable(frozen, set()) == frozen  # no variant: always run
    assert set(STAGES) == {j.name.split("/")[0] for j in jobs}


def test_a_raised_method_excuses_its_jobs_from_its_stages_equality() -> None:
    """`tune` stays judged equal on PAL's jobs while `tune.map`'s raise lets
    tune/map's outputs move; the raised unit's own check keeps its job."""
    old = {"tune": 1, "tune.map": 1, "tune.pal": 1}
    raised = proof.raised_units(old, {"tune": 1, "tune.map": 2, "tune.pal": 1})
    assert raised == {"tune.map"}
    jobs = runs.jobs()
    stage = proof.Check("tune", "a" * 40, None, equal=True)
    names = {j.name for j in proof.judged_by(stage, jobs, raised)}
    assert "tune/map" not in names and "extract/map" not in names
    assert {"tune/pal", "tune/pal-resume", "tune/frozen", "tune/msp"} <= names
    assert names == {j.name for j in jobs if "tune" in j.units} - {"tune/map"}
    own = proof.Check("tune.map", "a" * 40, None, equal=False)
    assert [j.name for j in proof.judged_by(own, jobs, raised)] == ["tune/map"]
    assert proof.judged_by(stage, jobs, set()) == [j for j in jobs if "tune" in j.units]
    # L2P and L2P++ are both the l2p method's: its raise excuses both
    l2p = proof.Check("tune.l2p", "a" * 40, None, equal=False)
    got = [j.name for j in proof.judged_by(l2p, jobs, {"tune.l2p"})]
    assert got == ["tune/l2p", "tune/l2p_pp"]
    kept = {j.name for j in proof.judged_by(stage, jobs, {"tune.l2p"})}
    assert not {"tune/l2p", "tune/l2p_pp"} & kept and "tune/map" in kept


def test_the_older_codes_failed_job_is_an_output_that_differs(tmp_path) -> None:
    """The older code may not read what the newer wrote (a checkpoint of a
    raised format): its failed job leaves FAILED, the fixture goes on."""
    bad = runs.Job("tune/x", ("tune", "--variant", "nosuch"), frozenset({"tune"}))
    fine = runs.Job("frozen/x", ("frozen", "--help"), frozenset({"frozen"}))
    version = runs.Version(ROOT, tmp_path / "old")
    runs.run_version(version, [bad, fine], tmp_path, version, None, keep_going=True)
    why = (tmp_path / "old" / "tune/x" / runs.FAILED).read_text()
    assert "unknown variant 'ablation.nosuch'" in why
    assert runs.differences(tmp_path / "old" / "tune/x", tmp_path / "y") == [
        runs.FAILED
    ]
    with pytest.raises(ContractError, match=r"the fixture failed: tune/x: .*nosuch"):
        runs.run_version(
            runs.Version(ROOT, tmp_path / "new"), [bad], tmp_path, version, None
        )


@pytest.mark.slow
def test_code_is_verified_against_each_contract() -> None:
    """The guard of the project's own history: every unit whose code differs
    from the commit that set its version makes the same outputs on the fixture
    (and a raised version, other outputs): what `pal contracts verify` checks."""
    outcome = proof.verify(ROOT)
    assert outcome.problems == []


# --- on scratch clones: what a developer meets ---------------------------------


def _clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", **GIT)
    return repo, env


def _set_at(repo: Path, unit: str) -> str:
    """The commit that set `unit`'s current version in contracts.yaml."""
    log = subprocess.run(
        ["git", "log", "--format=%H", "--", "contracts.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout.split()
    shown = [
        yaml.safe_load(
            subprocess.run(
                ["git", "show", f"{c}:contracts.yaml"], cwd=repo, capture_output=True
            ).stdout
        )["versions"][unit]
        for c in log
    ]
    same = [c for c, v in zip(log, shown, strict=True) if v == shown[0]]
    return same[-1]


def _held_to(repo: Path, unit: str) -> str:
    """The commit `unit`'s outputs are held to: the later of the commits that
    set its version and its stage's (`tune.pal`'s outputs hold `tune`'s too)."""
    ours, stage = _set_at(repo, unit), _set_at(repo, unit.split(".")[0])
    order = subprocess.run(
        ["git", "rev-list", "--count", f"{ours}..{stage}"],
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return stage if int(order) > 0 else ours


def _head(repo: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True)
    return out.stdout.decode().strip()


def _commit(repo: Path, env: dict[str, str], message: str) -> None:
    subprocess.run(["git", "commit", "-qam", message], cwd=repo, env=env, check=True)


def _verify(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "contracts", "verify", "--unit", "tune.pal"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )


def _edit(repo: Path, old: str, new: str) -> None:
    pal = repo / "pipeline" / "methods" / "pal.py"
    text = pal.read_text()
    assert old in text
    pal.write_text(text.replace(old, new))


def _bump(repo: Path, unit: str) -> None:
    path = repo / "contracts.yaml"
    text = path.read_text()
    assert f"  {unit}: 1\n" in text
    path.write_text(text.replace(f"  {unit}: 1\n", f"  {unit}: 2\n"))


@pytest.mark.slow
def test_a_change_of_output_without_a_raised_version_fails(tmp_path: Path) -> None:
    repo, env = _clone(tmp_path)
    before = _held_to(repo, "tune.pal")
    assert before == _set_at(repo, "tune") != _set_at(repo, "tune.pal")
    _edit(repo, JOINT, JOINT + " * 1.001")  # PAL's features scaled: other bytes
    _commit(repo, env, "scale PAL's joint embedding")
    done = _verify(repo, env)
    assert done.returncode == 1
    # each file named with the key that moved most, by how much of its scale
    # (the losses in log.jsonl move by 1e-4 of theirs: within the rule)
    size = r"\(\d\.\de-0\d\)"
    assert re.fullmatch(
        "Error: tune.pal: the outputs of the working tree differ from "
        f"{before[:10]}'s \\(tune/pal: step_01.pt:\\S+ {size}, "
        f"step_02.pt:\\S+ {size}\\) under the "
        "same contract: raise versions.tune.pal in contracts.yaml",
        done.stderr.strip().splitlines()[-1],
    ), done.stderr
    # the same change with the version raised: the new outputs are version 2's
    _bump(repo, "tune.pal")
    _commit(repo, env, "tune.pal 2")
    done = _verify(repo, env)
    assert done.returncode == 0, done.stderr
    assert "tune.pal: compared on 3 jobs" in done.stdout
    record = json.loads((repo / "contracts.lock").read_text())
    assert record["tune.pal"]["version"] == 2
    assert code.changed_units(repo) == {
        u: ["pipeline/methods/pal.py"] for u in ("extract.pal", "extract.rebq")
    } | {"tune.rebq": ["pipeline/methods/pal.py"]}  # verified tune.pal alone


@pytest.mark.slow
def test_a_pure_refactor_passes_and_an_empty_bump_fails(tmp_path: Path) -> None:
    repo, env = _clone(tmp_path)
    before = _held_to(repo, "tune.pal")
    _edit(
        repo,
        "prompts = self(q_t, q_v, text_on=on, image_on=on)\n",
        "chosen = self(q_t, q_v, text_on=on, image_on=on)\n",
    )
    _edit(repo, JOINT, JOINT.replace("prompts", "chosen"))
    _commit(repo, env, "rename a local")
    done = _verify(repo, env)
    assert done.returncode == 0, done.stderr
    assert "tune.pal: compared on 3 jobs" in done.stdout
    # a raised version whose outputs are the same is no contract change
    _bump(repo, "tune.pal")
    _commit(repo, env, "tune.pal 2 for a rename")
    done = _verify(repo, env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: tune.pal: version raised to 2 at {_head(repo)[:10]} but its "
        f"outputs are the same as {before[:10]}'s: state why under reasons "
        "('tune.pal@2: ...') in contracts.yaml, or keep the version"
    )
    path = repo / "contracts.yaml"
    why = 'reasons:\n  "tune.pal@2": the checkpoints gain a field a later reader needs'
    path.write_text(path.read_text().replace("reasons: {}", why))
    _commit(repo, env, "state why")
    done = _verify(repo, env)
    assert done.returncode == 0, done.stderr


def test_the_fixture_params_do_not_follow_a_new_tune_default(tmp_path) -> None:
    """A tree whose params.yaml sets other tune knobs (a new demo default) gets
    the same fixture params as the committed one: the fixture compares code,
    and a params change must not read as a change of the code."""
    base = committed_params()
    changed = json.loads(json.dumps(base))
    changed["tune"].update(lr=3.0e-3, head_lr=5.0e-2, warmup=0.2, recon_weight=0.5)
    texts = {}
    for name, raw in (("committed", base), ("changed", changed)):
        code_dir = tmp_path / name / "code"
        code_dir.mkdir(parents=True)
        (code_dir / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
        paths = runs.write_params(code_dir, tmp_path / "inputs", tmp_path / name)
        texts[name] = {k: yaml.safe_load(p.read_text()) for k, p in paths.items()}
    assert texts["changed"] == texts["committed"]
    assert sorted(texts["changed"]) == [
        "demo",
        "demo-2rank",
        "demo-off",
        "food101",
        "n24news",
    ]
    tune = texts["changed"]["demo"]["tune"]
    assert (tune["lr"], tune["head_lr"], tune["warmup"], tune["recon_weight"]) == (
        1.0e-4,
        1.0e-2,
        0.1,
        0.01,
    )


def test_a_missing_lock_or_an_unknown_method_is_named(tmp_path: Path) -> None:
    """A deleted contracts.lock is named as missing (not as every unit's code
    changed); a variant whose prompt.method is no method is named by its key
    (not told to add a contract for it)."""
    root = _copy(tmp_path / "root")
    (root / "contracts.lock").unlink()
    assert code.guard_problem(root) == (
        f"{root / 'contracts.lock'}: not found (the code each contract was proven "
        "with): `git checkout contracts.lock`"
    )
    params = tmp_path / "params.yaml"
    raw = committed_params()
    raw["ablation"]["pal"]["changes"] = {"prompt": {"method": "pall"}}
    params.write_text(yaml.safe_dump(raw))
    with pytest.raises(ContractError) as err:
        guard.write_stamps(str(params), tmp_path / "out")
    assert str(err.value).startswith(
        "ablation.pal: prompt.method 'pall' is no method (known: pal, "
    )
    assert not (tmp_path / "out" / "tune" / "pal.json").exists()


def test_ctrl_c_of_verify_records_nothing_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    def interrupted(**_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(guard, "verify", interrupted)
    before = (ROOT / "contracts.lock").read_bytes()
    done = CliRunner().invoke(guard.cli, ["verify", "--unit", "tune.pal"])
    assert done.exit_code == 1
    assert done.stderr == (
        "Error: interrupted: nothing recorded, contracts.lock unchanged and the "
        "fixture's temporary files removed; rerun `pal contracts verify`\n"
    )
    assert (ROOT / "contracts.lock").read_bytes() == before


def test_a_damaged_contracts_yaml_is_one_line(tmp_path: Path) -> None:
    """A misspelt unit stops the guard naming it; `reasons` that is not a
    mapping and a file that is not UTF-8 are one line, not a traceback."""
    root = _copy(tmp_path / "root")
    path = root / "contracts.yaml"
    text = path.read_text()
    path.write_text(text.replace("  tune.pal: 1\n", "  tune.pal: 1\n  tune.pall: 2\n"))
    assert code.guard_problem(root).startswith(
        f"{path}: versions.tune.pall is no unit (known: extract, extract.dualprompt,"
    )
    path.write_text(text.replace("reasons: {}", "reasons: [one]"))
    with pytest.raises(ContractError) as err:
        read_versions(root)
    assert str(err.value) == (f"{path}: expected a mapping 'reasons: {{unit@N: why}}'")
    path.write_bytes(text.encode().replace(b"versions:", b"versions:\xff"))
    with pytest.raises(ContractError) as err:
        read_versions(root)
    assert str(err.value) == f"{path}: not UTF-8 text: `git checkout` it"


def test_verify_coverage_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from pipeline.stages.contract_proof import Outcome

    seen: list[Path] = []

    def fake_verify(coverage: Path | None = None, **_: object) -> Outcome:
        assert coverage is not None
        coverage.write_text("data")
        seen.append(coverage)
        return Outcome([], {}, [])

    monkeypatch.setattr(guard, "verify", fake_verify)
    monkeypatch.setattr(guard, "coverage_report", lambda data: f"read {data.name}\n")
    monkeypatch.setattr(guard.code, "write_record", lambda record: None)
    report = tmp_path / "coverage.txt"
    done = CliRunner().invoke(guard.cli, ["verify", "--coverage", str(report)])
    assert done.exit_code == 0, done.output
    assert report.read_text() == "read .coverage\n"
    assert not seen[0].parent.exists()  # the temporary folder is gone
