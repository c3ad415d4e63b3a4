"""The fixture that proves a contract (`contract_proof`): the contracted
stages run on tiny data, through the `pal` command group only, in a process
of its own (`PYTHONPATH` at the code's tree).

The inputs come first: the demo's dataset and tiny ViLT (its weights the
reference's), a UPMC-Food101 tree, an N24News tree (both readers of the
paper's data) and a tree in the files layout (a dataset of one's own), and
each dataset's prepare folder. Every job reads the
code's `params.yaml` with the fixture's sizes and tune knobs laid over it;
the pixels, frozen and tune outputs of some jobs are the inputs of others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.contracts import ContractError
from pipeline.params import method_names

DATASETS = ("demo", "food101", "n24news", "files")
# variant (a row of params' `ablation`) → its prompt method: every method of
# pipeline/methods (a new one's row is added to the fixture's params when
# params.yaml has none), no prompts, and L2P++ (the prefix form of l2p)
VARIANTS: dict[str, str | None] = {m: m for m in method_names()}
VARIANTS |= {"frozen": None, "l2p_pp": "l2p"}
FIXTURE: dict[str, dict[str, Any]] = {  # laid over each version's params.yaml
    "demo": {
        "seed": 0,
        "n_classes": 4,
        "train_per_class": 8,
        "test_per_class": 4,
        "pretrain_steps": 20,
    },
    "data": {"tasks": 2, "missing_type": "both", "missing_rate": 0.5, "seed": 0},
    "pixels": {"enabled": True, "workers": 1},
    "prompt": {"pool_size": 4, "length": 4, "layers": [0, 1]},
    # tune: every knob that moves a tuning's bytes (a new default in params.yaml
    # must not read as a change of the code)
    "tune": {"epochs": 1, "batch_size": 4, "lr": 1.0e-4, "head_lr": 1.0e-2}
    | {"weight_decay": 0.0, "warmup": 0.1, "recon_weight": 0.01, "prompt_tasks": 0}
    | {"seed": 0, "device": "cpu"},
    "extract": {"batch_size": 16, "device": "cpu", "processes": 1},
}
DATA = {  # per dataset: its `data` keys (root relative to the inputs)
    "demo": {"dataset": "demo", "root": "demo/dataset"},
    "food101": {"dataset": "food101", "root": "food101"},
    "n24news": {"dataset": "n24news", "root": "n24news"},
    "files": {"dataset": "files", "root": "files"},
}


@dataclass(frozen=True)
class Job:
    """One command of the fixture: `args` after `pal` ({job:NAME}: that job's
    output folder; {prepare:DATASET}: a prepare folder), the units its own
    output depends on."""

    name: str
    args: tuple[str, ...]
    units: frozenset[str]
    kill_after: str | None = None  # a file in <out>.partial: kill, then rerun
    params: str = "demo"

    @property
    def needs(self) -> list[str]:
        """The jobs whose outputs it reads."""
        return [arg[5:-1] for arg in self.args if arg.startswith("{job:")]


VILT_WEIGHTS = "demo/vilt/model.safetensors"  # in the inputs: the tiny ViLT's floats
CACHED = ("--pixels", "{job:pixels/demo}", "--frozen", "{job:frozen/demo}")


def _units(stage: str, method: str | None = None) -> frozenset[str]:
    return frozenset({stage, f"{stage}.{method}"} if method else {stage})


def jobs() -> list[Job]:
    """Every job of the fixture, inputs before the jobs that read them: each
    dataset's pixel cache and frozen queries (on the demo also the cache off,
    and a frozen pass decoding the images itself); every variant's tune and
    extract on the demo, PAL's tune also decoding its images and running its
    own frozen pass, and killed after its first step, then resumed; PAL's
    extract also as 2 ranks."""
    out = [
        Job(f"pixels/{ds}", ("pixels",), _units("pixels"), params=ds)
        for ds in (*DATASETS, "demo-off")
    ]
    for ds in DATASETS:
        args: tuple[str, ...] = ("frozen", "--pixels", f"{{job:pixels/{ds}}}")
        out.append(Job(f"frozen/{ds}", args, _units("frozen"), params=ds))
    out.append(Job("frozen/demo-decode", ("frozen",), _units("frozen")))
    tune = ("tune", "--run", "0", "--prepare", "{prepare:demo}", "--variant")
    for v, m in VARIANTS.items():
        out.append(Job(f"tune/{v}", (*tune, v, *CACHED), _units("tune", m)))
    pal = _units("tune", "pal")
    out.append(Job("tune/pal-decode", (*tune, "pal"), pal))
    out.append(Job("tune/pal-resume", (*tune, "pal", *CACHED), pal, "step_01.pt"))
    extract = ("extract", "--prepare", "{prepare:demo}", *CACHED, "--tune")
    for v, m in VARIANTS.items():
        args = (*extract, f"{{job:tune/{v}}}", "--variant", v)
        out.append(Job(f"extract/{v}", args, _units("extract", m)))
    args = (*extract, "{job:tune/pal}", "--variant", "pal")
    two = Job("extract/pal-2rank", args, _units("extract", "pal"), params="demo-2rank")
    return [*out, two]


def selected(units: Iterable[str]) -> list[Job]:
    """The jobs whose own output depends on one of `units`."""
    wanted = set(units)
    return [job for job in jobs() if job.units & wanted]


def with_needs(todo: Iterable[Job]) -> list[Job]:
    """`todo` and the jobs whose outputs they read, transitively, in order."""
    by_name = {j.name: j for j in jobs()}
    names: set[str] = set()
    stack = [j.name for j in todo]
    while stack:
        name = stack.pop()
        if name not in names:
            names.add(name)
            stack.extend(by_name[name].needs)
    return [j for j in jobs() if j.name in names]


def contract_units(job: Job) -> frozenset[str]:
    """The units a job's output depends on: its own and, through the outputs
    it reads, those of the jobs upstream (tune/pal: pixels and frozen too)."""
    return frozenset().union(*(j.units for j in with_needs([job])))


def build_inputs(code: Path, where: Path, weights: Path | None = None) -> None:
    """The demo (through `code`'s `pal demo`; the tiny ViLT's weights then
    replaced by `weights`, when given), the two real layouts' trees and
    every dataset's prepare folder, in `where`."""
    from pipeline.fakes.trees import (
        make_files_tree,
        make_food101_tree,
        make_n24news_tree,
    )

    where.mkdir(parents=True, exist_ok=True)
    make_food101_tree(where / "food101", classes=5, train=3, test=2)
    make_n24news_tree(where / "n24news", 4, {"train": 3, "dev": 1, "test": 2})
    # some images missing and some texts empty: the dataset's own missing codes
    make_files_tree(where / "files", classes=4, per_split={"train": 3, "test": 2})
    params = write_params(code, where, where / "params")
    _pal(code, where, ["demo", "--params", str(params["demo"]), "--out", "demo"])
    if weights is not None:
        shutil.copyfile(weights, where / VILT_WEIGHTS)
    for ds in DATASETS:
        _pal(
            code,
            where,
            [
                "prepare",
                "--params",
                str(params[ds]),
                "--run",
                "0",
                "--out",
                f"prepare/{ds}",
            ],
        )


