"""`pal extract`: dump prompted joint embeddings into feature shards (DESIGN §3).

For each step k, step k's model is rebuilt from `step_XX.pt` and run over
task k's training samples (`step_XX/train.h5`) and the test samples of tasks
1..k (`step_XX/test.h5`, one group per task, with `bp_logits` (n, C_k): the BP
head's logits over the classes seen). Shards go through `solver.shards`, so
they are validated and renamed into place atomically.

Deterministic: ViLT draws the patch order from torch's RNG, so the RNG is
reseeded before every batch; the same checkpoint and samples give the same
bytes. Finished steps wait in `<out>.partial/` until the run completes, so an
interrupted run resumes after them (`pipeline.stages.resume`).

Several GPUs: `extract.processes: N` (or run under `torchrun --nproc-per-node
N`); rank r takes the r-th contiguous share of the step's batches and writes
`train-0000r.h5` / `test-0000r.h5`. Whole batches keep every sample in the
batch, and under the seed, it has in a one-process run: read in rank order,
the parts hold the same bytes as one shard.

Reads params `extract` (and the params recorded in the checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import torch

from palcore.cliutil import clean_errors, folder_option, run_params_option
from palcore.errors import PalError
from palcore.outputs import step_dir_name, step_of_name
from palcore.params import Source, load_section, outcome_record
from pipeline import params as pparams
from pipeline.contracts import check_stamp, prompt_method, write_stamp
from pipeline.data.pixel_cache import PixelCache, open_pixels
from pipeline.data.samples import Sample, Tasks, read_prepare, select
from pipeline.methods import model_from_checkpoint
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import (
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    params_diff,
)
from pipeline.model.device import resolve_device
from pipeline.model.embed import StepLoader
from pipeline.model.encoder import Backbone
from pipeline.model.queries import FrozenQueries, open_frozen
from pipeline.stages.extract_shards import ExtractRun, extract_step, step_plan
from pipeline.stages.options import frozen_option, pixels_option
from pipeline.stages.resume import (
    PartialRun,
    hash_samples,
    run_environment,
    signature,
)

log = logging.getLogger(__name__)

KEY_VERSION = 1  # bump when the extraction arithmetic changes


def parse_steps(text: str | None, n_tasks: int) -> list[int]:
    """`None`/"all" → 1..K; "2" / "1,3" / "2-4" → those steps (checked)."""
    if text is None or text.strip() == "all":
        return list(range(1, n_tasks + 1))
    steps: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            steps.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise PalError(f"--steps {text!r}: expected e.g. 2, 1,3 or 2-4") from None
    bad = [s for s in sorted(steps) if not 1 <= s <= n_tasks]
    if bad or not steps:
        raise PalError(f"--steps {text!r}: steps must lie in 1..{n_tasks}")
    return sorted(steps)


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment, (0, 1) otherwise."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def extract(
    prepare_dir: str | Path,
    tune_dir: str | Path,
    out_dir: str | Path,
    params: pparams.ExtractParams,
    *,
    steps: Sequence[int] | str | None = None,
    fresh: bool = False,
    data_root: str | Path | None = None,
    frozen_dir: str | Path | None = None,
    pixels: str | Path | None = None,
) -> list[Path]:
    """Write the shards of `steps` (default: all; a string as for `--steps`);
    returns the step folders. `data_root`: where the images are (`data.root`);
    `frozen_dir`: `pal frozen`'s folder (None: the frozen pass runs here);
    `pixels`: a folder written by `pal pixels`, read instead of decoding. One
    loader serves every step (`embed.StepLoader`: its workers start once).

    Finished steps wait in `<out>.partial/` (`-rankNNNNN` under torchrun) until
    every step is done, then move into `out`; a rerun with the same code,
    params and inputs reuses them (`pipeline.stages.resume`), `fresh` discards them.
    """
    samples, tasks = read_prepare(prepare_dir, data_root)
    cache = open_pixels(pixels)
    if steps is None or isinstance(steps, str):
        steps = parse_steps(steps, tasks.n_tasks)
    rank, world = rank_and_world()
    device = _device(params, rank, world)
    out = Path(out_dir)
    ckpts = _checkpoints(Path(tune_dir), steps, tasks)
    digests = step_samples_digests(samples, tasks)
    check_stamp("extract", prompt_method(ckpts[steps[0]]["params"]["prompt"]))
    m = ckpts[steps[0]]["params"]["model"]  # every step's (`_check_checkpoint`)
    frozen = open_frozen(frozen_dir, m["backbone"], m["max_text_len"], None)
    sources = _signatures(params, digests, ckpts, world, rank, device, frozen)
    suffix = "" if world == 1 else f".rank{rank:05d}"
    partial = PartialRun(out, sources, fresh=fresh, suffix=suffix)
    names = _shard_names(world, rank)
    ready = partial.reusable([step_dir_name(s) for s in steps], names)  # verified
    todo = [s for s in steps if step_dir_name(s) not in ready]
    run = ExtractRun(samples, tasks, params, partial.path, names, rank, world, frozen)
    _run_steps(run, todo, ckpts, digests, partial, device, cache)
    _finish(partial, out, steps, ready, names, device)
    if rank == 0:
        _settle(out, steps, world, tasks.n_tasks, ckpts[steps[0]])
    return [out / step_dir_name(step) for step in steps]


def _run_steps(
    run: ExtractRun,
    todo: list[int],
    ckpts: dict[int, dict],
    digests: Sequence[str],
    partial: PartialRun,
    device: torch.device,
    pixels: PixelCache | None,
) -> None:
    """Each step of `todo`: its shards made (or their reusable parts kept,
    `step_plan`) and sealed in the partial folder. The backbone loads once,
    and one loader serves every step."""
    reuse, parts = step_plan(run, todo, ckpts)
    backbone, loader = None, None
    for i, step in enumerate(todo):
        ckpt = ckpts[step]
        if backbone is None:
            m = ckpt["params"]["model"]
            backbone = load_backbone(m["backbone"], m["max_text_len"]).place(device)
            loader = _step_loader(
                parts, run.tasks, backbone, run.params, pixels, ckpt, run.frozen
            )
        key = _extract_key(ckpt["hash"], digests[step - 1], run.params.dtype, run.world)
        provenance = _provenance(ckpt, key, digests[step - 1], run.params)
        part = None if loader is None else loader.part(i)
        model = model_from_checkpoint(ckpt, backbone)
        extract_step(model, step, run, provenance, reuse[step], part)
        partial.seal(step_dir_name(step), run.names)


def _step_loader(
    parts: list[list[Sample]],
    tasks: Tasks,
    backbone: Backbone,
    params: pparams.ExtractParams,
    pixels: PixelCache | None,
    ckpt: dict,
    frozen: FrozenQueries | None,
) -> StepLoader | None:
    """One loader for every step's rows; None where no step loads an image
    (a model without prompts reading `pal frozen`'s queries)."""
    if frozen is not None and not ckpt["params"]["prompt"]["enabled"]:
        return None
    return StepLoader(parts, tasks.root, backbone, params, pixels)


def _device(params: pparams.ExtractParams, rank: int, world: int) -> torch.device:
    """`extract.device` resolved; under torchrun on CUDA, this rank's GPU."""
    device = resolve_device(params.device, "extract.device")
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    return device


def _checkpoints(tune_dir: Path, steps: Sequence[int], tasks: Tasks) -> dict:
    """step → its checkpoint, each checked against tasks.json and step 1's."""
    first = load_checkpoint(checkpoint_path(tune_dir, 1))
    ckpts = {}
    for step in steps:
        path = checkpoint_path(tune_dir, step)
        ckpts[step] = first if step == 1 else load_checkpoint(path)
        _check_checkpoint(path, ckpts[step], step, tasks, first)
    return ckpts


def _finish(
    partial: PartialRun,
    out: Path,
    steps: Sequence[int],
    ready: set[str],
    names: tuple[str, str],
    device: torch.device,
) -> None:
    """Move every step's shards from the partial folder into `out`."""
    done = [step for step in steps if step_dir_name(step) in ready]
    if done:
        log.info(
            "reused steps %s of an interrupted run with the same code, params and "
            "inputs (%s; `pal extract --fresh` discards them)",
            ",".join(map(str, done)),
            partial.path,
        )
    partial.finish([f"{step_dir_name(s)}/{n}" for s in steps for n in names])
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        log.info("extract: GPU memory peak %.1f GiB", peak)


def _settle(
    out: Path, steps: Sequence[int], world: int, n_tasks: int, ckpt: dict
) -> None:
    """Drop the part files of another layout from the steps written and the
    step folders of an earlier run with more tasks; record the contract."""
    for step in steps:
        _remove_stale(out / step_dir_name(step), world)
    for folder in out.glob("step_[0-9][0-9]*"):
        number = step_of_name(folder.name)
        if number is not None and number > n_tasks:
            shutil.rmtree(folder)
    write_stamp(out, "extract", prompt_method(ckpt["params"]["prompt"]))


def step_samples_digests(samples: list[Sample], tasks: Tasks) -> list[str]:
    """Per step k, sha256 of the samples its shards hold: task k's training
    samples and the test samples of tasks 1..k (each as sorted JSON)."""
    return [
        hash_samples(
            hashlib.sha256(),
            [
                *select(samples, "train", [k]),
                *select(samples, "test", range(1, k + 1)),
            ],
        ).hexdigest()
        for k in range(1, tasks.n_tasks + 1)
    ]


def _signatures(
    params: pparams.ExtractParams,
    digests: list[str],
    ckpts: dict[int, dict],
    world: int,
    rank: int,
    device: torch.device,
    frozen: FrozenQueries | None = None,
) -> list[str]:
    """What this rank's shards of each step depend on, cumulatively over the
    steps in order: extract's code, params, the step's samples and checkpoint,
    the backbone's files, the stored frozen queries, the part layout, the
    device type and the versions of torch and transformers. A sample changed
    in task k leaves the steps before k as they were (their shards hold none
    of task k's samples)."""
    backbone = next(iter(ckpts.values()))["params"]["model"]["backbone"]
    common = {
        **run_environment(__name__, backbone, device.type),
        "params": outcome_record(params),
        "parts": [world, rank],
        "frozen": None if frozen is None else frozen.sha256,
    }
    out, before = [], ""
    for k, c in ckpts.items():
        step = {"step": k, "samples": digests[k - 1], "checkpoint": c["hash"]}
        before = signature({**common, "before": before, **step})
        out.append(before)
    return out


def _check_checkpoint(
    path: Path, ckpt: dict, step: int, tasks: Tasks, first: dict
) -> None:
    if ckpt["step"] != step:
        raise CheckpointError(f"{path}: holds step {ckpt['step']}, expected {step}")
    if ckpt["tasks"] != tasks.record():
        raise CheckpointError(
            f"{path}: checkpoint from other data (its class order or "
            "task split differs from tasks.json); rerun `pal tune`"
        )
    diff = params_diff(ckpt["params"], first["params"])
    if diff is not None:
        raise CheckpointError(
            f"{path}: checkpoint from other params than "
            f"{checkpoint_path(path.parent, 1)} ({diff}); rerun "
            "`pal tune`"
        )


def _extract_key(ckpt_hash: str, samples_hash: str, dtype: str, world: int) -> str:
    text = json.dumps([KEY_VERSION, ckpt_hash, samples_hash, dtype, world])
    return hashlib.sha256(text.encode()).hexdigest()


def _shard_names(world: int, rank: int) -> tuple[str, str]:
    if world == 1:
        return "train.h5", "test.h5"
    return f"train-{rank:05d}.h5", f"test-{rank:05d}.h5"


def _remove_stale(folder: Path, world: int) -> None:
    """Drop files of another part layout, so readers see one layout only."""
    for split in ("train", "test"):
        if world > 1:
            (folder / f"{split}.h5").unlink(missing_ok=True)
        for part in folder.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9].h5"):
            if world == 1 or int(part.stem.split("-")[1]) >= world:
                part.unlink()


