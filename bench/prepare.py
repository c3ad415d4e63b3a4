"""`pal prepare` on a Food101-sized fake dataset: is it under 20 s?

Builds (once, in --work) a fake UPMC-Food101 tree in layout (a): class_idx.json,
split.json, text.json for 101 classes × 900 files = 90,900 samples (train 600,
val 70, test 230 per class, as in the real split) and one empty file per image,
so the existence check runs for real while no image content is read. Then
times the `prepare` command (params load, listing, existence check per class
folder, protocol, writing both outputs) in a fresh process, `--repeat` times.

    python bench/prepare.py [--work /tmp/pal-bench-prepare] [--repeat 3]

Prints the wall times and the ratio to the 20 s budget.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BUDGET_S = 20.0
N_CLASSES = 101
PER_CLASS = {"train": 600, "val": 70, "test": 230}


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
                (folder / name).touch()
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
    return 0 if worst <= BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
