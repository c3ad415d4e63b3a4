"""dvc.yaml declares the code and params each stage reads.

Code, an import-boundary check: a stage's command (`pal tune`) names its
module through the command group's table (`pipeline.cli.COMMANDS`); the
stage's code is that module and every project module it imports, transitively
(`pipeline.closure.code_closure`, the same closure the resume signature
hashes). Every file of it must lie under a code dep of the stage (a file, or a
folder such as `palcore` or `solver` declared whole), and every declared file,
and at least one file of every declared folder, must be imported: no
undeclared import, and nothing declared that the stage never reads.

Params: the sections its code loads (`load(path, "tune")` and the like), each
as the whole section, or key by key where run-only keys are left out
(`palcore.params.outcome_keys`); with `--run`, also `protocol.vary` (the seeds a
run moves), with `--variant NAME`, also `ablation.NAME.changes` (the keys it
changes), with `--pipeline NAME`, also `pipelines.NAME` and the variant rows
of `ablation` (their changes and labels).

The expensive stages (pixels, frozen, tune, extract) declare no code: they
are keyed on their output contract instead (DESIGN §2), the stamp the
`contracts` stage writes for them, and that stage declares the code of all
four (`pipeline.contract_code.watched_files`) beside its own.

The stages are those DVC resolves from the committed pipeline files (one
per run and variant of a `matrix`/`foreach` stage): dvc.yaml alone, the
ablation's variants being more variants of it (`pal-paper run ablation`).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import committed, committed_params

from palcore.params import outcome_keys
from pipeline import cli as pipeline_cli
from pipeline.closure import ROOT, code_closure, imported_modules
from pipeline.contract_code import watched_files
from pipeline.contracts import STAGES as CONTRACTED
from pipeline.sections import PARAM_CLASSES
from solver import cli as solver_cli

GROUPS = {"pal": pipeline_cli.COMMANDS, "pal-solver": solver_cli.COMMANDS}
SECTION_CLASSES = PARAM_CLASSES
CODE = ("palcore", "pipeline/", "solver")


def stage_module(cmd: str) -> str:
    """`pal tune --x` → `pipeline.stages.tune`."""
    group, command = cmd.split()[:2]
    return GROUPS[group][command][0].split(":")[0]


def code_problems(code: set[str], deps: list[str], root: Path) -> list[str]:
    """Undeclared imports and declared code the stage never imports."""
    files, folders = set(), set()
    for dep in deps:
        if dep.startswith(CODE):
            (folders if (root / dep).is_dir() else files).add(dep.rstrip("/"))

    def covered(path: str) -> bool:
        return path in files or any(path.startswith(f + "/") for f in folders)

    problems = [f"undeclared code dep {p}" for p in sorted(code) if not covered(p)]
    problems += [f"declared but not imported {p}" for p in sorted(files - code)]
    problems += [
        f"declared but not imported {f}/"
        for f in sorted(folders)
        if not any(p.startswith(f + "/") for p in code)
    ]
    return problems


def loaded_sections(files: list[Path]) -> set[str]:
    """Sections named by a string constant in a call of `load`/`load_section`."""
    sections = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else getattr(func, "id", "")
            )
            if name not in ("load", "load_section"):
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in SECTION_CLASSES:
                    sections.add(arg.value)
    return sections


def single_keys(files: list[Path]) -> set[str]:
    """Keys named by string constants in a call of `section_value(source,
    SECTION, KEY)`: one key of another stage's section (not its run-only keys,
    such as extract.num_workers: they change speed, never a result)."""
    keys = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "section_value"
                and len(node.args) == 3
                and all(isinstance(a, ast.Constant) for a in node.args[1:])
            ):
                section, key = node.args[1].value, node.args[2].value
                cls = SECTION_CLASSES.get(section)
                if cls is None or key in outcome_keys(cls):
                    keys.add(f"{section}.{key}")
    return keys


def expected_params(sections: set[str]) -> set[str]:
    keys = set()
    for section in sections:
        cls = SECTION_CLASSES[section]
        outcome = outcome_keys(cls)
        if len(outcome) == len([f for f in cls.__dataclass_fields__]):
            keys.add(section)
        else:
            keys.update(f"{section}.{k}" for k in outcome)
    return keys


def recorded_if_set() -> set[str]:
    """The keys added after outputs were first recorded
    (`palcore.params.RECORDED_IF_SET`): a contracted stage is keyed on them
    through its stamp, which the `contracts` stage writes (and so declares
    them), not through its own params."""
    return {
        f"{section}.{f.name}"
        for section, cls in SECTION_CLASSES.items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("recorded_if_set")
    }


def run_params(cmd: str) -> set[str]:
    """The params a stage's --run and --variant options make it read."""
    words = shlex.split(cmd)
    keys = {"protocol.vary"} if "--run" in words else set()
    if words[:3] == ["pal", "contracts", "stamp"]:
        keys.add("ablation")  # a stamp for every variant row
    if "--variant" in words:
        keys.add(f"ablation.{words[words.index('--variant') + 1]}.changes")
    # --pipeline NAME: the variants pipelines.NAME lists, their rows (labels,
    # changes) and the runs of the protocol
    for i, word in enumerate(words):
        if word == "--pipeline":
            keys.update({f"pipelines.{words[i + 1]}", "ablation"})
    return keys


