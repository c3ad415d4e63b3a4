"""Throughput of the prompted ViLT forward: a training step and extraction.

    PYTHONPATH=. python -m palbench.extract                        # demo model, CPU
    PYTHONPATH=. python -m palbench.extract --device cuda --config vilt-b32

`--config demo` loads the demo backbone (data/demo/vilt, or `--backbone`) or,
when absent, a random model of the demo's sizes; `--config vilt-b32` builds a
random `ViltConfig` with ViLT-B/32's sizes (768 wide, 12 layers, 384-px
images → 144 patches + 40 text tokens). Prompts as in the paper: pools of 128,
length 8, layers 0–7 (demo: the params.yaml defaults), 10 tasks, the last
step's components all active. Batches are synthetic tensors with the 70 %
"both" missing protocol (35 % text, 35 % image missing), already collated:
image decoding is the DataLoader workers' job and is not timed.

Prints samples/s of
- train: one optimiser step at `--train-batch` samples (4) plus the two
  reconstruction copies of each complete sample, queries from a cache, as in
  `pal tune` (forward, backward, AdamW);
- extract: `model.features` at `--batch` samples under inference_mode, as in
  `pal extract` (query pass, reconstruction pass, classification pass).
On CUDA both run in bf16 autocast with bf16 frozen weights (float32
LayerNorms) and fused attention. Timing starts after every batch shape
has run once (warm-up), as in a long `pal tune`/`pal extract` run.
`--compile` wraps each encoder layer in torch.compile (experimental).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch  # noqa: E402

from pipeline import methods  # noqa: E402
from pipeline.data.images import dummy_image  # noqa: E402
from pipeline.data.loader import SampleDataset  # noqa: E402
from pipeline.data.samples import Batch  # noqa: E402
from pipeline.model.backbone import load_backbone  # noqa: E402
from pipeline.model.device import autocast  # noqa: E402
from pipeline.model.encoder import Backbone  # noqa: E402
from pipeline.model.graphs import capturable_adamw, set_lr  # noqa: E402
from pipeline.model.losses import dummy_segments  # noqa: E402
from pipeline.model.network import PalModel, QueryCache  # noqa: E402
from pipeline.model.train import make_step  # noqa: E402
from pipeline.params import PromptParams  # noqa: E402

N_TASKS = 10


def build_backbone(config: str, backbone: str | None) -> Backbone:
    from transformers import ViltConfig, ViltModel

    if config == "demo":
        folder = backbone or "data/demo/vilt"
        if Path(folder).is_dir():
            return load_backbone(folder, 40)
        cfg = ViltConfig(
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=256,
            image_size=64,
            patch_size=8,
        )
    else:
        cfg = ViltConfig(max_image_length=-1)  # ViLT-B/32: 768 × 12, 384 px, 32 px
    torch.manual_seed(0)
    return Backbone(ViltModel(cfg), None, f"random {config}", 40)


def synthetic_batch(
    n: int, backbone: Backbone, copies: bool, seed: int, max_words: int
) -> Batch:
    """n collated samples (35 % text, 35 % image missing) and, optionally, the
    copies of the complete ones."""
    g = torch.Generator().manual_seed(seed)
    cfg = backbone.vilt.config
    T, S = backbone.max_text_len, backbone.image_side
    missing = torch.zeros(n, dtype=torch.int64)
    r = torch.rand(n, generator=g)
    missing[r < 0.35] = 1
    missing[(r >= 0.35) & (r < 0.7)] = 2
    complete = (
        torch.nonzero(missing == 0).flatten()
        if copies
        else torch.zeros(0, dtype=torch.int64)
    )
    rows = n + 2 * len(complete)
    ids = torch.randint(5, cfg.vocab_size, (rows, T), generator=g)
    lengths = torch.randint(4, max_words + 1, (rows,), generator=g)
    am = (torch.arange(T)[None] < lengths[:, None]).long()
    text_dropped = torch.cat(
        [
            missing == 1,
            torch.ones(len(complete), dtype=torch.bool),
            torch.zeros(len(complete), dtype=torch.bool),
        ]
    )
    am[text_dropped] = 0
    am[text_dropped, :2] = 1  # [CLS] [SEP]
    px = torch.randn(rows, 3, S, S, generator=g)
    image_dropped = torch.cat(
        [
            missing == 2,
            torch.zeros(len(complete), dtype=torch.bool),
            torch.ones(len(complete), dtype=torch.bool),
        ]
    )
    px[image_dropped] = 1.0
    T = int(am.sum(1).max())  # padded to the batch's longest, as `Collate` does
    return Batch(
        input_ids=ids[:, :T].contiguous(),
        attention_mask=am[:, :T].contiguous(),
        pixel_values=px,
        pixel_mask=torch.ones(rows, S, S, dtype=torch.int64),
        index=torch.arange(n),
        missing=missing,
        labels=torch.randint(10 * (N_TASKS - 1), 10 * N_TASKS, (n,), generator=g),
        complete=complete,
        ids=[str(i) for i in range(n)],
        image_sizes=torch.tensor([[S, S]] * rows),
    )


def timed(fn, device: torch.device, warmup: int, seconds: float) -> tuple[float, int]:
    """(seconds per call, calls) after `warmup` calls, for at least `seconds`."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if device.type == "cuda" and calls % 5:
            continue
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return elapsed / calls, calls


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--config", default="demo", choices=["demo", "vilt-b32"])
    ap.add_argument("--backbone", default=None, help="demo backbone folder")
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="extraction batch (default 32 on CPU, 256 on CUDA)",
    )
    ap.add_argument("--train-batch", type=int, default=4)
    ap.add_argument(
        "--modes",
        default=None,
        help="training modes to time, comma-separated: eager, static, graph "
        "(default: all that the device supports)",
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="time per measurement")
    ap.add_argument("--compile", action="store_true", help="torch.compile the layers")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: the pipeline's choice)",
    )
    return ap.parse_args()


