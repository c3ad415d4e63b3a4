"""The fixture that proves a contract: the contracted stages run on tiny data
with two versions of the code, outputs compared by the rule for "the same
output" (`pipeline.sameness`, DESIGN §2).

The inputs are built once, by the newer code: the demo's dataset and tiny
ViLT, a UPMC-Food101 tree and an N24News tree (both readers of the paper's
data), and each dataset's prepare folder. Then the newer code runs every
selected job, its pixels, frozen and tune outputs becoming the inputs of the
later jobs, and the older code runs the same jobs on those same inputs. Each
version reads its own `params.yaml` with the fixture's sizes and tune knobs
laid over it, in a process of its own (`PYTHONPATH` at its tree, through the
`pal` command group only, not either version's internals).

The jobs reach every method, the frozen variant, the pixel cache on and off
(images decoded by the loader), a tune killed after its first step and
resumed, and a 2-rank extract. `Job.units` names the contract units a job's
output depends on, so a difference is blamed on the units that changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.contracts import ContractError
from pipeline.sameness import compare_folders

DATASETS = ("demo", "food101", "n24news")
VARIANTS = {  # variant (a row of params' `ablation`) → its prompt method
    "pal": "pal",
    "frozen": None,
    "map": "map",
    "msp": "msp",
    "rebq": "rebq",
    "l2p": "l2p",
    "l2p_pp": "l2p",  # L2P++: the prefix form of the l2p method
    "dualprompt": "dualprompt",
}
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
}


@dataclass(frozen=True)
class Job:
    """One command of the fixture: `args` after `pal` ({in} and {out} and
    {params:NAME} filled in per version), the units its output depends on."""

    name: str
    args: tuple[str, ...]
    units: frozenset[str]
    needs: tuple[str, ...] = ()  # jobs whose newer-code output it reads
    kill_after: str | None = None  # a file in <out>.partial: kill, then rerun
    params: str = "demo"


CACHED = ("--pixels", "{job:pixels/demo}", "--frozen", "{job:frozen/demo}")
CACHED_FROM = ("pixels/demo", "frozen/demo")  # the jobs whose outputs CACHED names


def jobs() -> list[Job]:
    """Every job of the fixture, inputs before the jobs that read them."""
    return [*_pixels_and_frozen(), *_tunes(), *_extracts()]


def _pixels_and_frozen() -> list[Job]:
    """Each dataset's pixel cache and frozen queries; the cache off, and the
    frozen pass decoding the images itself, on the demo."""
    pixels = [
        Job(f"pixels/{ds}", ("pixels",), frozenset({"pixels"}), params=ds)
        for ds in (*DATASETS, "demo-off")
    ]
    frozen = [
        Job(
            f"frozen/{ds}",
            ("frozen", "--pixels", f"{{job:pixels/{ds}}}"),
            frozenset({"frozen"}),
            needs=(f"pixels/{ds}",),
            params=ds,
        )
        for ds in DATASETS
    ]
    return [
        *pixels,
        *frozen,
        Job("frozen/demo-decode", ("frozen",), frozenset({"frozen"})),
    ]


def _units(stage: str, method: str | None) -> frozenset[str]:
    return frozenset({stage} | ({f"{stage}.{method}"} if method else set()))


def _tunes() -> list[Job]:
    """Every variant's tune on the demo; PAL's also decoding its images and
    running its frozen pass, and killed after its first step, then resumed."""
    pal = ("tune", "--run", "0", "--variant", "pal", "--prepare", "{prepare:demo}")
    out = [
        Job(
            f"tune/{v}",
            (*pal[:4], v, *pal[5:], *CACHED),
            _units("tune", m),
            CACHED_FROM,
        )
        for v, m in VARIANTS.items()
    ]
    out.append(Job("tune/pal-decode", pal, _units("tune", "pal")))
    resumed = Job(
        "tune/pal-resume",
        (*pal, *CACHED),
        _units("tune", "pal"),
        CACHED_FROM,
        kill_after="step_01.pt",
    )
    return [*out, resumed]


def _extracts() -> list[Job]:
    """Every variant's extract from its tune; PAL's also as 2 ranks."""

    def args(v: str) -> tuple[str, ...]:
        return (
            "extract",
            "--variant",
            v,
            "--prepare",
            "{prepare:demo}",
            "--tune",
            f"{{job:tune/{v}}}",
            *CACHED,
        )

    out = [
        Job(f"extract/{v}", args(v), _units("extract", m), (*CACHED_FROM, f"tune/{v}"))
        for v, m in VARIANTS.items()
    ]
    two = Job(
        "extract/pal-2rank",
        args("pal"),
        _units("extract", "pal"),
        (*CACHED_FROM, "tune/pal"),
        params="demo-2rank",
    )
    return [*out, two]


def selected(units: Iterable[str]) -> list[Job]:
    """The jobs whose output depends on one of `units`."""
    wanted = set(units)
    return [job for job in jobs() if job.units & wanted]


def variants_of(code: Path) -> set[str]:
    """The variants (rows of `ablation`) of `code`'s params.yaml."""
    raw = yaml.safe_load((code / "params.yaml").read_text(encoding="utf-8"))
    return set(raw.get("ablation") or {})


