"""The image path of one tree of the project, on photo batches: the tree
whose `pipeline` imports first (PYTHONPATH's, else this repository).
palbench/gpu_check.py runs it once on an older tree (`--baseline`) and once on
this one, on the same photos and the same random ViLT (`--workdir`), and
compares the two (before and after).

    PYTHONPATH=. python3 -m palbench.image_path --config vilt-b32 --device cuda
    .venv/bin/python -m palbench.image_path --config tiny --device cpu   # smoke
    PYTHONPATH=/tmp/older python3 -m palbench.image_path --out before.json \
        --features before.pt --workdir /tmp/ip   # an older tree's

Photos: JPEGs of the photo mix's Food101 shapes (pipeline/fakes/trees.py; at
ViLT-B/32's processor 12×16, 16×12, 12×12 and 12×18 patches), 35 % text and
35 % image missing, through `SampleDataset` and `Collate` as `pal tune` and
`pal extract` load them; the batches are collated before timing (the loader
is timed apart, per image on one core). Per path it prints and returns:

- tune: samples/s of the training step at batch 4 (`make_step` as `pal tune`
  runs it: static and graphed on CUDA, eager on the CPU), host syncs per step;
- extract: samples/s of `model.features` at `--batch` (256 on CUDA), host
  syncs per batch; the FLOPs of each (torch.utils.flop_counter) and their
  share of the card's dense bf16 peak where the card is known;
- bytes per extract batch as the loader ships it; the loader's ms per image;
- the features of one extract batch (`--features`: saved for comparing
  two trees; gpu_check gives the cosine of after against before).

Host syncs: on CUDA the warnings of `torch.cuda.set_sync_debug_mode("warn")`;
on the CPU the ops that would sync on a GPU (`pipeline.model.vision.SYNC_OPS`,
counted with a TorchDispatchMode; host-side tensors count there too).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from palcore.codes import Missing  # noqa: E402
from pipeline.data.loader import Collate, SampleDataset  # noqa: E402
from pipeline.data.samples import Sample  # noqa: E402
from pipeline.fakes import trees as fakes  # noqa: E402
from pipeline.model import vision  # noqa: E402
from pipeline.model.backbone import load_backbone  # noqa: E402
from pipeline.model.device import autocast  # noqa: E402
from pipeline.model.graphs import capturable_adamw, set_lr  # noqa: E402
from pipeline.model.losses import dummy_segments  # noqa: E402
from pipeline.model.network import QueryCache  # noqa: E402
from pipeline.model.train import make_step  # noqa: E402

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense TF/s
FOOD101_SHAPES = fakes.SIZES[:4]  # (w, h) of the photo mix's Food101 photos
N_TASKS = 10


class SyncOps(TorchDispatchMode):
    """Counts the ops in `vision.SYNC_OPS` (CPU stand-in for a sync count)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name.replace("::", ".") in vision.SYNC_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_syncs(fn, device: torch.device) -> int:
    """Host syncs of one call of `fn` (see the module docstring)."""
    if device.type != "cuda":
        with SyncOps() as ops:
            fn()
        return ops.count
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def flops(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def timed(fn, device: torch.device, warmup: int, seconds: float) -> float:
    """Seconds per call after `warmup` calls, over at least `seconds`."""
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if calls % 5 == 0:
            sync()
            if time.perf_counter() - t0 >= seconds:
                return (time.perf_counter() - t0) / calls


def photo_samples(folder: Path, n: int) -> list[Sample]:
    """n samples of Food101-shaped JPEGs in `folder`, 35 % text and 35 % image
    missing (a seeded draw), 10 classes per task over N_TASKS tasks."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        name = f"p{i}.jpg"
        if not (folder / name).exists():
            shape = FOOD101_SHAPES[i % len(FOOD101_SHAPES)]
            # its own generator: the draws below are the same whether or not
            # the photos were made by an earlier call
            photo_rng = np.random.default_rng([0, i])
            fakes.photo(shape, photo_rng).save(folder / name, quality=90)
        r = rng.random()
        code = Missing.TEXT if r < 0.35 else Missing.IMAGE if r < 0.7 else 0
        text = " ".join(rng.choice(fakes.TITLE_WORDS, 12))
        label = int(rng.integers(10 * (N_TASKS - 1), 10 * N_TASKS))  # the last task
        samples.append(Sample(f"s{i}", "train", 1, label, "c", name, text, code))
    return samples


def photo_dataset(backbone, root: Path, samples: list[Sample]) -> SampleDataset:
    """The photos' dataset as `pal tune` and `pal extract` load it (uint8
    images, normalised on the device)."""
    return SampleDataset(
        samples,
        root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=True,
    )


def batch_bytes(batch) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in (batch.pixel_values, batch.pixel_mask, batch.image_sizes)
        if t is not None
    )


def build(config: str, device: torch.device, work: Path):
    """A random ViLT in the hub layout (ViLT-B/32's sizes or tiny), its
    PalModel with the paper's prompts at the last of N_TASKS steps."""
    folder = work / f"vilt-{config}"
    if not folder.exists():
        fakes.make_hub_vilt(folder, full_size=config == "vilt-b32")
    from palbench.extract import last_step_model  # palbench/extract.py

    backbone = load_backbone(str(folder), 40).place(device)
    return backbone, last_step_model(backbone, config, device)


def tune_part(model, ds, n: int, device: torch.device, seconds: float) -> dict:
    """samples/s, syncs and FLOPs of `pal tune`'s step at batch 4."""
    cuda = device.type == "cuda"
    backbone, D = model.backbone, model.backbone.hidden_size
    train = batches_with(ds, 4, 12, cuda, copies=not cuda)
    cache = QueryCache(
        torch.randn(n, 2, D, device=device), torch.randn(n, 2, D, device=device)
    )
    groups = [{"params": model.trainable_parameters(), "lr": 1e-4}]
    opt_args = {"betas": (0.9, 0.98), "weight_decay": 0.0}
    if cuda:
        opt = capturable_adamw(groups, device, **opt_args)
        dummy = dummy_segments(backbone, ds.empty_ids, ds.empty_mask, ds.dummy_image())
    else:
        opt, dummy = torch.optim.AdamW(groups, **opt_args), None
    run = make_step(
        model, opt, cache, N_TASKS, 0.01, static=cuda, dummy=dummy, graphs=cuda
    )
    state = {"i": 0}

    def step() -> None:
        set_lr(opt, [1e-4])
        run(train[state["i"] % len(train)])
        state["i"] += 1

    model.train()
    per_step = timed(step, device, len(train), seconds)
    syncs = count_syncs(step, device)
    eager = make_step(
        model,
        torch.optim.AdamW(groups, **opt_args),
        cache,
        N_TASKS,
        0.01,
        static=cuda,
        dummy=dummy,
        graphs=False,
    )
    f = flops(lambda: eager(train[0]))
    return {
        "samples_per_s": round(4 / per_step, 1),
        "syncs_per_step": syncs,
        "flops_per_sample": f / 4,
    }


def extract_part(model, ds, size: int, device: torch.device, seconds: float):
    """samples/s, syncs and FLOPs of `pal extract`'s forward at `size`, and
    the features of the first batch."""
    ex = batches_with(ds, size, 3, device.type == "cuda", copies=False)
    state = {"i": 0}

    def forward(batch):
        with torch.inference_mode(), autocast(device):
            return model.features(batch)[0].float().cpu()

    def step() -> None:
        forward(ex[state["i"] % len(ex)])
        state["i"] += 1

    model.eval()
    per_batch = timed(step, device, len(ex), seconds)
    torch.manual_seed(0)
    first = forward(ex[0])
    return {
        "samples_per_s": round(size / per_batch, 1),
        "syncs_per_batch": count_syncs(step, device),
        "flops_per_sample": flops(step) / size,
        "bytes_per_batch": batch_bytes(ex[0]),
    }, first


def batches_with(ds, size, count, cuda, copies):
    collate = Collate(ds, copies=copies)
    out = []
    for b in range(count):
        idx = [(b * size + j) % len(ds) for j in range(size)]
        batch = collate([ds[i] for i in idx])
        out.append(batch.pin_memory() if cuda else batch)
    return out


def measure(
    config: str,
    device: torch.device,
    work: Path,
    photos: int,
    batch: int,
    seconds: float,
) -> tuple[dict[str, Any], torch.Tensor]:
    """This tree's image path on the photos and model in `work` (made there
    when absent), and the features of the first extract batch."""
    import pipeline

    torch.manual_seed(0)  # the prompts' init: the same in every tree's process
    backbone, model = build(config, device, work)
    backbone.fast_embed = True  # as on CUDA (place()), so the CPU shows its rule
    root = work / "photos"
    root.mkdir(exist_ok=True)
    samples = photo_samples(root, photos)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = next((v for k, v in PEAK_BF16.items() if card and k in card), None)
    ds = photo_dataset(backbone, root, samples)
    t0 = time.perf_counter()
    for i in range(min(32, len(ds))):
        ds[i]
    per_image_ms = 1e3 * (time.perf_counter() - t0) / min(32, len(ds))
    tune = tune_part(model, ds, len(samples), device, seconds)
    ext, features = extract_part(model, ds, batch, device, seconds)
    for part in (tune, ext):
        achieved = part["samples_per_s"] * part["flops_per_sample"]
        part["bf16_peak_share"] = round(achieved / peak, 4) if peak else None
    tree = str(Path(pipeline.__file__).resolve().parents[1])
    print(
        f"image_path {tree}: tune {tune['samples_per_s']}/s, "
        f"{tune['syncs_per_step']} syncs a step; extract "
        f"{ext['samples_per_s']}/s, {ext['syncs_per_batch']} syncs a batch, "
        f"{ext['bytes_per_batch'] / 2**20:.1f} MiB",
        flush=True,
    )
    return {
        "tree": tree,
        "config": config,
        "card": card,
        "batch": batch,
        "photos": photos,
        "tune": tune,
        "extract": ext,
        "loader_ms_per_image": round(per_image_ms, 2),
    }, features


def markdown(result: dict[str, Any]) -> list[str]:
    """The table of each tree measured (palbench/gpu_paths.py's result), as
    Markdown lines."""
    cos = result.get("feature_cosine_min")
    against = (
        ""
        if cos is None
        else (f"; features of one extract batch, after against before: cosine ≥ {cos}")
    )
    lines = [
        f"{result['config']} sizes, {result['photos']} Food101-shaped photos, "
        f"extract batch {result['batch']}{against}.",
        "",
        "| path | tune samples/s | bf16 peak | syncs/step | extract samples/s "
        "| bf16 peak | syncs/batch | MiB/batch | loader ms/image |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def pct(v):
        return "–" if v is None else f"{100 * v:.1f} %"

    for path, p in result["paths"].items():
        t, e = p["tune"], p["extract"]
        lines.append(
            f"| {path} | {t['samples_per_s']} | {pct(t['bf16_peak_share'])} "
            f"| {t['syncs_per_step']} | {e['samples_per_s']} "
            f"| {pct(e['bf16_peak_share'])} | {e['syncs_per_batch']} "
            f"| {e['bytes_per_batch'] / 2**20:.1f} | {p['loader_ms_per_image']} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("tiny", "vilt-b32"), default="tiny")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--photos",
        type=int,
        default=None,
        help="distinct photos (default: 512 on CUDA, 24 on CPU)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="extract batch (default: 256 on CUDA, 16 on CPU)",
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="time per rate")
    ap.add_argument("--out", type=Path, help="also write the result as JSON here")
    ap.add_argument("--features", type=Path, help="save the features here (torch)")
    ap.add_argument(
        "--workdir", type=Path, help="photos and model, kept (default: a temp one)"
    )
    a = ap.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory(prefix="pal-image-path-") as tmp:
        work = a.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        photos, batch = (
            a.photos or (512 if cuda else 24),
            a.batch or (256 if cuda else 16),
        )
        result, features = measure(a.config, device, work, photos, batch, a.seconds)
    print("\n".join(markdown({**result, "paths": {"this tree": result}})))
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    if a.features:
        torch.save(features, a.features)


if __name__ == "__main__":
    main()
