"""Each trained method's training step at its steady pace, as `pal tune`
runs it, in the tree whose `pipeline` imports first (PYTHONPATH's, else this
repository): what `pal-paper plan` prices a card with (palbench/gpu_pace.py runs
it per tree and writes the card's entry of palpaper/costs.yaml).

    PYTHONPATH=. python3 -m palbench.pace --config vilt-b32 --device cuda --out DIR
    .venv/bin/python -m palbench.pace --config tiny --device cpu --steps 3 --out DIR
    .venv/bin/python -m palbench.pace --config vilt-b32 --device cpu --flops-only \
        --out DIR      # FLOPs per sample of each method's step, minutes on a CPU

Per method (pal, rebq, map, msp, l2p, dualprompt, each with its params row in
configs/food101.yaml for `vilt-b32`, params.yaml's for `tiny`), at the last of
ten tasks, on Food101-shaped photo batches (palbench/image_path.py) with the
step of `pal.model.train.make_step` (static and graphed on CUDA where the
method is graphable, eager otherwise, as `pal tune` decides):

- samples/s at batch 4 over `--steps` steps after a warm-up of every batch
  shape's capture and as many steps again (start-up and captures priced
  apart), and at `--fill` (a larger batch: the ceiling of filling the card
  with one tuning's rows), over an eighth as many steps;
- host syncs per step (`torch.cuda.set_sync_debug_mode("warn")` on CUDA; on
  the CPU the ops that would sync, `pipeline.model.vision.SYNC_OPS`);
- kernels per step and the GPU's busy share (torch.profiler over 20 steps;
  on the CPU the aten ops dispatched per step, and no busy share);
- peak memory of the tuning (allocator's reserved peak; the CUDA context
  adds about 0.5 GiB), FLOPs per sample (torch.utils.flop_counter), and on
  CUDA the graphs captured and the seconds each took (two warm-up steps and
  the capture, `GraphedSteps.capture_seconds`);
- the features of one extract batch of the seeded model, before any step,
  saved per method (`<out>/<method>.pt`), for the cosine of two trees.

Also each method's extract forward (samples/s at batch 256, and its FLOPs
per sample), and the frozen pass's rows/s. With `--worker`, one of J
processes of palbench/gpu_pace.py's packing check: PAL's step, started
together with the others through files in `--barrier`, for `--seconds`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]


import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from palbench import image_path as ip  # noqa: E402
from palcore.params import Source, load_section  # noqa: E402
from pipeline import methods  # noqa: E402
from pipeline.data.loader import SampleDataset  # noqa: E402
from pipeline.model.device import autocast  # noqa: E402
from pipeline.model.graphs import capturable_adamw, set_lr  # noqa: E402
from pipeline.model.losses import dummy_segments  # noqa: E402
from pipeline.model.network import QueryCache  # noqa: E402
from pipeline.model.train import make_step  # noqa: E402
from pipeline.params import PromptParams  # noqa: E402

METHODS = ("pal", "rebq", "map", "msp", "l2p", "dualprompt")
PARAMS = {"vilt-b32": ROOT / "configs" / "food101.yaml", "tiny": ROOT / "params.yaml"}
TASK = ip.N_TASKS  # the last task: every earlier one added, frozen where it freezes


class OpCounter(TorchDispatchMode):
    """Aten ops dispatched (the CPU's stand-in for kernels per step)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def method_model(backbone, config: str, method: str, device: torch.device):
    """The PalModel of `method`'s params row at the last of TASK tasks (seeded:
    the same prompts in every tree)."""
    prompt = load_section(
        Source(PARAMS[config], variant=method), "prompt", PromptParams
    )
    torch.manual_seed(0)
    model = methods.build_model(backbone, prompt, [10] * TASK)
    g = torch.Generator().manual_seed(0)
    for _ in range(TASK):
        model.add_task(g)
    return model.to(device)


class Tuning:
    """One tuning's step at batch `size` on `ds`, as `pal tune` builds it."""

    def __init__(
        self,
        model,
        ds,
        size: int,
        device: torch.device,
        graphs: bool = True,
        static: bool = False,
    ):
        cuda = device.type == "cuda"
        method = model.prompts
        self.static = (cuda or static) and bool(getattr(method, "graphable", False))
        copies = bool(getattr(method, "copies", False))
        self.batches = ip.batches_with(
            ds, size, 6, cuda, copies=copies and not self.static
        )
        D, n = model.backbone.hidden_size, len(ds)
        cache = QueryCache(
            torch.randn(n, 2, D, device=device), torch.randn(n, 2, D, device=device)
        )
        groups = [{"params": model.trainable_parameters(), "lr": 1e-4}]
        kw = {"betas": (0.9, 0.98), "weight_decay": 0.0}
        if self.static:
            self.opt = capturable_adamw(groups, device, **kw)
        else:
            self.opt = torch.optim.AdamW(groups, **kw)
        dummy = None
        if self.static and copies:
            b = model.backbone
            dummy = dummy_segments(b, ds.empty_ids, ds.empty_mask, ds.dummy_image())
        self.run = make_step(
            model,
            self.opt,
            cache,
            TASK,
            0.01,
            self.static,
            dummy,
            cuda and self.static and graphs,
        )
        self.size, self.i, self.device = size, 0, device
        model.train()

    def __call__(self) -> None:
        set_lr(self.opt, [1e-4])
        self.run(self.batches[self.i % len(self.batches)])
        self.i += 1

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def rate(self, steps: int) -> float:
        """samples/s over `steps` steps after a warm-up (the captures)."""
        for _ in range(2 * len(self.batches)):
            self()
        self.sync()
        t1 = time.perf_counter()
        for _ in range(steps):
            self()
        self.sync()
        return self.size * steps / (time.perf_counter() - t1)


def kernels(tuning: Tuning, steps: int = 20) -> tuple[float, float | None]:
    """(kernels per step, GPU busy share) over `steps` steps; on the CPU (aten
    ops per step, None)."""
    if tuning.device.type != "cuda":
        with OpCounter() as counter:
            tuning()
        return float(counter.ops), None
    from torch.profiler import ProfilerActivity, profile

    tuning.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            tuning()
        tuning.sync()
        wall_us = 1e6 * (time.perf_counter() - t0)
    device_events = [
        e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    busy_us = sum(e.time_range.elapsed_us() for e in device_events)
    return len(device_events) / steps, round(min(1.0, busy_us / wall_us), 4)


def step_flops(model, ds, device: torch.device, static: bool) -> float:
    """FLOPs per sample of one step at batch 4 as `pal tune` runs it (static
    where graphable, with `static` on the CPU too), not replayed."""
    from torch.utils.flop_counter import FlopCounterMode

    t = Tuning(model, ds, 4, device, graphs=False, static=static)
    with FlopCounterMode(display=False) as counter:
        t()
    return float(counter.get_total_flops()) / 4


def stored_queries(model, batch, device: torch.device) -> torch.Tensor:
    """Seeded stand-ins (n, 2, D) for the frozen queries extraction reads
    from `pal frozen`'s output (so it runs no frozen pass of its own)."""
    g = torch.Generator().manual_seed(0)
    D = model.backbone.hidden_size
    return torch.randn(batch.n, 2, D, generator=g).to(device)


def extract_flops(model, ds, device: torch.device) -> float:
    """FLOPs per sample of extraction's forward (`model.features`), batch 16."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = ip.batches_with(ds, 16, 1, device.type == "cuda", copies=False)[0]
    model.eval()
    q = stored_queries(model, batch, device)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        with autocast(device):
            model.features(batch, q)
    return float(counter.get_total_flops()) / 16


def features(model, ds, device: torch.device) -> torch.Tensor:
    """The joint embeddings of one extract batch of 16 (float32, CPU)."""
    batch = ip.batches_with(ds, 16, 1, device.type == "cuda", copies=False)[0]
    model.eval()
    torch.manual_seed(0)
    q = stored_queries(model, batch, device)
    with torch.inference_mode(), autocast(device):
        return model.features(batch, q)[0].float().cpu()


def one_method(backbone, ds, a, method: str) -> dict[str, Any]:
    """Every figure of `method` (module docstring); with `--lite` only the
    features, the rate at batch 4 and the syncs (a baseline tree's)."""
    device = torch.device(a.device)
    model = method_model(backbone, a.config, method, device)
    # the features first: of the seeded model, before any step trains it
    torch.save(features(model, ds, device), a.out / f"{method}.pt")
    out: dict[str, Any] = {}
    if not a.lite:
        out["extract_flops_per_sample"] = extract_flops(model, ds, device)
        out["flops_per_sample"] = step_flops(model, ds, device, a.static)
    if a.flops_only:
        return out
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = Tuning(model, ds, 4, device, static=a.static)
    out["graphed"] = t.static
    out["samples_per_s"] = round(t.rate(a.steps), 2)
    graphs = t.run.graphs
    if graphs is not None and graphs.graphs:  # CUDA: seconds per graph captured
        out["graphs"] = len(graphs.graphs)
        out["capture_s_per_graph"] = round(
            graphs.capture_seconds / len(graphs.graphs), 3
        )
    out["syncs_per_step"] = ip.count_syncs(t, device)
    if not a.lite:
        out["kernels_per_step"], out["busy_share"] = kernels(t)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_reserved(device)
            out["tuning_gib"] = round(peak / 2**30, 2)
        size = 256 if device.type == "cuda" else 16
        out["extract_per_s"] = forward_rate(model, ds, size, device, a.seconds)
        fill = Tuning(model, ds, a.fill, device, static=a.static)
        out["fill_samples_per_s"] = round(fill.rate(max(1, a.steps // 8)), 2)
        del fill
    del t, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def forward_rate(
    model, ds, size: int, device: torch.device, seconds: float, stored: bool = True
):
    """samples/s of `model.features` at batch `size`: extraction's forward
    (`stored`: the frozen queries read, as `pal extract` reads them), or the
    frozen pass itself."""
    model.to(device).eval()
    batches = ip.batches_with(ds, size, 3, device.type == "cuda", copies=False)
    qs = [stored_queries(model, b, device) if stored else None for b in batches]
    state = {"i": 0}

    def forward() -> None:
        i = state["i"] % len(batches)
        with torch.inference_mode(), autocast(device):
            model.features(batches[i], qs[i])
        state["i"] += 1

    return round(size / ip.timed(forward, device, 3, seconds), 1)


def frozen_rate(backbone, ds, a) -> float:
    """Rows/s of the frozen pass (a model without prompts)."""
    device = torch.device(a.device)
    size = 256 if device.type == "cuda" else 16
    model = methods.build_model(backbone, PromptParams(enabled=False), [10] * TASK)
    g = torch.Generator().manual_seed(0)
    for _ in range(TASK):
        model.add_task(g)
    return forward_rate(model, ds, size, device, a.seconds, stored=False)


def build_backbone(config: str, device: torch.device, work: Path):
    """A random ViLT in the hub layout: ViLT-B/32's sizes, or tiny with the
    demo's 4 layers (its params rows prompt layers 0-3)."""
    from pipeline.fakes import trees as fakes
    from pipeline.model.backbone import load_backbone

    folder = work / f"vilt-{config}-4" if config == "tiny" else work / "vilt-b32"
    if not folder.exists():
        if config == "tiny":
            fakes.make_hub_vilt(folder, layers=4)
        else:
            fakes.make_hub_vilt(folder, full_size=True)
    backbone = load_backbone(str(folder), 40).place(device)
    backbone.fast_embed = True  # as on CUDA (place()): the CPU shows its rule
    return backbone


def dataset(backbone, work: Path, photos: int) -> SampleDataset:
    """The photo batches' dataset (made in `work` when absent)."""
    root = work / "photos"
    root.mkdir(parents=True, exist_ok=True)
    return ip.photo_dataset(backbone, root, ip.photo_samples(root, photos))


def worker(backbone, ds, a) -> dict[str, Any]:
    """One of J tunings side by side: ready after its warm-up, steps from
    the moment `go` exists for `--seconds`; its samples/s and start-up."""
    device = torch.device(a.device)
    t = Tuning(method_model(backbone, a.config, "pal", device), ds, 4, device)
    for _ in range(2 * len(t.batches)):
        t()
    t.sync()
    startup = time.perf_counter() - T_START
    barrier = Path(a.barrier)
    (barrier / f"ready-{a.worker}").write_text("")
    while not (barrier / "go").exists():
        time.sleep(0.01)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        t()
        steps += 1
        if steps % 10 == 0:
            t.sync()
    t.sync()
    return {
        "samples_per_s": round(4 * steps / (time.perf_counter() - t0), 2),
        "startup_s": round(startup, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("vilt-b32", "tiny"), default="vilt-b32")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, required=True, help="folder for pace.json")
    ap.add_argument("--workdir", type=Path, help="the model and photos (default: out)")
    ap.add_argument("--steps", type=int, default=1000, help="timed steps at batch 4")
    ap.add_argument("--fill", type=int, default=32, help="the larger batch")
    ap.add_argument("--seconds", type=float, default=3.0, help="extract's timing")
    ap.add_argument("--photos", type=int, default=512)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--flops-only", action="store_true")
    ap.add_argument(
        "--lite",
        action="store_true",
        help="features, batch-4 rate and syncs only (the baseline tree's)",
    )
    ap.add_argument(
        "--static",
        action="store_true",
        help="on the CPU, the static step a GPU replays (graphable methods)",
    )
    ap.add_argument("--worker", type=int, help="index of a packing worker")
    ap.add_argument("--barrier", help="the packing workers' folder")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import pipeline

    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(a.device)
    backbone = build_backbone(a.config, device, a.workdir or a.out)
    ds = dataset(backbone, a.workdir or a.out, a.photos)
    if a.worker is not None:
        result = worker(backbone, ds, a)
        (a.out / f"worker-{a.worker}.json").write_text(json.dumps(result))
        return 0
    cuda = device.type == "cuda"
    result: dict[str, Any] = {
        "tree": str(Path(pipeline.__file__).resolve().parents[1]),
        "config": a.config,
        "card": torch.cuda.get_device_name(device) if cuda else None,
        "memory_gib": (
            round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
            if cuda
            else None
        ),
        "steps": a.steps,
        "fill": a.fill,
        "methods": {},
    }
    for method in a.methods.split(","):
        result["methods"][method] = m = one_method(backbone, ds, a, method)
        print(f"pace: {method}: {json.dumps(m)}", flush=True)
        (a.out / "pace.json").write_text(json.dumps(result, indent=1))
    if not (a.flops_only or a.lite):
        result["frozen_rows_per_s"] = frozen_rate(backbone, ds, a)
    (a.out / "pace.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
