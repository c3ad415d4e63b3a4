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

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np
import torch

from palcore.cliutil import clean_errors, folder_option, run_params_option
from palcore.errors import PalError
from palcore.params import Source, outcome_record
from pipeline import params as pparams
from pipeline.data.samples import Sample, Tasks, read_prepare, select
from pipeline.model.backbone import (
    Backbone,
    autocast,
    backbone_folder,
    load_backbone,
    resolve_device,
)
from pipeline.model.checkpoint import (
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    model_from_checkpoint,
    params_diff,
)
from pipeline.model.embed import embed_samples
from pipeline.model.network import PalModel
from pipeline.stages.resume import (
    PartialRun,
    code_digest,
    folder_digest,
    signature,
)
from solver.shards import (
    Block,
    ShardAttrs,
    open_step,
    step_dir_name,
    write_test,
    write_train,
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
    steps: Sequence[int] | str | None = None,
    fresh: bool = False,
    data_root: str | Path | None = None,
) -> list[Path]:
    """Write the shards of `steps` (default: all; a string as for `--steps`);
    returns the step folders. `data_root`: where the images are (`data.root`).

    Finished steps wait in `<out>.partial/` (`-rankNNNNN` under torchrun) until
    every step is done, then move into `out`; a rerun with the same code,
    params and inputs reuses them (`pipeline.stages.resume`), `fresh` discards them.
    """
    samples, tasks = read_prepare(prepare_dir, data_root)
    if steps is None or isinstance(steps, str):
        steps = parse_steps(steps, tasks.n_tasks)
    rank, world = rank_and_world()
    device = resolve_device(params.device, "extract.device")
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    tune_dir, out = Path(tune_dir), Path(out_dir)
    first = load_checkpoint(checkpoint_path(tune_dir, 1))
    ckpts = {}
    for step in steps:
        path = checkpoint_path(tune_dir, step)
        ckpts[step] = first if step == 1 else load_checkpoint(path)
        _check_checkpoint(path, ckpts[step], step, tasks, first)
    digests = step_samples_digests(samples, tasks)
    partial = PartialRun(
        out,
        _signatures(params, digests, ckpts, world, rank, device),
        fresh=fresh,
        suffix="" if world == 1 else f".rank{rank:05d}",
    )
    names = _shard_names(world, rank)
    ready = partial.reusable([step_dir_name(s) for s in steps], names)  # verified
    backbone: Backbone | None = None
    done: list[int] = []
    moved: list[str] = []
    for step in steps:
        ckpt = ckpts[step]
        folder = step_dir_name(step)
        moved += [f"{folder}/{n}" for n in names]
        if folder in ready:
            done.append(step)
            continue
        if backbone is None:
            m = ckpt["params"]["model"]
            backbone = load_backbone(m["backbone"], m["max_text_len"]).place(device)
        samples_hash = digests[step - 1]
        key = _extract_key(ckpt["hash"], samples_hash, params.dtype, world)
        _extract_step(
            model_from_checkpoint(ckpt, backbone),
            step,
            samples,
            tasks,
            params,
            partial.path / folder,
            names,
            _provenance(ckpt, key, samples_hash, params),
            rank,
            world,
            _reusable(ckpt, params, partial.path, step, names, world),
        )
        partial.seal(folder, names)
    if done:
        log.info(
            "reused steps %s of an interrupted run with the same code, params and "
            "inputs (%s; `pal extract --fresh` discards them)",
            ",".join(map(str, done)),
            partial.path,
        )
    partial.finish(moved)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        log.info("extract: GPU memory peak %.1f GiB", peak)
    if rank == 0:
        for step in steps:
            _remove_stale(out / step_dir_name(step), world)
        for folder in out.glob("step_[0-9][0-9]*"):  # an earlier run had more tasks
            if folder.name[5:].isdigit() and int(folder.name[5:]) > tasks.n_tasks:
                shutil.rmtree(folder)
    return [out / step_dir_name(step) for step in steps]


