"""`pal tune`: train the prompt pools and the BP head task by task (DESIGN §5).

For k = 1..K, `pipeline.model.train.train_task` trains task k's prompt slices and
head rows; then `step_XX.pt` is written atomically into `<out>.partial/` with
everything needed to rebuild step k's model. Once every task is done the
checkpoints move into `<out>`. A rerun with the same code, params and inputs
resumes after the last finished step with the same result as an
uninterrupted run, also under `dvc repro`, which deletes `<out>` first
(`pipeline.stages.resume`).

Reads params `model`, `prompt`, `tune` and the task split from tasks.json.
Writes `<out>/step_XX.pt` and `<out>/log.jsonl` (one line per task and epoch:
loss parts and train accuracy; same inputs, same bytes). Each epoch's seconds
go to `--timings` (default `logs/tune.jsonl`), outside what DVC tracks.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import click
import torch

from palcore.cliutil import clean_errors, file_option, folder_option, run_params_option
from palcore.outputs import write_bytes_atomic
from pipeline import params as pparams
from pipeline.contracts import check_stamp, prompt_method, write_stamp
from pipeline.data.pixel_cache import PixelCache, open_pixels
from pipeline.data.samples import (
    Sample,
    Tasks,
    read_prepare,
    select,
)
from pipeline.methods import build_model
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import (
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    params_record,
    restore,
    save_checkpoint,
)
from pipeline.model.device import resolve_device
from pipeline.model.encoder import Backbone
from pipeline.model.network import PalModel
from pipeline.model.queries import FrozenQueries, open_frozen
from pipeline.model.train import train_task
from pipeline.stages.options import frozen_option, pixels_option
from pipeline.stages.resume import (
    PartialRun,
    hash_samples,
    run_environment,
    signature,
)

log = logging.getLogger(__name__)

LOG_NAME = "log.jsonl"


def tune(
    prepare_dir: str | Path,
    out_dir: str | Path,
    model_p: pparams.ModelParams,
    prompt_p: pparams.PromptParams,
    tune_p: pparams.TuneParams,
    *,
    fresh: bool = False,
    timings: str | Path | None = None,
    data_root: str | Path | None = None,
    frozen_dir: str | Path | None = None,
    pixels: str | Path | None = None,
) -> list[Path]:
    """Run prompt tuning for all tasks; returns the checkpoint paths.
    `data_root`: where the images are (`data.root`; tasks.json does not say).
    `frozen_dir`: `pal frozen`'s folder, whose stored queries replace the
    frozen pass (None: the pass runs here). `pixels`: a folder written by
    `pal pixels`, read instead of decoding.

    Finished steps wait in `<out>.partial/` until every task is done, then
    move into `out` (see `pipeline.stages.resume`); `fresh` discards them. Per-epoch
    seconds are appended to `timings` (a JSON-lines file), never to `out`.
    """
    check_stamp("tune", prompt_method(prompt_p))
    samples, tasks = read_prepare(prepare_dir, data_root)
    cache = open_pixels(pixels)
    out = Path(out_dir)
    record = params_record(model_p, prompt_p, tune_p, tasks.n_tasks)
    device = resolve_device(tune_p.device, "tune.device")
    backbone = load_backbone(model_p.backbone, model_p.max_text_len).place(device)
    model = build_model(backbone, prompt_p, tasks.classes_per_task).to(device)
    frozen = open_frozen(
        frozen_dir, model_p.backbone, model_p.max_text_len, backbone.hidden_size
    )
    sources = _signatures(samples, tasks, record, backbone, device, frozen)
    partial = PartialRun(out, sources, fresh=fresh)
    done, entries = _reuse_finished(partial, model, tasks)
    for task in range(done + 1, tasks.n_tasks + 1):
        entries += _tune_task(
            model, task, samples, tasks, tune_p, timings, frozen, cache
        )
        path = checkpoint_path(partial.path, task)
        _write_log(partial.path, entries)  # first: a resume keeps entries ≤ its step
        digest = save_checkpoint(
            path, task, record, tasks.record(), model.tuned_state()
        )
        log.info("step %d done: %s (%s)", task, path.name, digest[:12])
    _finish(out, partial, tasks.n_tasks, prompt_method(prompt_p))
    log.info("wrote %s (%d steps)", out, tasks.n_tasks)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        log.info("tune: GPU memory peak %.1f GiB", peak)
    return [checkpoint_path(out, k) for k in range(1, tasks.n_tasks + 1)]


def _reuse_finished(
    partial: PartialRun, model: PalModel, tasks: Tasks
) -> tuple[int, list[dict[str, Any]]]:
    """The steps an interrupted run with the same inputs finished, loaded into
    `model`, and their epochs' log entries; steps after them are discarded."""
    for k in range(partial.kept + 1, tasks.n_tasks + 1):  # inputs changed
        checkpoint_path(partial.path, k).unlink(missing_ok=True)
    done = _resume(model, partial.path, tasks, partial.kept)
    entries = [e for e in _read_log(partial.path) if e.get("task", 0) <= done]
    if done:
        log.info(
            "reusing steps 1-%d of an interrupted run with the same code, params "
            "and inputs (%s; `pal tune --fresh` discards them)",
            done,
            partial.path,
        )
    return done, entries