def _provenance(
    ckpt: dict, key: str, samples_hash: str, params: pparams.ExtractParams
) -> dict[str, str | int | float]:
    return {
        "backbone": ckpt["params"]["model"]["backbone"],
        "checkpoint_hash": ckpt["hash"],
        "extract_key": key,
        "feature": "prompted text CLS after the final LayerNorm",
        "params": json.dumps(ckpt["params"], sort_keys=True),
        "samples_sha256": samples_hash,
        "stored_dtype": params.dtype,
    }


@click.command("extract")
@run_params_option
@folder_option(
    "prepare", "data/prepare", "Folder written by `pal prepare`.", dest="prepare_dir"
)
@folder_option("tune", "data/tune", "Folder written by `pal tune`.", dest="tune_dir")
@folder_option(
    "out", "data/extract", "Folder for step_XX/{train,test}.h5.", dest="out_dir"
)
@click.option(
    "--steps",
    default=None,
    metavar="LIST",
    help="Only these steps, e.g. 2, 1,3 or 2-4 (default: all).",
)
@pixels_option
@click.option(
    "--fresh",
    is_flag=True,
    help="Discard the finished steps of an interrupted run (<out>.partial/) "
    "instead of reusing them.",
)
@frozen_option
@clean_errors
def cli(
    params_file: Source, prepare_dir: str, tune_dir: str, out_dir: str, **options: Any
) -> None:
    """Dump prompted joint embeddings into HDF5 feature shards.

    Step k's checkpoint embeds task k's training samples (step_XX/train.h5)
    and the test samples of tasks 1..k (step_XX/test.h5, with the BP head's
    logits over the classes seen). Finished steps wait in <out>.partial/
    until every step is done: an interrupted run (also under `dvc repro`)
    reuses them when its code, params and inputs are unchanged. Reads params
    section extract; under torchrun each rank writes its own part files. With
    --frozen, the frozen queries come from `pal frozen`'s file (the frozen
    variant's features are its q_t: no image is read).
    """
    params = load_section(params_file, "extract", pparams.ExtractParams)
    folders = (prepare_dir, tune_dir, out_dir)
    if params.processes > 1 and "WORLD_SIZE" not in os.environ:
        args = _rank_args(folders, options)
        sys.exit(launch(params.processes, [*params_file.args(), *args]))
    # data_root reads the file itself, which os.fspath names for a Source
    root = pparams.data_root(os.fspath(params_file))
    extract(*folders, params, data_root=root, **options)


def _rank_args(folders: tuple[str, str, str], options: dict[str, Any]) -> list[str]:
    """The folders and options given, as each rank's command line."""
    given = dict(zip(("--prepare", "--tune", "--out"), folders, strict=True))
    given["--steps"] = options["steps"]
    given["--frozen"] = options["frozen_dir"]
    given["--pixels"] = options["pixels"]
    args = [word for k, v in given.items() if v for word in (k, v)]
    return args + (["--fresh"] if options["fresh"] else [])


def launch(processes: int, args: list[str]) -> int:
    """Run `pal extract ARGS` as `processes` ranks under torch.distributed.run
    (on this machine); returns its exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={processes}", "-m", "pipeline", "extract", *args]
    log.info("extract: %d processes: %s", processes, " ".join(cmd))
    return subprocess.run(cmd, check=False).returncode
