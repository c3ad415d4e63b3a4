"""PAL's BP model: frozen ViLT + prompt module + linear head (DESIGN §5).

Three kinds of pass share one embedding of a batch:

1. query pass — prompt-free, frozen: q_t = final-LN output at the text CLS,
   q_v = at the image CLS (cacheable per sample; see `QueryCache`);
2. reconstruction pass — over rows missing one modality (missing samples and,
   in training, the text-dropped / image-dropped copies of complete samples):
   only the present modality's prompts are on, driven by its frozen query; the
   missing modality's CLS output is the reconstructed query q̂;
3. classification pass — both prompts on, driven by (q_t, q_v) with q̂ in place
   of a missing modality's query ("reconstruct, then query"); the prompted
   text CLS after the final LN is the joint embedding and feeds the head.

Loss = CE over the current task's classes + λ · L_r, with
L_r = mean over complete samples of ‖q̂_t − q_t‖² + ‖q̂_v − q_v‖² (stop-grad
targets). With `prompt.enabled: false` the joint embedding is q_t and only the
head is trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.backbone import Backbone, autocast
from pipeline.params import ModelParams, PromptParams, TuneParams
from pipeline.prompts import Prompts, check_prompt_params
from solver.errors import PalError
from solver.outputs import step_dir_name, write_bytes_atomic
from solver.params import outcome_record

CHECKPOINT_FORMAT = 1


class CheckpointError(PalError):
    """A tune checkpoint is missing, unreadable, or from other params/data."""


class TaskHead(nn.Module):
    """Linear head grown per task: task t's classes get rows `W[t]` (n_t, D),
    `b[t]` (n_t,); earlier tasks' rows are frozen when a task is added.

    New rows start at zero. The CE over the current task's classes is blind to
    a vector added to all of that task's rows, so whatever such component the
    init draws stays untrained and becomes an arbitrary logit offset between
    tasks at test time (with random rows, earlier tasks' heads won most of the
    later tasks' samples on the demo). Zero rows fix that offset at zero; the
    task's rows still separate, as their targets differ.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.W = nn.ParameterList()
        self.b = nn.ParameterList()

    def add_task(self, n_classes: int) -> None:
        for p in self.parameters():
            p.requires_grad_(False)
        device = self.W[0].device if len(self.W) else torch.device("cpu")
        self.W.append(nn.Parameter(torch.zeros(n_classes, self.dim, device=device)))
        self.b.append(nn.Parameter(torch.zeros(n_classes, device=device)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, D) → logits (B, C_k) over the classes of tasks 1..k."""
        W = torch.cat(list(self.W))
        b = torch.cat(list(self.b))
        return F.linear(x.float(), W, b)


@dataclass
class Batch:
    """A collated batch; rows [0, n) are the samples, rows after them (training
    only) are copies of the complete samples: first text-dropped, then
    image-dropped, in the order of `complete`.

    input_ids, attention_mask: (R, T) int64; pixel_values: (R, 3, H, W) float32;
    pixel_mask: (R, H, W) int64; index: (n,) int64 position in the dataset;
    missing: (n,) int64 codes; labels: (n,) int64; complete: (c,) int64
    positions (in [0, n)) of the complete samples that have copies;
    ids: n sample ids.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pixel_values: torch.Tensor
    pixel_mask: torch.Tensor
    index: torch.Tensor
    missing: torch.Tensor
    labels: torch.Tensor
    complete: torch.Tensor
    ids: list[str]

    @property
    def n(self) -> int:
        return len(self.ids)

    def inputs_to(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(input_ids, attention_mask, pixel_values, pixel_mask) on `device`."""
        nb = device.type == "cuda"
        return tuple(
            t.to(device, non_blocking=nb)
            for t in (
                self.input_ids,
                self.attention_mask,
                self.pixel_values,
                self.pixel_mask,
            )
        )

    def pin_memory(self) -> Batch:
        """Page-locked copies of the tensors (DataLoader `pin_memory=True`)."""
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name).pin_memory()
                for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )


@dataclass
class QueryCache:
    """Frozen queries of a dataset's samples (the backbone never changes).

    q: (n, 2, D) float32 — [q_t, q_v] of each sample as given (dummies for a
    missing modality); copies: (n, 2, D) — for complete samples, [q_t of the
    image-dropped copy, q_v of the text-dropped copy] (zeros elsewhere).
    """

    q: torch.Tensor
    copies: torch.Tensor


class PalModel(nn.Module):
    """Frozen backbone + prompts (None when disabled) + per-task head.

    classes_per_task: number of classes of each task 1..K (task k owns labels
    [offset_k, offset_k + n_k)).
    """

    def __init__(
        self,
        backbone: Backbone,
        prompt: PromptParams,
        classes_per_task: Sequence[int],
    ):
        super().__init__()
        self.backbone = backbone
        self.prompt_params = prompt
        self.classes_per_task = list(classes_per_task)
        n_tasks, D = len(self.classes_per_task), backbone.hidden_size
        if prompt.enabled:
            self.prompts: Prompts | None = Prompts(
                prompt, n_tasks, D, backbone.num_layers
            )
        else:
            check_prompt_params(prompt, n_tasks, D, backbone.num_layers)
            self.prompts = None
        self.head = TaskHead(D)
        self.step = 0

    # ------------------------------------------------------------ structure

    def class_range(self, task: int) -> tuple[int, int]:
        """Labels [lo, hi) of `task` (1-based)."""
        lo = sum(self.classes_per_task[: task - 1])
        return lo, lo + self.classes_per_task[task - 1]

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task: new prompt slices and head rows; freeze the rest."""
        if self.step >= len(self.classes_per_task):
            raise ValueError("all tasks have been added")
        if self.prompts is not None:
            self.prompts.add_task(generator)
        self.head.add_task(self.classes_per_task[self.step])
        self.step += 1

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The current task's prompt slices and head rows (and a prompt vector)."""
        return [p for p in self.parameters() if p.requires_grad]

    def tuned_state(self) -> dict[str, torch.Tensor]:
        """Prompt and head tensors (everything but the frozen backbone), on CPU."""
        return {
            k: v.detach().cpu().contiguous()
            for k, v in self.state_dict().items()
            if not k.startswith("backbone.")
        }

    # ------------------------------------------------------------ passes

    def reconstruct(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        text_missing: torch.Tensor,
    ) -> torch.Tensor:
        """Reconstruction pass over R rows that each miss one modality.

        h (R, N, D), mask (R, N); q_t, q_v (R, D) frozen queries (the missing
        one is ignored); text_missing (R,) bool (False: image missing).
        Returns q̂ (R, D) float32: the text CLS output where text is missing,
        the image CLS output where the image is.
        """
        prompts = self.prompts(q_t, q_v, text_on=~text_missing, image_on=text_missing)
        out = self.backbone.encode(h, mask, prompts)
        return torch.where(text_missing[:, None], out[:, 0], out[:, text_len]).float()

    def joint(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
    ) -> torch.Tensor:
        """Classification pass: the prompted text CLS (B, D) float32."""
        on = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
        prompts = self.prompts(q_t, q_v, text_on=on, image_on=on)
        return self.backbone.encode(h, mask, prompts)[:, 0].float()

    def _fill_missing(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        missing: torch.Tensor,
        extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
        | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Reconstruct the missing queries of samples (and of `extra` rows).

        missing: (B,) int64 on the CPU. extra: (h_x, mask_x, q_t_x, q_v_x) of
        copy rows, first half text-dropped, second half image-dropped.
        Returns q_t, q_v with q̂ in place of missing queries, and q̂ of the
        extra rows (or None).
        """
        rows = torch.nonzero(missing != 0).flatten()
        n_rows, n_extra = len(rows), 0 if extra is None else extra[0].shape[0]
        if n_rows + n_extra == 0:
            return q_t, q_v, None
        dev = h.device
        text_missing = torch.cat(
            [missing[rows] == 1, torch.arange(n_extra) < n_extra // 2]
        ).to(dev)
        rows_d = rows.to(dev)
        parts = [(h[rows_d], mask[rows_d], q_t[rows_d], q_v[rows_d])]
        if extra is not None:
            parts.append(extra)
        h_r, mask_r, qt_r, qv_r = (torch.cat(x) for x in zip(*parts, strict=True))
        q_hat = self.reconstruct(h_r, mask_r, text_len, qt_r, qv_r, text_missing)
        if n_rows:
            code = missing[rows]
            t_rows, v_rows = rows[code == 1].to(dev), rows[code == 2].to(dev)
            t_src = torch.nonzero(code == 1).flatten().to(dev)
            v_src = torch.nonzero(code == 2).flatten().to(dev)
            q_t = q_t.index_put((t_rows,), q_hat[t_src])
            q_v = q_v.index_put((v_rows,), q_hat[v_src])
        return q_t, q_v, (q_hat[n_rows:] if n_extra else None)

    @torch.no_grad()
    def batch_queries(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen queries of all R rows of a batch: (q_t, q_v), each (R, D)."""
        ids, am, px, pm = batch.inputs_to(self.backbone.device)
        h, mask = self.backbone.embed(ids, am, px, pm)
        return self.backbone.queries(h, mask, ids.shape[1])

    def features(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Extraction: joint embeddings (n, D) float32 and head logits (n, C_k)."""
        ids, am, px, pm = batch.inputs_to(self.backbone.device)
        n, T = batch.n, ids.shape[1]
        h, mask = self.backbone.embed(ids[:n], am[:n], px[:n], pm[:n])
        q_t, q_v = self.backbone.queries(h, mask, T)
        if self.prompts is None:
            x = q_t
        else:
            q_t, q_v, _ = self._fill_missing(h, mask, T, q_t, q_v, batch.missing)
            x = self.joint(h, mask, q_t, q_v)
        return x, self.head(x)

    def loss(
        self, batch: Batch, cache: QueryCache, task: int, recon_weight: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training loss of one batch (with its copies) for `task`; λ =
        `recon_weight`.

        Returns the loss (scalar, with graph) and detached parts: ce, recon
        (0 without complete samples), correct (task-local argmax hits). No host
        synchronisation, so a GPU can run ahead.
        """
        dev = self.backbone.device
        n, c = batch.n, len(batch.complete)
        idx = batch.index.to(dev)
        q = cache.q[idx]  # (n, 2, D)
        q_t, q_v = q[:, 0], q[:, 1]
        lo, hi = self.class_range(task)
        labels = batch.labels.to(dev) - lo
        recon = torch.zeros((), device=dev)
        if self.prompts is None:
            x = q_t
        else:
            ids, am, px, pm = batch.inputs_to(dev)
            T = ids.shape[1]
            h, mask = self.backbone.embed(ids, am, px, pm)
            extra = None
            if c:
                comp = batch.complete.to(dev)
                qc = cache.copies[
                    idx[comp]
                ]  # (c, 2, D): [q_t img-dropped, q_v txt-dropped]
                zeros = torch.zeros_like(qc[:, 0])
                extra = (
                    h[n:],
                    mask[n:],
                    torch.cat([zeros, qc[:, 0]]),
                    torch.cat([qc[:, 1], zeros]),
                )
            q_t, q_v, q_hat = self._fill_missing(
                h[:n], mask[:n], T, q_t, q_v, batch.missing, extra
            )
            if c:
                target_t, target_v = q[comp, 0], q[comp, 1]
                recon = (
                    (q_hat[:c] - target_t).pow(2).sum(-1)
                    + (q_hat[c:] - target_v).pow(2).sum(-1)
                ).mean()
            x = self.joint(h[:n], mask[:n], q_t, q_v)
        logits = self.head(x)[:, lo:hi]
        ce = F.cross_entropy(logits, labels)
        loss = ce + recon_weight * recon
        parts = {
            "ce": ce.detach(),
            "recon": recon.detach(),
            "correct": (logits.argmax(-1) == labels).sum(),
            "complete": torch.full((), c, device=dev),
        }
        return loss, parts

    def static_inputs(
        self, batch: Batch, rows: int | None = None
    ) -> dict[str, torch.Tensor]:
        """The inputs of `static_loss` for a batch (without copies), on the
        device: h (rows, N, D) and mask (rows, N), the samples embedded with
        their text padded to `max_text_len`; index, missing, labels (rows,).
        With `rows`, the batch is padded to `rows` rows by repeating its first
        sample with label −1. Call under `autocast`."""
        dev = self.backbone.device
        n = batch.n
        rows = rows or n
        ids, am, px, pm = (t[:n] for t in batch.inputs_to(dev))
        index, missing, labels = (
            t.to(dev) for t in (batch.index, batch.missing, batch.labels)
        )
        if rows > n:  # repeat the first sample; its copies get label −1
            sel = torch.cat([torch.arange(n), torch.zeros(rows - n, dtype=torch.int64)])
            sel = sel.to(dev)
            ids, am, px, pm, index, missing, labels = (
                t[sel] for t in (ids, am, px, pm, index, missing, labels)
            )
            labels[n:] = -1
        pad = self.backbone.max_text_len - ids.shape[1]
        ids, am = F.pad(ids, (0, pad)), F.pad(am, (0, pad))
        with torch.no_grad():
            h, mask = self.backbone.embed(ids, am, px, pm)
        return {
            "h": h,
            "mask": mask,
            "index": index,
            "missing": missing,
            "labels": labels,
        }


@dataclass
class DummySegments:
    """The embedded dummy inputs, for building reconstruction copies on the device.

    text (T, D) and text_mask (T,) bool: the empty string's token embeddings;
    image (1 + P, D): the all-white image's CLS and patch embeddings.
    """

    text: torch.Tensor
    text_mask: torch.Tensor
    image: torch.Tensor


@torch.no_grad()
def dummy_segments(
    backbone: Backbone,
    empty_ids: torch.Tensor,
    empty_mask: torch.Tensor,
    dummy_image: torch.Tensor,
) -> DummySegments:
    """Embed the dummy text (empty_ids, empty_mask: (T,) int64) and the dummy
    image ((3, S, S) float) once; no RNG is consumed."""
    dev = backbone.device
    ids, am = empty_ids[None].to(dev), empty_mask[None].to(dev)
    with autocast(dev):
        h, mask = backbone.embed_full(ids, am, dummy_image[None].to(dev))
    T = ids.shape[1]
    return DummySegments(h[0, :T], mask[0, :T], h[0, T:])


def _splice_copies(
    h: torch.Tensor,
    mask: torch.Tensor,
    T: int,
    complete: torch.Tensor,
    dummy: DummySegments,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Text-dropped and image-dropped versions of rows (B, N, D), built on the
    device: where `complete` (B,) bool, the text (image) segment is replaced by
    the dummy's, padded with masked tokens to the batch's image length; other
    rows are returned unchanged. Returns h_a, mask_a (text dropped), h_b,
    mask_b (image dropped)."""
    B, N, D = h.shape
    n_img = N - T
    if dummy.image.shape[0] > n_img:
        raise ValueError(
            f"batch image tokens ({n_img}) fewer than the dummy image's "
            f"({dummy.image.shape[0]})"
        )
    pad = n_img - dummy.image.shape[0]
    img = F.pad(dummy.image.to(h.dtype), (0, 0, 0, pad))  # (N - T, D)
    img_mask = torch.arange(n_img, device=h.device) < dummy.image.shape[0]
    c = complete[:, None]
    h_a = torch.cat(
        [torch.where(c[..., None], dummy.text.to(h.dtype), h[:, :T]), h[:, T:]], 1
    )
    mask_a = torch.cat([torch.where(c, dummy.text_mask, mask[:, :T]), mask[:, T:]], 1)
    h_b = torch.cat([h[:, :T], torch.where(c[..., None], img, h[:, T:])], 1)
    mask_b = torch.cat([mask[:, :T], torch.where(c, img_mask, mask[:, T:])], 1)
    return h_a, mask_a, h_b, mask_b


def static_loss(
    model: PalModel,
    inputs: Mapping[str, torch.Tensor],
    cache: QueryCache,
    dummy: DummySegments | None,
    task: int,
    recon_weight: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`PalModel.loss` with shapes that depend only on the input shapes.

    The same loss, for a CUDA-graph capture: instead of selecting rows on the
    host, every row gets a text-missing slot and an image-missing slot in one
    reconstruction pass of 2B rows (a complete row's copies are spliced from
    `dummy`; a row missing a modality fills its own slot; unused slots get no
    gradient), and masks stand in for counts.

    inputs (from `PalModel.static_inputs`): h (B, N, D), mask (B, N):
    embedded samples, text length T = `model.backbone.max_text_len`; index,
    missing, labels (B,) int64 on the device, label −1 marking a padding row.
    `dummy` None: no copies (no reconstruction loss). Returns the loss and
    detached parts: ce, recon, correct, complete (count of complete samples).
    """
    h, mask, index = inputs["h"], inputs["mask"], inputs["index"]
    missing, labels = inputs["missing"], inputs["labels"]
    T = model.backbone.max_text_len
    q = cache.q[index]  # (B, 2, D)
    q_t, q_v = q[:, 0], q[:, 1]
    lo, hi = model.class_range(task)
    valid = labels >= 0
    target = torch.where(valid, labels - lo, -100)
    complete = (missing == 0) & valid
    if dummy is None:
        complete = torch.zeros_like(complete)
        h_a, mask_a, h_b, mask_b = h, mask, h, mask
    else:
        h_a, mask_a, h_b, mask_b = _splice_copies(h, mask, T, complete, dummy)
    qc = cache.copies[index]  # [q_t of the image-dropped, q_v of the text-dropped]
    cm = complete[:, None]
    zeros = torch.zeros_like(q_t)
    q_hat = model.reconstruct(
        torch.cat([h_a, h_b]),
        torch.cat([mask_a, mask_b]),
        T,
        torch.cat([zeros, torch.where(cm, qc[:, 0], q_t)]),
        torch.cat([torch.where(cm, qc[:, 1], q_v), zeros]),
        torch.arange(2 * len(h), device=h.device) < len(h),
    )
    B = len(h)
    qt_hat, qv_hat = q_hat[:B], q_hat[B:]
    err = (qt_hat - q_t).pow(2).sum(-1) + (qv_hat - q_v).pow(2).sum(-1)
    n_complete = complete.sum()
    recon = (err * complete).sum() / n_complete.clamp_min(1)
    q_t = torch.where((missing == 1)[:, None], qt_hat, q_t)
    q_v = torch.where((missing == 2)[:, None], qv_hat, q_v)
    logits = model.head(model.joint(h, mask, q_t, q_v))[:, lo:hi]
    ce = F.cross_entropy(logits, target, ignore_index=-100)
    loss = ce + recon_weight * recon
    parts = {
        "ce": ce.detach(),
        "recon": recon.detach(),
        "correct": ((logits.argmax(-1) == target) & valid).sum(),
        "complete": n_complete,
    }
    return loss, parts


def build_cache(model: PalModel, batches, n: int, progress=None) -> QueryCache:
    """Frozen queries of a dataset from its batches (with copies)."""
    D = model.backbone.hidden_size
    dev = model.backbone.device
    q = torch.zeros(n, 2, D, device=dev)
    copies = torch.zeros(n, 2, D, device=dev)
    for batch in batches:
        check_batch(batch)
        q_t, q_v = model.batch_queries(batch)
        m, c = batch.n, len(batch.complete)
        idx = batch.index.to(dev)
        q[idx, 0], q[idx, 1] = q_t[:m], q_v[:m]
        if c:
            comp = idx[batch.complete.to(dev)]
            copies[comp, 1] = q_v[m : m + c]  # text-dropped copy: its image CLS
            copies[comp, 0] = q_t[m + c :]  # image-dropped copy: its text CLS
        if progress is not None:
            progress.update(m)
    return QueryCache(q, copies)


def check_batch(batch: Any) -> None:
    """Raise the error a loader worker recorded (unreadable image, …)."""
    if isinstance(batch, str):
        raise PalError(batch)


# ---------------------------------------------------------------- checkpoints


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read and verify a checkpoint (format, step, content hash)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: tune checkpoint missing (run `pal tune`)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
        raise CheckpointError(
            f"{path}: not a readable tune checkpoint ({reason or type(exc).__name__})"
        ) from None
    keys = {"format_version", "step", "params", "tasks", "state", "hash"}
    if not isinstance(ckpt, dict) or not keys <= set(ckpt):
        raise CheckpointError(f"{path}: not a tune checkpoint (keys missing)")
    if ckpt["format_version"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {ckpt['format_version']}, "
            f"expected {CHECKPOINT_FORMAT}"
        )
    meta = {k: ckpt[k] for k in ("format_version", "step", "params", "tasks")}
    if state_hash(meta, ckpt["state"]) != ckpt["hash"]:
        raise CheckpointError(f"{path}: content does not match its hash (damaged)")
    return ckpt


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


def model_from_checkpoint(ckpt: Mapping[str, Any], backbone: Backbone) -> PalModel:
    """Rebuild step k's model from its checkpoint on `backbone`."""
    prompt = PromptParams(
        **{
            **ckpt["params"]["prompt"],
            "layers": tuple(ckpt["params"]["prompt"]["layers"]),
        }
    )
    model = PalModel(backbone, prompt, ckpt["tasks"]["classes_per_task"])
    g = torch.Generator().manual_seed(0)
    for _ in range(int(ckpt["step"])):
        model.add_task(g)
    model.to(backbone.device)
    missing, unexpected = model.load_state_dict(ckpt["state"], strict=False)
    missing = [k for k in missing if not k.startswith("backbone.")]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint of step {ckpt['step']} does not fit the model "
            f"(missing {missing[:2]}, unexpected {unexpected[:2]})"
        )
    model.eval()
    return model