def step_samples_digests(samples: list[Sample], tasks: Tasks) -> list[str]:
    """Per step k, sha256 of the samples its shards hold: task k's training
    samples and the test samples of tasks 1..k (each as sorted JSON)."""
    out = []
    for k in range(1, tasks.n_tasks + 1):
        h = hashlib.sha256()
        for sample in [
            *select(samples, "train", [k]),
            *select(samples, "test", range(1, k + 1)),
        ]:
            h.update(json.dumps(dataclasses.asdict(sample), sort_keys=True).encode())
        out.append(h.hexdigest())
    return out


def _signatures(
    params: pparams.ExtractParams,
    digests: list[str],
    ckpts: dict[int, dict],
    world: int,
    rank: int,
    device: torch.device,
) -> list[str]:
    """What this rank's shards of each step depend on, cumulatively over the
    steps in order: extract's code, params, the step's samples and checkpoint,
    the backbone's files, the part layout, the device type and the versions
    of torch and transformers. A sample changed in task k leaves the steps
    before k as they were (their shards hold none of task k's samples)."""
    import transformers

    backbone = next(iter(ckpts.values()))["params"]["model"]["backbone"]
    common = {
        "code": code_digest(__name__),
        "params": outcome_record(params),
        "backbone": folder_digest(backbone_folder(backbone)),
        "parts": [world, rank],
        "device": device.type,
        "versions": [torch.__version__, transformers.__version__],
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


def _rank_range(n: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s rows [lo, hi) of n: whole batches of `batch_size`, so every
    row lands in the batch (and the patch-order seed) it has in a one-process
    run, and the parts hold the same bytes as one shard."""
    n_batches = -(-n // batch_size)
    lo = rank * n_batches // world * batch_size
    hi = min((rank + 1) * n_batches // world * batch_size, n)
    return lo, hi


def _reusable(
    ckpt: dict,
    params: pparams.ExtractParams,
    partial: Path,
    step: int,
    names: tuple[str, str],
    world: int,
) -> Path | None:
    """The previous step's folder when its test features can be reused: a
    model without prompts embeds a sample the same at every step (only its
    BP head grows), so only the new task's samples need the backbone. With
    one process and float32 shards, the stored features are the exact ones."""
    prev = partial / step_dir_name(step - 1)
    if (
        step == 1
        or ckpt["params"]["prompt"]["enabled"]
        or world != 1
        or params.dtype != "float32"
        or not all((prev / name).is_file() for name in names)
    ):
        return None
    return prev


def _extract_step(
    model: PalModel,
    step: int,
    samples: list[Sample],
    tasks: Tasks,
    params: pparams.ExtractParams,
    folder: Path,
    names: tuple[str, str],
    provenance: dict,
    rank: int,
    world: int,
    reuse: Path | None = None,
) -> None:
    """Embed and write one step's shards. Task `step`'s training samples, then
    the test samples of tasks 1..step, are embedded as one list in batches;
    this rank takes whole batches of it. With `reuse` (a model without
    prompts, one process), only task `step`'s test samples are embedded: the
    earlier tasks' test features come from that step folder."""
    train = select(samples, "train", [step])
    first = step if reuse is not None else 1
    blocks = [train] + [select(samples, "test", [t]) for t in range(first, step + 1)]
    every = [s for block in blocks for s in block]
    lo, hi = _rank_range(len(every), params.batch_size, rank, world)
    x, logits = embed_samples(
        model,
        every[lo:hi],
        tasks.root,
        params,
        f"step {step}",
        first_batch=lo // params.batch_size,
    )
    x = x.astype(params.dtype)
    parts, start = [], 0
    for i, block in enumerate(blocks):
        a = max(start, lo)
        b = max(a, min(start + len(block), hi))  # a == b: the ranges do not meet
        rows = slice(a - lo, b - lo)
        parts.append(_block(every[a:b], x[rows], logits[rows] if i else None))
        start += len(block)
    if reuse is not None:
        parts[1:1] = _reused_tests(model, reuse, step)
        log.info("step %d: reused the test features of tasks 1-%d from %s",
                 step, step - 1, reuse.name)  # fmt: skip
    _write_step(step, tasks, folder, names, provenance, parts, x.shape[1])


def _reused_tests(model: PalModel, prev: Path, step: int) -> list[Block]:
    """Tasks 1..step-1's test blocks of step folder `prev`: their features as
    stored, scored by this step's BP head."""
    old = open_step(prev, step - 1)
    device = model.backbone.device
    blocks = []
    for task in range(1, step):
        reader = old.test[task]
        feats, labels, missing, _ = reader.read_all()
        with torch.inference_mode(), autocast(device):
            head = model.head(torch.from_numpy(feats).to(device)).float()
        blocks.append(
            Block(
                features=feats,
                labels=labels,
                missing=missing,
                sample_ids=reader.sample_ids(),
                bp_logits=np.ascontiguousarray(head.cpu().numpy()),
            )
        )
    return blocks


def _block(part: list[Sample], x: np.ndarray, logits: np.ndarray | None) -> Block:
    return Block(
        features=np.ascontiguousarray(x),
        labels=np.array([s.label for s in part], dtype=np.int64),
        missing=np.array([s.missing for s in part], dtype=np.int8),
        sample_ids=[s.id for s in part],
        bp_logits=None if logits is None else np.ascontiguousarray(logits),
    )


def _write_step(
    step: int,
    tasks: Tasks,
    folder: Path,
    names: tuple[str, str],
    provenance: dict,
    parts: list[Block],
    feature_dim: int,
) -> None:
    classes_seen = sum(tasks.classes_per_task[:step])
    attrs = ShardAttrs(
        step=step,
        classes_seen=classes_seen,
        feature_dim=feature_dim,
        provenance=provenance,
    )
    write_train(folder / names[0], parts[0], attrs)
    write_test(folder / names[1], dict(enumerate(parts[1:], start=1)), attrs)
    log.info(
        "%s: %d train, %d test samples (classes seen %d)",
        folder,
        len(parts[0].labels),
        sum(len(p.labels) for p in parts[1:]),
        classes_seen,
    )


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
@click.option(
    "--fresh",
    is_flag=True,
    help="Discard the finished steps of an interrupted run (<out>.partial/) "
    "instead of reusing them.",
)
@clean_errors
def cli(
    params_file: Source,
    prepare_dir: str,
    tune_dir: str,
    out_dir: str,
    steps: str | None,
    fresh: bool,
) -> None:
    """Dump prompted joint embeddings into HDF5 feature shards.

    Step k's checkpoint embeds task k's training samples (step_XX/train.h5)
    and the test samples of tasks 1..k (step_XX/test.h5, with the BP head's
    logits over the classes seen). Finished steps wait in <out>.partial/
    until every step is done: an interrupted run (also under `dvc repro`)
    reuses them when its code, params and inputs are unchanged. Reads params
    section extract; under torchrun each rank writes its own part files.
    """
    params = pparams.load(params_file, "extract")
    if params.processes > 1 and "WORLD_SIZE" not in os.environ:
        args = [*params_file.args(), "--prepare", prepare_dir, "--tune", tune_dir]
        args += ["--out", out_dir, *(["--steps", steps] if steps else [])]
        sys.exit(launch(params.processes, [*args, *(["--fresh"] if fresh else [])]))
    root = pparams.data_root(params_file)
    extract(prepare_dir, tune_dir, out_dir, params, steps, fresh=fresh, data_root=root)


def launch(processes: int, args: list[str]) -> int:
    """Run `pal extract ARGS` as `processes` ranks under torch.distributed.run
    (on this machine); returns its exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={processes}", "-m", "pipeline", "extract", *args]
    log.info("extract: %d processes: %s", processes, " ".join(cmd))
    return subprocess.run(cmd, check=False).returncode