def runnable(todo: Iterable[Job], variants: set[str]) -> list[Job]:
    """The jobs of `todo` whose variant (`--variant`) is one of `variants`, and
    those of no variant: a row added after a tree's commit cannot run there."""
    out = []
    for job in todo:
        args = list(job.args)
        variant = args[args.index("--variant") + 1] if "--variant" in args else None
        if variant is None or variant in variants:
            out.append(job)
    return out


def build_inputs(code: Path, where: Path) -> None:
    """The demo (through the newer code's `pal demo`), the two real layouts'
    trees and every dataset's prepare folder, in `where`."""
    from pipeline.fakes.trees import make_food101_tree, make_n24news_tree

    where.mkdir(parents=True, exist_ok=True)
    make_food101_tree(where / "food101", classes=5, train=3, test=2)
    make_n24news_tree(where / "n24news", 4, {"train": 3, "dev": 1, "test": 2})
    params = write_params(code, where, where / "params")
    _pal(code, where, ["demo", "--params", str(params["demo"]), "--out", "demo"])
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
    variants of the demo's): `code`'s params.yaml with the fixture laid over,
    tune and extract on `device` (bench/gpu_check.py's `contracts` part runs
    the fixture on a GPU: bf16, CUDA graphs)."""
    base = yaml.safe_load((code / "params.yaml").read_text(encoding="utf-8"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    names = {**{ds: ds for ds in DATASETS}, "demo-off": "demo", "demo-2rank": "demo"}
    for name, ds in names.items():
        raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in base.items()}
        for section, values in FIXTURE.items():
            raw[section] = {**raw.get(section, {}), **values}
        data = dict(DATA[ds], root=str(inputs / DATA[ds]["root"]))
        raw["data"] = {**raw["data"], **data, "per_class": None}
        raw["model"] = {**raw["model"], "backbone": str(inputs / "demo" / "vilt")}
        raw["tune"]["device"] = raw["extract"]["device"] = device
        if name == "demo-off":
            raw["pixels"]["enabled"] = False
        if name == "demo-2rank":
            raw["extract"]["processes"] = 2
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return paths


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
    """One version of the code: its tree and where its jobs write."""

    code: Path
    work: Path
    device: str = "cpu"
    params: dict[str, Path] = field(default_factory=dict)

    def resolve(self, job: Job, inputs: Path, newer: Version) -> list[str]:
        """The job's command line for this version (inputs from `newer`)."""
        out = []
        for arg in job.args:
            if arg.startswith("{job:"):
                arg = str(newer.work / arg[5:-1])
            elif arg.startswith("{prepare:"):
                arg = str(inputs / "prepare" / arg[9:-1])
            out.append(arg)
        return [
            *out,
            "--params",
            str(self.params[job.params]),
            "--out",
            str(self.work / job.name),
        ]


DRIVER = r"""
import json, os, signal, subprocess, sys, time
from pathlib import Path
from pipeline.cli import main

def failed(job, why):
    if not job["keep_going"]:
        sys.exit(f"{job['name']}: {why}")
    out = Path(job["args"][job["args"].index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / FAILED).write_text(f"{why}\n")


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
            failed(job, f"exit {exc.code}")
    except Exception as exc:
        failed(job, str(exc))
"""
FAILED = "FAILED"  # in a job's output folder: why the older code's run of it failed


def run_version(
    version: Version,
    todo: list[Job],
    inputs: Path,
    newer: Version,
    cover: Path | None,
    keep_going: bool = False,
) -> None:
    """Run `todo` with `version`'s code in one driver process (under
    coverage.py, subprocesses too, when `cover` is a data file). A job that
    fails stops the fixture, or with `keep_going` (the older code, which may
    not read what the newer wrote: a raised checkpoint format) leaves its
    reason in `FAILED` in its output folder, an output that differs."""
    version.work.mkdir(parents=True, exist_ok=True)
    version.params = write_params(
        version.code, inputs, version.work / "params", version.device
    )
    listing = [
        {
            "name": j.name,
            "args": version.resolve(j, inputs, newer),
            "kill_after": j.kill_after,
            "keep_going": keep_going,
        }
        for j in todo
    ]
    (version.work / "jobs.json").write_text(json.dumps(listing))
    (version.work / "driver.py").write_text(f"FAILED = {FAILED!r}\n{DRIVER}")
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


def differences(a: Path, b: Path) -> list[str]:
    """Files of output folders `a` and `b` that are not the same by the
    project's rule (`pipeline.sameness`: exact values equal, floats within
    `RTOL` of their scale), as 'file:key (size)'; the contract stamps and
    seals are left out (derived from the rest)."""
    return [str(d) for d in compare_folders(a, b)]
