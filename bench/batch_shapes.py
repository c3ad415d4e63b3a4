"""How many padded batch shapes real photos give the CUDA-graphed training step.

A graphed step (`tune.cuda_graphs`) replays one captured graph per shape of
its inputs h (B, N, D): B is fixed (a short last batch is padded), the text is
padded to a bucket of the batch's longest (`losses.text_bucket`: a multiple
of 8 up to `model.max_text_len`), so the shape is set by the text bucket T and
by N = T + 1 + P, where P
is the largest number of image patches in the batch — ViLT keeps every patch
of each image and pads the others' token lists to the batch's largest (its
`visual_embed`; the padded canvas size does not matter). ViLT-B/32's processor
resizes the shorter side to 384 and caps the longer at 640, both floored to 32,
so an image has 12 × k patches, k = 12 … 20 (or fewer on the shorter side when
the cap binds): at most a dozen values of P.

This script draws image sizes from two documented mixes, forms batches of 4,
and counts the distinct image shapes P (each comes in as many graphs as text
buckets the titles reach: up to 5 at 40 tokens, so `GraphedSteps` keeps up
to 64 graphs; shapes beyond it run eagerly; here the text is held at 40, one
bucket), the share of steps that replay a graph, and the token overhead of
bucketing P up to {144, 192, 240} instead.

- `photo mix`: the six sizes of bench/loader.py (web photos 512×384 … 2048×1365,
  NYT-like 1050×550), each jittered ±20 % per side;
- `wide mix`: longer side uniform in 300–2048 px, aspect ratio log-uniform in
  [1/2.5, 2.5] — wider than either dataset, a stress case.

    .venv/bin/python bench/batch_shapes.py
"""

from __future__ import annotations

import argparse

import numpy as np
from transformers.models.vilt.image_processing_pil_vilt import (
    MAX_LONGER_EDGE,
    MAX_SHORTER_EDGE,
    get_resize_output_image_size,
)

SHORTER, DIVISOR, PATCH, TEXT = 384, 32, 32, 40
MAX_GRAPHS = 64  # GraphedSteps' limit (pipeline/model/graphs.py)
BUCKETS = (144, 192, 240)
SIZES = [(512, 384), (384, 512), (800, 800), (1024, 683), (1050, 550), (2048, 1365)]


def patches(width: int, height: int) -> int:
    """Patches ViLT-B/32 keeps of a width × height photo after its processor."""
    longer = int(MAX_LONGER_EDGE / MAX_SHORTER_EDGE * SHORTER)
    h, w = get_resize_output_image_size(
        np.empty((height, width, 0)), SHORTER, longer, DIVISOR, "channels_last"
    )
    return (h // PATCH) * (w // PATCH)


def photo_mix(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    base = [SIZES[i] for i in rng.integers(0, len(SIZES), n)]
    jitter = rng.uniform(0.8, 1.2, (n, 2))
    return [
        (int(w * a), int(h * b)) for (w, h), (a, b) in zip(base, jitter, strict=True)
    ]


def wide_mix(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    longer = rng.uniform(300, 2048, n)
    ratio = np.exp(rng.uniform(np.log(1 / 2.5), np.log(2.5), n))
    return [
        (int(L), int(L / r)) if r >= 1 else (int(L * r), int(L))
        for L, r in zip(longer, ratio, strict=True)
    ]


def graphed_share(shapes: list[int]) -> float:
    """Share of steps that replay a graph: the first MAX_GRAPHS distinct shapes
    get one (captured on first sight), later new shapes run eagerly."""
    captured: set[int] = set()
    hits = 0
    for s in shapes:
        if s in captured:
            hits += 1
        elif len(captured) < MAX_GRAPHS:
            captured.add(s)
            hits += 1  # captured, then replayed
    return hits / len(shapes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15000, help="batches of 4")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| mix | distinct P | distinct shapes | graphed steps | tokens/step | "
          f"bucketed {BUCKETS}: shapes, graphed, token overhead |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, draw in (("photo mix", photo_mix), ("wide mix", wide_mix)):
        sizes = draw(rng, 4 * a.steps)
        P = np.array([patches(w, h) for w, h in sizes]).reshape(-1, 4)
        step_p = P.max(1)
        tokens = TEXT + 1 + step_p
        bucketed = np.array([min(b for b in BUCKETS if b >= p) for p in step_p])
        b_tokens = TEXT + 1 + bucketed
        print(
            f"| {name} | {len(np.unique(P))} | {len(np.unique(step_p))} | "
            f"{100 * graphed_share(list(step_p)):.1f} % | {tokens.mean():.0f} | "
            f"{len(np.unique(bucketed))}, "
            f"{100 * graphed_share(list(bucketed)):.1f} %, "
            f"+{100 * (b_tokens.mean() / tokens.mean() - 1):.1f} % |"
        )


if __name__ == "__main__":
    main()
