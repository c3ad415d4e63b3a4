"""`pal prepare` on a Food101-sized fake dataset, and the cost of its image
check on photos.

Builds (once, in --work) a fake UPMC-Food101 tree in layout (a): class_idx.json,
split.json, text.json for 101 classes × 900 files = 90,900 samples (train 600,
val 70, test 230 per class, as in the real split) and an 8-px JPEG per image.
Times the `prepare` command (params load, listing, existence check per class
folder, decoding every image, protocol, writing both outputs) in a fresh
process, `--repeat` times: the bookkeeping's cost against the 20 s budget.

Then times prepare's image check (`unreadable_images`: every file decoded,
JPEGs at 1/8 scale, one thread per core) on `--photos` photo-sized JPEGs (the
mix of pipeline/fakes/trees.py) and projects it onto Food101's 90,900 photos.

    python bench/prepare.py [--work /tmp/pal-bench-prepare] [--repeat 3] [--photos 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.fakes.trees import tiny_jpeg

BUDGET_S = 20.0
FOOD101_IMAGES = 90_900
N_CLASSES = 101
PER_CLASS = {"train": 600, "val": 70, "test": 230}


TINY_JPEG = tiny_jpeg()


def photo_check_rate(work: Path, n: int, repeat: int) -> float:
    """Images/s of prepare's image check on `n` photo-sized JPEGs (best run)."""
    import numpy as np

    from pipeline.fakes.trees import SIZES, photo
    from pipeline.stages.prepare import unreadable_images

    folder = work / "photos"
    if len(list(folder.glob("*.jpg"))) != n:
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(n):
            photo(SIZES[i % len(SIZES)], rng).save(folder / f"{i}.jpg", quality=90)
    names = [f"{i}.jpg" for i in range(n)]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        assert unreadable_images(folder, names) == []
        best = min(best, time.perf_counter() - t)
    return n / best


def build_tree(root: Path) -> int:
    """Write the fake tree; return the number of samples."""
    classes = [f"food_{i:03d}" for i in range(N_CLASSES)]
    splits: dict[str, list[str]] = {s: [] for s in PER_CLASS}
    texts = {}
    for c in classes:
        k = 0
        for split, n in PER_CLASS.items():
            folder = root / "images" / ("test" if split == "test" else "train") / c
            folder.mkdir(parents=True, exist_ok=True)
            for _ in range(n):
                name = f"{c}_{k}.jpg"
                k += 1
                splits[split].append(name)
                texts[name] = f"homemade {c.replace('_', ' ')} recipe number {k}"
                (folder / name).write_bytes(TINY_JPEG)
    (root / "class_idx.json").write_text(
        json.dumps({c: i for i, c in enumerate(classes)})
    )
    (root / "split.json").write_text(json.dumps(splits))
    (root / "text.json").write_text(json.dumps(texts))
    return sum(len(v) for v in splits.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/pal-bench-prepare", help="scratch folder")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs")
    ap.add_argument("--photos", type=int, default=300, help="photo-sized JPEGs")
    args = ap.parse_args()
    work = Path(args.work)
    root = work / "food101"
    stamp = root / ".complete"
    if not stamp.exists():
        t = time.perf_counter()
        n = build_tree(root)
        stamp.write_text(str(n))
        print(f"built fake tree: {n} samples in {time.perf_counter() - t:.1f} s")
    n = int(stamp.read_text())
    params = work / "params.yaml"
    params.write_text(
        "data:\n  dataset: food101\n"
        f"  root: {root}\n  tasks: 10\n  missing_type: both\n  missing_rate: 0.7\n"
    )
    cmd = [sys.executable, "-m", "pipeline", "prepare", "--params", str(params),
           "--out", str(work / "out")]  # fmt: skip
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    rows = sum(1 for _ in (work / "out" / "samples.jsonl").open())
    best, worst = min(times), max(times)
    print(f"pal prepare, {n} listed samples -> {rows} rows (100 classes kept)")
    print("wall s per run: " + ", ".join(f"{t:.2f}" for t in times))
    print(f"worst / budget = {worst:.2f} / {BUDGET_S:.0f} s = {worst / BUDGET_S:.3f}")
    print(f"best / budget = {best:.2f} / {BUDGET_S:.0f} s = {best / BUDGET_S:.3f}")
    rate = photo_check_rate(work, args.photos, args.repeat)
    cores = os.cpu_count() or 1
    print(
        f"image check on {args.photos} photo-sized JPEGs, {cores} cores: "
        f"{rate:.0f} images/s; Food101's {FOOD101_IMAGES} photos: "
        f"{FOOD101_IMAGES / rate / 60:.1f} min"
    )
    return 0 if worst <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