def _tune_task(
    model: PalModel,
    task: int,
    samples: list[Sample],
    tasks: Tasks,
    tune_p: pparams.TuneParams,
    timings: str | Path | None,
    frozen: FrozenQueries | None = None,
    pixels: PixelCache | None = None,
) -> list[dict]:
    """Train task `task` (`train_task`); returns its log.jsonl entries, one
    per epoch, with the epoch's seconds moved to the `timings` file."""
    train = select(samples, "train", [task])
    epochs = train_task(model, task, train, tasks, tune_p, frozen, pixels)
    for entry in epochs:  # timings stay out of the DVC output
        clock = {k: entry.pop(k) for k in ("seconds", "data_wait")}
        if timings is not None:
            _append_timing(Path(timings), dict(entry, **clock))
    return epochs


def _finish(out: Path, partial: PartialRun, n_tasks: int, method: str | None) -> None:
    """Move the checkpoints and the log into `out`, dropping the checkpoints
    of an earlier run with more tasks, and record the contract they were made
    under (prompt method `method`'s)."""
    names = [checkpoint_path("", k).name for k in range(1, n_tasks + 1)]
    for stale in out.glob("step_*.pt"):
        if stale.name not in names:
            stale.unlink()
    partial.finish([*names, LOG_NAME])
    write_stamp(out, "tune", method)


def _signatures(
    samples: list[Sample],
    tasks: Tasks,
    record: dict,
    backbone: Backbone,
    device: torch.device,
    frozen: FrozenQueries | None = None,
) -> list[str]:
    """What checkpoint k depends on, per step: tune's code, params, the task
    split, the training samples of tasks 1..k, the backbone's files, the
    device type and the versions of torch and transformers. A sample changed
    in task k leaves the signatures of steps 1..k-1 as they were."""
    common = {
        **run_environment(__name__, backbone.name, device.type),
        "params": record,
        "split": [tasks.record(), tasks.data.get("images")],  # content, not place
        "frozen": None if frozen is None else frozen.sha256,
    }
    h = hashlib.sha256()
    out = []
    for task in range(1, tasks.n_tasks + 1):
        hash_samples(h, select(samples, "train", [task]))
        out.append(signature({**common, "samples": h.hexdigest()}))
    return out


def _resume(model: PalModel, folder: Path, tasks: Tasks, kept: int) -> int:
    """Load the last of the consecutive checkpoints 1..k in `folder`, k ≤
    `kept` (the steps whose signatures match), into `model`; returns k."""
    done = 0
    state: dict[str, torch.Tensor] | None = None
    for k in range(1, kept + 1):
        path = checkpoint_path(folder, k)
        if not path.exists():
            break
        try:
            ckpt = load_checkpoint(path, remedy="")
            if ckpt["step"] != k:
                raise CheckpointError(f"{path}: holds step {ckpt['step']}, not {k}")
        except CheckpointError as exc:  # verified by its hash: never reused damaged
            log.warning("%s; tuning again from step %d on", exc, k)
            for later in range(k, kept + 1):
                checkpoint_path(folder, later).unlink(missing_ok=True)
            break
        done, state = k, ckpt["state"]
    if done:
        assert state is not None, "a checkpoint's state is read with its step"
        restore(model, state, done)
    return done


def _read_log(out: Path) -> list[dict]:
    path = out / LOG_NAME
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a damaged log line is rewritten from the checkpoints' runs
    return entries


def _write_log(out: Path, entries: list[dict]) -> None:
    text = "".join(json.dumps(e) + "\n" for e in entries)
    write_bytes_atomic(out / LOG_NAME, text.encode())


def _append_timing(path: Path, entry: dict) -> None:
    """One JSON line per epoch; timings vary between identical runs, so they
    live outside the DVC-tracked output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


@click.command("tune")
@run_params_option
@folder_option(
    "prepare", "data/prepare", "Folder written by `pal prepare`.", dest="prepare_dir"
)
@folder_option(
    "out", "data/tune", "Folder for step_XX.pt and log.jsonl.", dest="out_dir"
)
@pixels_option
@click.option(
    "--fresh",
    is_flag=True,
    help="Discard the finished steps of an interrupted run (<out>.partial/) "
    "instead of resuming after them.",
)
@file_option(
    "timings",
    "logs/tune.jsonl",
    "JSON-lines file that gets each epoch's losses and seconds appended.",
)
@frozen_option
@clean_errors
def cli(
    params_file: str,
    prepare_dir: str,
    out_dir: str,
    fresh: bool,
    timings: str,
    frozen_dir: str | None,
    pixels: str | None,
) -> None:
    """Tune the prompt pools and the BP head, task by task.

    For each task k the new prompt slices and head rows are trained on task k's
    training samples (CE over its classes + tune.recon_weight × reconstruction
    loss); step_XX.pt holds everything needed to rebuild step k's model.
    Finished steps wait in <out>.partial/ until the last task is done: an
    interrupted run (also under `dvc repro`) resumes after its last finished
    step when its code, params and inputs are unchanged. Reads params sections
    model, prompt and tune. With --frozen, the frozen queries come from
    `pal frozen`'s file instead of a frozen pass over the images.
    """
    model_p = pparams.load(params_file, "model")
    prompt_p = pparams.load(params_file, "prompt")
    tune_p = pparams.load(params_file, "tune")
    root = pparams.data_root(params_file)
    tune(
        prepare_dir,
        out_dir,
        model_p,
        prompt_p,
        tune_p,
        fresh=fresh,
        timings=timings,
        data_root=root,
        frozen_dir=frozen_dir,
        pixels=pixels,
    )