def write_params(
    code: Path, inputs: Path, folder: Path, device: str = "cpu"
) -> dict[str, Path]:
    """One params file per dataset (and the pixel-cache-off and 2-rank
    variants of the demo's), its paths relative to `folder`'s parent (where
    the jobs run): `code`'s params.yaml with the fixture laid over,
    tune and extract on `device` (palbench/gpu_check.py's `contracts` part runs
    the fixture on a GPU: bf16, CUDA graphs)."""
    base = yaml.safe_load((code / "params.yaml").read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    names = {**{ds: ds for ds in DATASETS}, "demo-off": "demo", "demo-2rank": "demo"}
    for name, ds in names.items():
        raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
        for section, values in FIXTURE.items():
            raw[section] = {**raw.get(section, {}), **values}
        data = dict(DATA[ds], root=_relative(inputs / DATA[ds]["root"], folder.parent))
        raw["data"] = {**raw["data"], **data, "per_class": None}
        backbone = _relative(inputs / "demo" / "vilt", folder.parent)
        raw["model"] = {**raw["model"], "backbone": backbone}
        raw["tune"]["device"] = raw["extract"]["device"] = device
        raw["ablation"] = _with_method_rows(raw.get("ablation") or {})
        if name == "demo-off":
            raw["pixels"]["enabled"] = False
        if name == "demo-2rank":
            raw["extract"]["processes"] = 2
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return paths


def _with_method_rows(ablation: Mapping[str, Any]) -> dict[str, Any]:
    """params' `ablation` rows, with one for each method that has none (a
    new method's module, before its author adds its row)."""
    rows = dict(ablation)
    for m in VARIANTS:
        if m not in rows and VARIANTS[m] == m:
            rows[m] = {"label": m, "changes": {"prompt": {"method": m}}}
    return rows


def _env(code: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _pal(code: Path, cwd: Path, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pipeline", *args]
    done = subprocess.run(cmd, cwd=cwd, env=_env(code), capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise ContractError(f"pal {' '.join(args[:1])} failed: {' '.join(tail)}")


@dataclass
class Version:
    """A tree of the code and where its jobs write (palbench/float_paths.py and
    palbench/gpu_check.py run the fixture with more than one)."""

    code: Path
    work: Path
    device: str = "cpu"
    params: dict[str, Path] = field(default_factory=dict)

    def resolve(self, job: Job, inputs: Path, upstream: Version) -> list[str]:
        """The job's command line (the outputs it reads from `upstream`)."""
        out = []
        for arg in job.args:
            if arg.startswith("{job:"):
                arg = _relative(upstream.work / arg[5:-1], self.work)
            elif arg.startswith("{prepare:"):
                arg = _relative(inputs / "prepare" / arg[9:-1], self.work)
            out.append(arg)
        params = _relative(self.params[job.params], self.work)
        return [*out, "--params", params, "--out", job.name]


def _relative(path: Path, start: Path) -> str:
    """`path` from `start` (the jobs' working folder): the paths an output
    records (a checkpoint's params, a shard's backbone) are then the same
    wherever the fixture runs."""
    return os.path.relpath(path, start)


DRIVER = r"""
import json, subprocess, sys, time
from pathlib import Path
from pipeline.cli import main

for job in json.loads(Path(sys.argv[1]).read_text()):
    args, kill = job["args"], job["kill_after"]
    if kill:  # a run killed after its first step, then resumed in-process
        out = Path(args[args.index("--out") + 1])
        partial = out.with_name(out.name + ".partial") / kill
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args])
        while proc.poll() is None and not partial.exists():
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    try:
        main(args, standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            sys.exit(f"{job['name']}: exit {exc.code}")
    except Exception as exc:
        sys.exit(f"{job['name']}: {exc}")
"""


def run_version(
    version: Version,
    todo: list[Job],
    inputs: Path,
    upstream: Version | None = None,
    cover: Path | None = None,
) -> None:
    """Run `todo` with `version`'s code in one driver process (under
    coverage.py, subprocesses too, when `cover` is a data file), reading the
    outputs of earlier jobs from `upstream` (default: its own). A job that
    fails stops the fixture: a ContractError with its last line."""
    version.work.mkdir(parents=True, exist_ok=True)
    version.params = write_params(
        version.code, inputs, version.work / "params", version.device
    )
    listing = [
        {
            "name": j.name,
            "args": version.resolve(j, inputs, upstream or version),
            "kill_after": j.kill_after,
        }
        for j in todo
    ]
    (version.work / "jobs.json").write_text(json.dumps(listing))
    (version.work / "driver.py").write_text(DRIVER)
    cmd = [
        sys.executable,
        str(version.work / "driver.py"),
        str(version.work / "jobs.json"),
    ]
    if cover is not None:
        rc = version.work / "coveragerc"
        rc.write_text(
            "[run]\nparallel = True\npatch = subprocess\n"
            f"data_file = {cover}\nsource = {version.code}\n"
        )
        cmd[1:1] = ["-m", "coverage", "run", f"--rcfile={rc}"]
    log = version.work / "driver.log"
    with log.open("w") as f:
        done = subprocess.run(
            cmd,
            cwd=version.work,
            env=_env(version.code),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if done.returncode:
        last = log.read_text(errors="replace").strip().splitlines()[-1:]
        raise ContractError(
            f"{version.code}: the fixture failed: {' '.join(last)} ({log})"
        )
