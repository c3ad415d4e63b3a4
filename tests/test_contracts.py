"""The output contracts of pixels, frozen, tune and extract (DESIGN §2).

The record: contracts.lock holds the code that every unit's contract was
verified with, and equals the code of the tree. The guard: a code edit that
the record does not hold stops `pal contracts stamp` (the dvc.yaml stage) and
`pal check` with one line; a comment edit does not. The proof: `pal contracts
verify` runs the jobs of each unit whose code or version moved on a tiny
fixture and compares each job's outputs with its reference (reference/,
recorded when its contract was set) by the rule for the same output
(pipeline.sameness); on copies of the project, a change of output without a
raised version fails, with it passes and is recorded, a pure refactor
passes, steps within the rule cannot add up past it, and a raised version
whose outputs are the same fails.
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

import numpy as np
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
    shutil.copytree(ROOT / proof.REFERENCE, tmp_path / proof.REFERENCE)
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


def test_a_new_methods_units_start_at_1_by_a_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module added to pipeline/methods is a method with units tune.<m> and
    extract.<m>; until contracts.yaml has them the guard is one line naming
    the raise to run, which adds them at 1 beside their stage's, as drafts
    (no proof asked, the stamps carry the code's digest)."""
    from click.testing import CliRunner

    root = _copy(tmp_path / "root")
    code.write_record(code.current_record(root), root)  # a verified tree
    monkeypatch.setattr(guard.con, "ROOT", root)  # where `raise` edits
    shutil.copy(ROOT / "docs" / "method_template.py", root / "pipeline/methods/toy.py")
    assert code.method_names(root)[-1] == "toy"
    assert code.unit_files(root)["tune.toy"] == ["pipeline/methods/toy.py"]
    assert code.guard_problem(root) == (
        "contracts.yaml: no version for 'extract.toy' (a new method's outputs): "
        "`pal contracts raise tune.toy extract.toy` starts them at 1 "
        '(docs/USAGE.md, "Add a method")'
    )
    before = (root / "contracts.yaml").read_text()
    done = CliRunner().invoke(guard.cli, ["raise", "tune.toy", "extract.toy"])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == ["tune.toy: new, 1", "extract.toy: new, 1"]
    after = (root / "contracts.yaml").read_text()
    assert after == before.replace(
        "  tune.dualprompt: 2\n", "  tune.dualprompt: 2\n  tune.toy: 1\n"
    ).replace(
        "  extract.dualprompt: 1\n", "  extract.dualprompt: 1\n  extract.toy: 1\n"
    )
    assert code.guard_problem(root) is None and set(code.drafted(root)) == {
        "tune.toy",
        "extract.toy",
    }
    params = committed_params()
    params["ablation"]["toy"] = {
        "label": "toy",
        "changes": {"prompt": {"method": "toy"}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    guard.write_stamps(str(root / "params.yaml"), tmp_path / "stamps", root)
    toy = json.loads((tmp_path / "stamps" / "tune" / "toy.json").read_text())
    assert toy["method"] == "toy" and toy["method_version"] == 1
    assert toy["code"] == {"tune.toy": code.drafted(root)["tune.toy"]}
    done = CliRunner().invoke(guard.cli, ["raise", "tune.tyo"])
    assert done.exit_code == 1
    assert done.stderr.startswith("Error: unknown unit tune.tyo (known: extract, ")
    assert "tune.toy" in done.stderr


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


def test_listing_stamps_carry_data_label_count_only_when_set(tmp_path) -> None:
    """data.label_count keys pixels and frozen through their stamps: absent
    when unset (their bytes as before the key), present when set."""
    params = tmp_path / "params.yaml"
    params.write_text(committed("params.yaml"))
    guard.write_stamps(str(params), tmp_path / "a")
    before = {
        n: (tmp_path / "a" / f"{n}.json").read_bytes() for n in ("pixels", "frozen")
    }
    assert all(b'"data"' not in b for b in before.values())
    data = yaml.safe_load(params.read_text())
    data["data"]["label_count"] = 20
    params.write_text(yaml.safe_dump(data))
    guard.write_stamps(str(params), tmp_path / "b")
    for name in ("pixels", "frozen"):
        stamp = json.loads((tmp_path / "b" / f"{name}.json").read_text())
        assert stamp["data"] == {"label_count": 20}
        assert {k: v for k, v in stamp.items() if k != "data"} == json.loads(
            before[name]
        )
    tune = (tmp_path / "b" / "tune" / "pal.json").read_bytes()
    assert tune == (tmp_path / "a" / "tune" / "pal.json").read_bytes()
    from pipeline.params import DataParams

    later = {
        f.name
        for f in dataclasses.fields(DataParams)
        if f.metadata.get("recorded_if_set")
    }
    assert later == {"label_count"}  # the keys data_keys_set reads


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
    assert set(STAGES) == {j.name.split("/")[0] for j in jobs}
    # a job's contract holds the units of the jobs whose outputs it reads
    (extract,) = [j for j in jobs if j.name == "extract/rebq"]
    assert runs.contract_units(extract) == {
        "pixels",
        "frozen",
        "tune",
        "tune.rebq",
        "extract",
        "extract.rebq",
    }
    assert [j.name for j in runs.with_needs([extract])] == [
        "pixels/demo",
        "frozen/demo",
        "tune/rebq",
        "extract/rebq",
    ]
    # every job has a reference, recorded under its contract of today
    index = proof.read_index(ROOT)
    versions = read_versions().versions
    assert sorted(index["jobs"]) == sorted(j.name for j in jobs)
    for job in jobs:
        held = {u: versions[u] for u in runs.contract_units(job)}
        assert index["jobs"][job.name] == held, job.name


def test_a_raise_selects_its_jobs_and_those_downstream(tmp_path: Path) -> None:
    """With nothing moved, no job runs; a raised tune.map makes its tuning
    and the extract reading it stale, and only those; a moved line of MAP's
    module (which MSP's imports) runs both methods' jobs, the extracts that
    judge what their checkpoints compute included."""
    root = _copy(tmp_path)
    versions = read_versions(root).versions

    def todo(**changes: int) -> list[str]:
        state = proof._Proof(root)
        state.versions.versions.update(changes)
        return [j.name for j in state.todo(None, False)]

    assert todo() == []
    assert todo(**{"tune.map": versions["tune.map"] + 1}) == ["tune/map", "extract/map"]
    frozen = todo(frozen=versions["frozen"] + 1)
    assert "frozen/demo" in frozen and "pixels/demo" not in frozen
    assert "extract/pal-2rank" in frozen and "frozen/demo-decode" in frozen
    source = root / "pipeline" / "methods" / "map.py"
    source.write_text(source.read_text() + "\nX = 1\n")  # MSP builds on MAP
    assert todo() == ["tune/map", "tune/msp", "extract/map", "extract/msp"]
    every = proof._Proof(root).todo({"tune.l2p"}, True)
    assert [j.name for j in every] == [  # L2P++ is the l2p method's too
        "tune/l2p",
        "tune/l2p_pp",
        "extract/l2p",
        "extract/l2p_pp",
    ]


def test_a_failing_job_stops_the_fixture_naming_it(tmp_path) -> None:
    bad = runs.Job("tune/x", ("tune", "--variant", "nosuch"), frozenset({"tune"}))
    with pytest.raises(ContractError, match=r"the fixture failed: tune/x: .*nosuch"):
        runs.run_version(runs.Version(ROOT, tmp_path / "new"), [bad], tmp_path)


def test_the_reference_keeps_its_bytes_and_reads_back(tmp_path: Path) -> None:
    """A job's leaves written and read back are the leaves; the same leaves
    make the same bytes (no timestamps), so a job recorded anew with the
    same outputs leaves git clean."""
    leaves = proof.reference_leaves("tune/pal")
    path = tmp_path / proof.REFERENCE / "tune" / "pal.npz"
    proof.write_leaves(path, leaves)
    assert path.read_bytes() == (ROOT / proof.REFERENCE / "tune/pal.npz").read_bytes()
    back = proof.reference_leaves("tune/pal", tmp_path)
    assert back.keys() == leaves.keys() == {"log.jsonl", "step_01.pt", "step_02.pt"}
    for name in leaves:
        assert back[name].keys() == leaves[name].keys()
        for key, leaf in leaves[name].items():
            got = back[name][key]
            assert type(got) is type(leaf) and np.array_equal(got, leaf), key
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(
        ContractError, match=r"pal.npz: unreadable \(.*`git checkout` it"
    ):
        proof.reference_leaves("tune/pal", tmp_path)


@pytest.mark.slow
def test_code_is_verified_against_each_contract() -> None:
    """Every job of the fixture makes the same outputs as its reference, on
    this machine's CPU kind, and every reference is its contract's: what
    `pal contracts verify --all` checks, recording nothing."""
    outcome = proof.verify(ROOT, everything=True, record=False)
    assert outcome.problems == []
    assert len(outcome.ran) == len(runs.jobs()) and outcome.recorded == []


# --- on copies of the project: what a developer meets --------------------------


def _verify(root: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "contracts", "verify", *args],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", **(env or {})),
        capture_output=True,
        text=True,
    )


def _edit(root: Path, old: str, new: str) -> None:
    pal = root / "pipeline" / "methods" / "pal.py"
    text = pal.read_text()
    assert old in text
    pal.write_text(text.replace(old, new))


def _raise(root: Path, *units: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "contracts", "raise", *units],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def _bytes(root: Path) -> dict[str, bytes]:
    folder = root / proof.REFERENCE
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.npz")
    }


