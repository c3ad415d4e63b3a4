"""Tune checkpoints: `data/tune/step_XX.pt`, written by `pal tune`, read by
`pal extract` (and by `pal tune` when it resumes).

A checkpoint holds everything needed to rebuild step k's model on the frozen
backbone: the params record (`params_record`: the outcome keys of `model`,
`prompt`, `tune`), the task split, and the tuned state (prompt slices and
head rows), with a sha256 over all of it (`state_hash`) that `load_checkpoint`
verifies. `restore` is the one way a model gets a checkpoint's state.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from palcore.errors import PalError
from palcore.outputs import step_dir_name, write_bytes_atomic
from palcore.params import outcome_record
from pipeline.model.network import PalModel
from pipeline.params import ModelParams, PromptParams, TuneParams

CHECKPOINT_FORMAT = 1


class CheckpointError(PalError):
    """A tune checkpoint is missing, unreadable, or from other params/data."""


def checkpoint_path(tune_dir: str | Path, step: int) -> Path:
    """`<tune_dir>/step_XX.pt`."""
    return Path(tune_dir) / f"{step_dir_name(step)}.pt"


def params_record(
    model: ModelParams, prompt: PromptParams, tune: TuneParams, n_tasks: int
) -> dict[str, Any]:
    """The params a tune checkpoint depends on, as plain JSON-able data: the
    `outcome_keys` of each section (run-only keys such as `tune.num_workers`
    change speed, not results)."""
    return {
        "model": outcome_record(model),
        "prompt": outcome_record(prompt),
        "tune": outcome_record(tune),
        "data": {"tasks": n_tasks},
    }


def state_hash(meta: Mapping[str, Any], state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the metadata JSON and every tensor (name, dtype, shape, bytes)."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_checkpoint(
    path: Path,
    step: int,
    params: Mapping[str, Any],
    tasks: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
) -> str:
    """Write step_XX.pt atomically; returns its content hash.

    tasks: {"class_order": [...], "classes_per_task": [...]} from tasks.json.
    """
    meta = {
        "format_version": CHECKPOINT_FORMAT,
        "step": step,
        "params": params,
        "tasks": tasks,
    }
    digest = state_hash(meta, state)
    buf = io.BytesIO()
    torch.save({**meta, "state": dict(state), "hash": digest}, buf)
    write_bytes_atomic(path, buf.getvalue())
    return digest


def load_checkpoint(path: Path, remedy: str = "; rerun `pal tune`") -> dict[str, Any]:
    """Read and verify a checkpoint (format, step, content hash); a damaged
    one's message ends with `remedy`, the command that makes it again."""
    if not path.is_file():
        raise CheckpointError(f"{path}: tune checkpoint missing (run `pal tune`)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise CheckpointError(
            f"{path}: not a readable tune checkpoint ({load_reason(exc)}){remedy}"
        ) from None
    keys = {"format_version", "step", "params", "tasks", "state", "hash"}
    if not isinstance(ckpt, dict) or not keys <= set(ckpt):
        raise CheckpointError(f"{path}: not a tune checkpoint (keys missing){remedy}")
    if ckpt["format_version"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {ckpt['format_version']}, "
            f"expected {CHECKPOINT_FORMAT}{remedy}"
        )
    meta = {k: ckpt[k] for k in ("format_version", "step", "params", "tasks")}
    if state_hash(meta, ckpt["state"]) != ckpt["hash"]:
        raise CheckpointError(
            f"{path}: content does not match its hash (damaged){remedy}"
        )
    return ckpt


def load_reason(exc: BaseException) -> str:
    """The line of a `torch.load` error that says why: for a refused pickle
    the unpickler's line (its first lines only say that loading failed),
    else the first line, whole; the exception's type when it says nothing."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("WeightsUnpickler error:"):
            return line.split(". ")[0]  # the refusal, not how to allow the global
    return lines[0] if lines else type(exc).__name__


def params_diff(
    a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = ""
) -> str | None:
    """The first differing key of two nested params records, as 'key: a vs b'."""
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        name = f"{prefix}{key}"
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            found = params_diff(va, vb, name + ".")
            if found:
                return found
        elif _norm(va) != _norm(vb):
            return f"{name}: {va!r} vs {vb!r}"
    return None


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, (list, tuple)) else v


def restore(model: PalModel, state: Mapping[str, torch.Tensor], step: int) -> None:
    """Give a fresh `model` the structure of step `step` (its tasks added) and
    load a checkpoint's `state` into it; every tuned tensor must fit."""
    generator = torch.Generator().manual_seed(0)  # values replaced below
    for _ in range(step):
        model.add_task(generator)
    model.to(model.backbone.device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("backbone.")]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint of step {step} does not fit the model "
            f"(missing {missing[:2]}, unexpected {unexpected[:2]})"
        )