def last_step_model(backbone: Backbone, config: str, device: torch.device) -> PalModel:
    """A PalModel at the last of N_TASKS steps (10 classes each) with the
    paper's prompts (`vilt-b32`) or the demo's, on `device`."""
    if config == "vilt-b32":
        prompt = PromptParams(pool_size=128, length=8, layers=tuple(range(8)))
    else:
        prompt = PromptParams(pool_size=20, length=8, layers=(0, 1))
    model = methods.build_model(backbone, prompt, [10] * N_TASKS).to(device)
    g = torch.Generator().manual_seed(0)
    for _ in range(N_TASKS):
        model.add_task(g)
    return model.to(device)


def build_model(args: argparse.Namespace, device: torch.device) -> PalModel:
    """A PalModel of N_TASKS tasks over the chosen backbone, on `device`."""
    backbone = build_backbone(args.config, args.backbone).place(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = last_step_model(backbone, args.config, device)
    if args.compile:
        backbone._layer = torch.compile(backbone._layer, dynamic=True)
    return model


def describe(backbone: Backbone, device: torch.device) -> str:
    """One line: the backbone's sizes, the device and torch's threads."""
    return (
        f"{backbone.name}: D={backbone.hidden_size}, {backbone.num_layers} layers, "
        f"{backbone.image_side}-px images, {backbone.max_text_len} text tokens; "
        f"device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", torch {torch.__version__}, threads {torch.get_num_threads()}"
    )


def empty_text(backbone: Backbone) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (T,) int64 of the missing text: the dataset's own dummy, or
    BERT's [CLS] [SEP] for a random config without a processor."""
    T = backbone.max_text_len
    if backbone.processor is not None:
        empty = SampleDataset([], Path("."), backbone.processor, T, backbone.image_side)
        return empty.empty_ids, empty.empty_mask
    ids = torch.zeros(T, dtype=torch.int64)
    ids[:2] = torch.tensor([101, 102])
    return ids, (torch.arange(T) < 2).long()


def time_training(
    model: PalModel, mode: str, args: argparse.Namespace, words: int
) -> str:
    """One line: a training step of `args.train_batch` samples with cached
    queries, as `pal tune` runs it in `mode`: eager (copies made by the loader),
    static (copies built on the device) or graph (a CUDA graph per batch shape)."""
    backbone = model.backbone
    device, B, D = backbone.device, args.train_batch, backbone.hidden_size
    cache = QueryCache(
        torch.randn(B, 2, D, device=device), torch.randn(B, 2, D, device=device)
    )
    dummy = dummy_segments(
        backbone, *empty_text(backbone), dummy_image(backbone.image_side)
    )
    batches = [
        synthetic_batch(B, backbone, copies=mode == "eager", seed=s, max_words=words)
        for s in range(16)
    ]
    if device.type == "cuda":
        batches = [b.pin_memory() for b in batches]
    groups = [{"params": model.trainable_parameters(), "lr": 1e-4}]
    opt_args = {"betas": (0.9, 0.98), "weight_decay": 0.0}
    if mode == "graph":
        opt = capturable_adamw(groups, device, **opt_args)
    else:
        opt = torch.optim.AdamW(groups, fused=device.type == "cuda", **opt_args)
    run = make_step(
        model,
        opt,
        cache,
        N_TASKS,
        0.01,
        static=mode != "eager",
        dummy=dummy,
        graphs=mode == "graph",
    )
    steps = iter(range(1 << 62))

    def train_step() -> None:
        set_lr(opt, [1e-4])
        run(batches[next(steps) % len(batches)])

    # warm-up: every batch shape once (kernel plans, allocator, graphs)
    per_step, calls = timed(train_step, device, len(batches), args.seconds)
    rows = sum(b.input_ids.shape[0] for b in batches) / len(batches)
    copies = "+copies" if mode == "eager" else "copies built on the device"
    return (
        f"train   {mode:6} batch {B} ({copies}; {rows:.1f} loaded rows): "
        f"{per_step * 1e3:.2f} ms/step, {B / per_step:.0f} samples/s "
        f"({calls} steps)"
    )


def time_extraction(model: PalModel, args: argparse.Namespace, words: int) -> str:
    """One line: `pal extract`'s forward pass (features and BP logits, copied
    to the host) over batches of `args.batch` samples."""
    device = model.backbone.device
    n = args.batch or (256 if device.type == "cuda" else 32)
    ex = [
        synthetic_batch(n, model.backbone, copies=False, seed=100 + s, max_words=words)
        for s in range(4)
    ]
    if device.type == "cuda":
        ex = [b.pin_memory() for b in ex]
    batches = iter(range(1 << 62))

    def extract_step() -> None:
        batch = ex[next(batches) % len(ex)]
        with torch.inference_mode(), autocast(device):
            x, logits = model.features(batch)
            x.cpu()

    per_batch, calls = timed(extract_step, device, len(ex), args.seconds)
    return (
        f"extract batch {n}: {per_batch * 1e3:.1f} ms/batch, {n / per_batch:.0f} "
        f"samples/s ({calls} batches)"
    )


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    model = build_model(args, device)
    print(describe(model.backbone, device))
    words = 40 if args.config == "vilt-b32" else 14  # the demo's captions: ≤ 14 tokens
    modes = ["eager", "static"] + (["graph"] if device.type == "cuda" else [])
    if args.modes:
        modes = [m for m in modes if m in args.modes.split(",")]
    model.train()
    for mode in modes:
        print(time_training(model, mode, args, words))
    model.eval()
    print(time_extraction(model, args, words))


if __name__ == "__main__":
    main()