SIZE = r"\(\d\.\de-0\d\)"
DIFFERS = (
    "{unit}: the outputs of the working tree differ from the reference of "
    f"{{unit}} 1 \\(extract/pal: step_01/test.h5:\\S+ {SIZE}, "
    f"step_01/train.h5:\\S+ {SIZE}, step_02/test.h5:\\S+ {SIZE}\\) under the "
    "same contract: raise versions.{unit} in contracts.yaml"
)


@pytest.mark.slow
def test_a_change_of_output_is_refused_until_raised_then_recorded(
    tmp_path: Path,
) -> None:
    """PAL's joint embedding × 1.001: its features move by 1e-3 of their
    scale, so the proof refuses it, blaming the units whose code moved; raised,
    it passes and records PAL's jobs anew, and no other reference moves."""
    root = _copy(tmp_path)
    before = _bytes(root)
    _edit(root, JOINT, JOINT + " * 1.001")
    done = _verify(root, "--unit", "tune.pal")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ")
    lines[0] = lines[0].removeprefix("Error: ")
    assert len(lines) == 2, done.stderr
    for line, unit in zip(lines, ("extract.pal", "tune.pal"), strict=True):
        assert re.fullmatch(DIFFERS.format(unit=unit), line), line
    assert _bytes(root) == before  # nothing recorded
    _raise(root, "tune.pal")
    done = _verify(root, "--unit", "tune.pal")
    assert done.returncode == 0, done.stderr
    pal_jobs = ["tune/pal", "tune/pal-decode", "tune/pal-resume"]
    pal_jobs += ["extract/pal", "extract/pal-2rank"]
    assert f"recorded anew: 5 jobs ({', '.join(pal_jobs)})" in done.stdout
    index = proof.read_index(root)
    assert {index["jobs"][j]["tune.pal"] for j in pal_jobs} == {2}
    after = _bytes(root)
    moved = sorted(k for k in before if after[k] != before[k])
    assert set(moved) <= {f"{j}.npz" for j in pal_jobs}
    assert {"extract/pal.npz", "extract/pal-2rank.npz"} <= set(moved)
    assert json.loads((root / "contracts.lock").read_text())["tune.pal"]["version"] == 2