def contract_stamp(cmd: str) -> str | None:
    """The stamp a contracted stage's command must depend on (None: the stage
    is not contracted and declares its code)."""
    words = shlex.split(cmd)
    stage = words[1]
    if words[0] != "pal" or stage not in CONTRACTED:
        return None
    if "--variant" in words:
        return f"data/contracts/{stage}/{words[words.index('--variant') + 1]}.json"
    return f"data/contracts/{stage}.json"


def mismatches(spec: dict[str, Any], root: Path = ROOT) -> list[str]:
    """What is wrong with one stage's deps and params (empty: nothing)."""
    module = stage_module(spec["cmd"])
    files = code_closure(module, root)
    code = {p.relative_to(root).as_posix() for p in files}
    stamp = contract_stamp(spec["cmd"])
    deps = spec.get("deps", [])
    stamped: set[str] = set()
    if stamp is not None:  # keyed on its contract: no code declared
        problems = [f"declared code dep {d}" for d in deps if d.startswith(CODE)]
        problems += [] if stamp in deps else [f"no contract stamp {stamp}"]
        stamped = recorded_if_set()  # in the stamp when set (contracts stage)
    else:
        if module == "pipeline.stages.contracts":  # the guard of the four
            code |= set(watched_files(root))
        problems = code_problems(code, deps, root)
    params = expected_params(loaded_sections(files)) | run_params(spec["cmd"])
    params |= single_keys(files)
    params -= stamped
    declared = set(spec.get("params", []))
    problems += [f"undeclared params {p}" for p in sorted(params - declared)]
    problems += [f"declared params not read {p}" for p in sorted(declared - params)]
    return problems


