"""How informative are the demo backbone's frozen features, per modality?

Loads `<demo>/vilt` with `ViltModel.from_pretrained` / `ViltProcessor.from_pretrained`
(offline), embeds every demo sample as the text-CLS token after the final
LayerNorm (`last_hidden_state[:, 0]`, the vector PAL classifies) under three
input conditions, and fits a ridge probe (closed form, features standardised,
one-hot targets, lambda fixed in advance):

    complete     image + caption
    image-only   image + empty caption ""            (text missing, code 1)
    text-only    all-white image (1.0) + caption     (image missing, code 2)

Two probes per condition: `matched` is trained on training features of the same
condition (how much class information that modality carries); `from complete`
is trained on complete training features and tested on the condition (how a
classifier fitted on complete data copes with a missing modality).

Targets: complete >= 80 %, and image-only / text-only each >= 15 points below
complete (matched probe); with `--build`, `pal demo` itself (run first, timed, in
a fresh process with the given params file) within 120 s. Usage:

    python bench/demo_quality.py [--demo data/demo] [--lam 1.0]
    python bench/demo_quality.py --build --demo /tmp/demo [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `pal demo`; before torch loads
BUILD_BUDGET_S = 120.0


def embed(model, processor, images, texts, white: bool, batch: int = 128) -> np.ndarray:
    """(n, D) float64 text-CLS features of the given images/texts."""
    import torch

    feats = []
    for s in range(0, len(texts), batch):
        enc = processor(
            images=images[s : s + batch],
            text=texts[s : s + batch],
            padding="max_length",
            max_length=40,
            truncation=True,
            return_tensors="pt",
        )
        if white:
            enc["pixel_values"] = torch.ones_like(enc["pixel_values"])
        with torch.inference_mode():
            out = model(**enc).last_hidden_state[:, 0]
        feats.append(out.double().numpy())
    return np.concatenate(feats)


def ridge_probe(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, lam: float
) -> np.ndarray:
    """Predicted labels of a ridge classifier; features standardised on train."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-8
    a = np.hstack([(x_train - mu) / sd, np.ones((len(x_train), 1))])
    b = np.hstack([(x_test - mu) / sd, np.ones((len(x_test), 1))])
    y = np.eye(y_train.max() + 1)[y_train]
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ y)
    return (b @ w).argmax(1)


def build(params: str, out: str) -> float:
    """Run `pal demo` into `out`; returns its wall seconds."""
    cmd = [sys.executable, "-m", "pipeline", "demo", "--params", params,
           "--out", out]  # fmt: skip
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def embed_demo(root: Path) -> tuple[list[str], dict[str, dict]]:
    """(class names, split → {"y": labels (n,), condition → features (n, D)})
    of the demo under `root`, embedded by its own ViLT: complete, image-only
    (empty text) and text-only (white image)."""
    import torch
    from PIL import Image
    from transformers import ViltModel, ViltProcessor

    torch.set_num_threads(2)
    manifest = json.loads((root / "dataset" / "captions.json").read_text())
    names = [c["name"] for c in manifest["classes"]]
    index = {n: i for i, n in enumerate(names)}
    model = ViltModel.from_pretrained(root / "vilt").eval()
    processor = ViltProcessor.from_pretrained(root / "vilt")
    data = {}
    for split in ("train", "test"):
        rows = [s for s in manifest["samples"] if s["split"] == split]
        images = [
            Image.open(root / "dataset" / r["image"]).convert("RGB") for r in rows
        ]
        texts = [r["text"] for r in rows]
        data[split] = {
            "y": np.array([index[r["class_name"]] for r in rows]),
            "complete": embed(model, processor, images, texts, white=False),
            "image-only": embed(model, processor, images, [""] * len(rows), False),
            "text-only": embed(model, processor, images, texts, white=True),
        }
    return names, data


def probe_table(data: dict[str, dict], lam: float) -> dict[str, float]:
    """Print the ridge probe's test accuracy per condition (trained on the
    same condition, and on complete samples); returns the matched ones, in %."""
    tr, te = data["train"], data["test"]
    print(f"{'condition':<12} {'matched %':>10} {'from complete %':>16}")
    acc = {}
    for cond in ("complete", "image-only", "text-only"):
        matched = ridge_probe(tr[cond], tr["y"], te[cond], lam)
        transfer = ridge_probe(tr["complete"], tr["y"], te[cond], lam)
        acc[cond] = 100 * np.mean(matched == te["y"])
        print(
            f"{cond:<12} {acc[cond]:>10.1f} {100 * np.mean(transfer == te['y']):>16.1f}"
        )
    return acc


def verdict(acc: dict[str, float], n_classes: int) -> bool:
    """Print and return whether complete samples reach 80 % and each missing
    modality costs at least 15 points."""
    ok_full = acc["complete"] >= 80
    gap_img = acc["complete"] - acc["image-only"]
    gap_txt = acc["complete"] - acc["text-only"]
    print(f"chance {100 / n_classes:.1f} %")
    print(f"complete >= 80 %: {'yes' if ok_full else 'NO'} ({acc['complete']:.1f})")
    for name, gap in (("image-only", gap_img), ("text-only", gap_txt)):
        print(f"{name} gap >= 15 points: {'yes' if gap >= 15 else 'NO'} ({gap:.1f})")
    return ok_full and gap_img >= 15 and gap_txt >= 15


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", default="data/demo", help="folder written by `pal demo`")
    ap.add_argument("--lam", type=float, default=1.0, help="ridge lambda")
    ap.add_argument("--build", action="store_true", help="run `pal demo` first, timed")
    ap.add_argument("--params", default="params.yaml", help="params file for --build")
    args = ap.parse_args()
    build_s = build(args.params, args.demo) if args.build else None
    t0 = time.perf_counter()
    names, data = embed_demo(Path(args.demo))
    secs = time.perf_counter() - t0
    tr, te = data["train"], data["test"]
    print(
        f"demo: {len(names)} classes, {len(tr['y'])} train / {len(te['y'])} test, "
        f"feature dim {tr['complete'].shape[1]}, ridge lambda {args.lam}, "
        f"embedding {secs:.1f} s"
    )
    ok = verdict(probe_table(data, args.lam), len(names))
    if build_s is not None:
        ratio = build_s / BUILD_BUDGET_S
        print(
            f"pal demo: {build_s:.1f} s / {BUILD_BUDGET_S:.0f} s budget = {ratio:.3f}"
        )
        ok = ok and build_s <= BUILD_BUDGET_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