@pytest.mark.slow
def test_steps_within_the_rule_cannot_add_up_past_it(tmp_path: Path) -> None:
    """Drift is bounded by the reference, not by the previous step: two
    refactors that each move PAL's features by about 6e-5 of their scale
    pass one by one against their parent, but the second is judged against
    the reference, 1.2e-4 away, and refused."""
    root = _copy(tmp_path)
    _edit(root, JOINT, JOINT + " * 1.00006")
    done = _verify(root, "--unit", "extract.pal")
    assert done.returncode == 0, done.stderr
    assert proof.read_index(root) == proof.read_index(ROOT)  # nothing recorded
    _edit(root, JOINT + " * 1.00006", JOINT + " * 1.00006 * 1.00006")
    done = _verify(root, "--unit", "extract.pal")
    assert done.returncode == 1
    assert "extract.pal: the outputs of the working tree differ" in done.stderr


@pytest.mark.slow
def test_a_pure_refactor_passes_and_an_empty_bump_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _edit(
        root,
        "prompts = self(q_t, q_v, text_on=on, image_on=on)\n",
        "chosen = self(q_t, q_v, text_on=on, image_on=on)\n",
    )
    _edit(root, JOINT, JOINT.replace("prompts", "chosen"))
    done = _verify(root, "--unit", "tune.pal")
    assert done.returncode == 0, done.stderr
    assert "compared with their reference: 5 jobs (tune/pal, " in done.stdout
    # a raised version whose outputs are the same is no contract change
    _raise(root, "tune.pal")
    done = _verify(root, "--unit", "tune.pal")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: tune.pal: version raised to 2 but its outputs are the same as "
        "its reference's: state why under reasons ('tune.pal@2: ...') in "
        "contracts.yaml, or keep the version"
    )
    path = root / "contracts.yaml"
    why = 'reasons:\n  "tune.pal@2": the checkpoints gain a field a later reader needs'
    path.write_text(path.read_text().replace("reasons: {}", why))
    done = _verify(root, "--unit", "tune.pal")
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
        "files",
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
    """The fixture's coverage data lives in verify's temporary folder: the
    report is written, the folder is gone (the runs faked here)."""
    seen: list[Path] = []

    def fake_run(version, todo, inputs, upstream=None, cover=None) -> None:
        assert cover is not None
        cover.write_text("data")
        seen.append(cover)

    monkeypatch.setattr(proof.runs, "build_inputs", lambda *a, **k: None)
    monkeypatch.setattr(proof.runs, "run_version", fake_run)
    monkeypatch.setattr(proof, "coverage_report", lambda data, root: f"{data.name}\n")
    report = tmp_path / "coverage.txt"
    outcome = proof.verify(ROOT, {"pixels"}, True, report, record=False)
    assert report.read_text() == ".coverage\n"
    assert seen and not seen[0].parent.exists()  # the temporary folder is gone
    # every job that reads a pixel cache: all but the two decoding the images
    decode = {"frozen/demo-decode", "tune/pal-decode"}
    assert outcome.ran == [j.name for j in runs.jobs() if j.name not in decode]
    assert outcome.problems[0] == (
        "pixels/demo: its outputs differ from its reference (pixels.h5) though "
        "no code of its units moved: a library or the fixture's inputs (the "
        "demo, prepare, the fake trees) moved them beyond the rule; if so, "
        "`pal contracts verify --new-inputs` records every job anew"
    )