def resolved_stages(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """Every stage of the pipeline files as DVC resolves it: cmd, deps, params
    (a stage of a file other than dvc.yaml named `<file>:<stage>`)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    stages = {}
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            params = [d for d in stage.deps if isinstance(d, ParamsDependency)]
            file = Path(stage.path).resolve().relative_to(Path(root).resolve())
            name = stage.name if str(file) == "dvc.yaml" else f"{file}:{stage.name}"
            stages[name] = {
                "cmd": stage.cmd,
                "deps": [d.def_path for d in stage.deps if d not in params],
                "params": [k for d in params for k in d.params],
            }
    return stages


def committed_pipeline_files() -> list[str]:
    """Every pipeline file (`dvc.yaml`, in any folder) committed at HEAD."""
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "HEAD"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return sorted(rel for rel in listed if Path(rel).name == "dvc.yaml")


def committed_project() -> Path:
    """The committed pipeline files and params.yaml in a folder of their own:
    the stages as committed, not as a user's `cp configs/food101.yaml
    params.yaml` or experiment left the workspace's."""
    from dvc.repo import Repo

    where = Path(tempfile.mkdtemp(prefix="pal-committed-"))
    Repo.init(str(where), no_scm=True)
    for rel in (*committed_pipeline_files(), "params.yaml"):
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(committed(rel))
    return where


pytest.importorskip("dvc", reason="dvc resolves the stages")
STAGES = resolved_stages(committed_project())


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_declares_exactly_its_code_and_params(stage: str) -> None:
    assert mismatches(STAGES[stage]) == []


def test_the_committed_lock_names_exactly_the_stages_of_the_one_pipeline() -> None:
    """The bare `dvc status` after `make run` (which writes the committed
    lock) says the pipeline is up to date only when every stage of every
    committed pipeline file is in dvc.lock: a second pipeline file (the
    ablation had one, its 39 stages never run by `make run`) would list each
    of its stages there. And DVC keeps a lock's entry when its stage goes (a
    renamed stage, a variant dropped from a matrix): the lock holds none."""
    assert committed_pipeline_files() == ["dvc.yaml"]
    locked = set(yaml.safe_load(committed("dvc.lock"))["stages"])
    assert len(STAGES) == 27  # demo, contracts, pixels, frozen, solve, evaluate,
    # prepare × 3 runs, tune and extract × 3 variants × 3 runs
    assert sorted(locked ^ set(STAGES)) == []


@pytest.mark.parametrize("group", ["pipeline/cli.py", "solver/cli.py"])
def test_command_groups_only_dispatch(group: str) -> None:
    """The groups are no stage's code: they import only the CLI plumbing, and
    their tables name modules (strings), which the stages' closures start from."""
    name = group[:-3].replace("/", ".")
    assert imported_modules(ROOT / group, name) == {"palcore.cliutil"}


def test_an_undeclared_import_is_caught(tmp_path: Path) -> None:
    """A copy of the code where pipeline.stages.demo imports solver.synthetic inside a
    function: the demo stage's deps no longer match."""
    for package in ("palcore", "pipeline", "solver"):
        shutil.copytree(ROOT / package, tmp_path / package)
    demo = tmp_path / "pipeline" / "stages" / "demo.py"
    demo.write_text(
        demo.read_text() + "\n\ndef _extra() -> None:\n    import solver.synthetic\n"
    )
    assert mismatches(STAGES["demo"], tmp_path) == [
        "undeclared code dep solver/__init__.py",
        "undeclared code dep solver/shards.py",
        "undeclared code dep solver/synthetic.py",
    ]
    assert mismatches(STAGES["demo"]) == []


def test_an_undeclared_params_section_is_caught() -> None:
    spec = dict(STAGES["tune@pal-0"], params=["model", "prompt"])
    problems = mismatches(spec)
    assert "undeclared params tune.lr" in problems
    assert all(
        p.startswith(("undeclared params tune.", "undeclared params protocol.vary"))
        or p == "undeclared params ablation.pal.changes"
        for p in problems
    )
    assert "undeclared params tune.num_workers" not in problems  # run-only
    assert "undeclared params protocol.vary" in problems  # pal tune --run
    assert "undeclared params ablation.pal.changes" in problems  # --variant pal


def test_closure_follows_imports_inside_functions_and_packages() -> None:
    closure = {
        p.relative_to(ROOT).as_posix() for p in code_closure("pipeline.stages.demo")
    }
    assert "pipeline/fakes/demo_model.py" in closure  # imported inside write_backbone
    assert {"pipeline/__init__.py", "palcore/__init__.py"} <= closure
    assert not any(p.startswith("solver/") for p in closure)  # torch-free solver apart


@pytest.mark.parametrize(
    "params_file", ["params.yaml", "configs/food101.yaml", "configs/n24news.yaml"]
)
def test_params_files_hold_every_declared_key(params_file: str) -> None:
    """DVC refuses to run a stage whose declared key is missing from the file."""
    raw = yaml.safe_load((ROOT / params_file).read_text())
    for stage, spec in STAGES.items():
        for key in spec.get("params", []):
            node = raw
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, (
                    f"{params_file} lacks {key} (declared by stage {stage})"
                )
                node = node[part]


def test_a_variant_is_added_in_two_edits_of_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row under `ablation` (label and changes) and its name in a
    pipeline's list: DVC then runs its tune and extract chains, the analytic
    stage fits it and the report labels it, with no edit of dvc.yaml."""
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True)
    (tmp_path / "dvc.yaml").write_text(committed("dvc.yaml"))
    params = committed_params()
    params["ablation"]["long"] = {  # edit 1
        "label": "PAL, prompts of length 8",
        "changes": {"prompt": {"length": 8}},
    }
    params["pipelines"]["main"].append("long")  # edit 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)  # DVC names stages relative to the working folder
    stages = resolved_stages(tmp_path)
    runs = params["protocol"]["runs"]
    for stage in ("tune", "extract"):
        assert {f"{stage}@long-{r}" for r in runs} <= set(stages)
        assert mismatches(stages[f"{stage}@long-0"]) == []
    assert "ablation.long.changes" in stages["tune@long-0"]["params"]
    assert (
        "--prepare data/prepare/0 --out data/tune/long/0"
        in (stages["tune@long-0"]["cmd"])
    )
    assert STAGES["solve"] == stages["solve"]  # reads the list from params
    from palcore.variants import pipeline_variants, variant_label

    assert pipeline_variants(tmp_path / "params.yaml", "main")[-1] == "long"
    label = variant_label(tmp_path / "params.yaml", "long")
    assert label == "PAL, prompts of length 8"


def _stages_reading(path: str) -> set[str]:
    """The stages whose declared code covers `path`."""
    return {
        name
        for name, spec in STAGES.items()
        if any(
            path == dep or path.startswith(dep.rstrip("/") + "/")
            for dep in spec["deps"]
        )
    }


def test_solver_code_reruns_only_the_analytic_stages() -> None:
    """A change to solve-side code never reruns tune or extract (hours of GPU
    on a real dataset); a change to palcore reruns the cheap stages and the
    contracts' guard, and no contracted stage: their code is checked by the
    guard, and their outputs keyed on their contracts."""
    analytic = {"solve", "evaluate"}
    assert _stages_reading("solver/solve.py") == analytic
    assert _stages_reading("solver/rls.py") == analytic
    # the shard format extract writes: the guard watches it for extract
    assert _stages_reading("solver/shards.py") == analytic | {"contracts"}
    contracted = {n for n in STAGES if n.split(":")[-1].split("@")[0] in CONTRACTED}
    assert len(contracted) > len(CONTRACTED)  # every run and variant
    cheap = set(STAGES) - contracted
    assert _stages_reading("palcore/params.py") == cheap
    assert _stages_reading("pipeline/methods/pal.py") == {"contracts"}
