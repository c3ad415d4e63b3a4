"""FLOPs per sample of PAL's graphed training step and of extract's forward at
ViLT-B/32's sizes, with and without the trims of unused work: rows the last
layer computes only where read (`Backbone.encode(read=...)`) and text padded
to a bucket of the batch's longest (`losses.text_bucket`) in the static step.

A random ViLT-B/32 (12 layers of 768, `ViltConfig()`'s defaults), the paper's
prompts (pools of 128, length 8, layers 0-7) at the last of 10 tasks, batch 4,
Food101-like: 15 text tokens, 216 image patches; counted on the CPU by
`torch.utils.flop_counter.FlopCounterMode` (forward and backward of
`static_loss`; extraction: `PalModel.features`' prompt pass). "before" runs
every encode over all rows and pads the static step's text to 40.

    .venv/bin/python bench/step_flops.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import ViltConfig, ViltModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from palcore.codes import Missing  # noqa: E402
from pipeline import methods  # noqa: E402
from pipeline.model import losses  # noqa: E402
from pipeline.model.encoder import Backbone, read_ranges, take_rows  # noqa: E402
from pipeline.model.method import View  # noqa: E402
from pipeline.model.network import QueryCache  # noqa: E402
from pipeline.params import PromptParams  # noqa: E402

B, TEXT, PATCHES, MAX_TEXT, TASKS = 4, 15, 216, 40, 10
TRIMMED = Backbone.encode


def full_encode(self, h, mask, prompts=None, prompt_outputs=False, read=None):
    """The encode before `read`: every row, then the read ones taken."""
    out = TRIMMED(self, h, mask, prompts, prompt_outputs)
    return out if read is None else take_rows(out, read_ranges(read, out.shape[1]))


def model_at_last_task():
    torch.manual_seed(0)
    backbone = Backbone(ViltModel(ViltConfig()), None, "vilt-b32", MAX_TEXT)
    prompt = PromptParams(pool_size=128, length=8, layers=tuple(range(8)))
    model = methods.build_model(backbone, prompt, [10] * TASKS)
    g = torch.Generator().manual_seed(0)
    for _ in range(TASKS):
        model.add_task(g)
    return model


def inputs(model, T: int) -> dict[str, torch.Tensor]:
    D, N = model.backbone.hidden_size, T + 1 + PATCHES
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[:, TEXT:T] = False
    return {
        "h": torch.randn(B, N, D),
        "mask": mask,
        "text_mask": mask[:, :T],
        "index": torch.arange(B),
        "missing": torch.tensor([0, 0, Missing.TEXT, Missing.IMAGE]),
        "labels": torch.full((B,), 95),
    }


def train_flops(model, T: int) -> float:
    D = model.backbone.hidden_size
    cache = QueryCache(torch.randn(B, 2, D), torch.randn(B, 2, D))
    dummy_mask = torch.zeros(MAX_TEXT, dtype=torch.bool)
    dummy_mask[:2] = True
    dummy = losses.DummySegments(
        torch.randn(MAX_TEXT, D), dummy_mask, torch.randn(145, D)
    )
    x = inputs(model, T)
    with FlopCounterMode(display=False) as count:
        value, _ = losses.static_loss(model, x, cache, dummy, TASKS, 0.01)
        value.backward()
    model.zero_grad(set_to_none=True)
    return count.get_total_flops() / B


def extract_flops(model) -> float:
    D = model.backbone.hidden_size
    x = inputs(model, TEXT)
    q_t, q_v = torch.randn(B, D), torch.randn(B, D)
    view = View(x["h"], x["mask"], TEXT, q_t, q_v, x["missing"])
    with torch.no_grad(), FlopCounterMode(display=False) as count:
        model.prompts.features(model.backbone, view)
    return count.get_total_flops() / B


def main() -> None:
    torch.set_num_threads(2)
    model = model_at_last_task()
    bucket = losses.text_bucket(TEXT, MAX_TEXT)
    Backbone.encode = full_encode
    try:
        before = train_flops(model, MAX_TEXT), extract_flops(model)
    finally:
        Backbone.encode = TRIMMED
    rows_only = train_flops(model, MAX_TEXT), extract_flops(model)
    after = train_flops(model, bucket), extract_flops(model)
    print(f"batch {B}, text {TEXT} tokens (bucket {bucket}), {PATCHES} patches")
    for name, (tune, extract) in (
        ("before (all rows, text 40)", before),
        ("read rows only, text 40", rows_only),
        (f"read rows only, text {bucket}", after),
    ):
        print(f"{name:30s} tune {tune / 1e9:7.1f} GF/sample, extract "
              f"{extract / 1e9:6.1f} GF/sample")  # fmt: skip


if __name__ == "__main__":
    main()
