"""The paper's run rehearsed: a UPMC-Food101-shaped tree, a ViLT in the hub's
layout, the food101 preset, `dvc repro evaluate@pal-0` (one run of PAL),
per-stage figures.

In a scratch copy of the project it builds

- `data/raw/food101/`: the titles-CSV layout (images/{train,test}/<class>/,
  texts/{train,test}_titles.csv) with `--classes` classes (101 as the real one;
  the last has one training photo fewer and is dropped) of photo-sized JPEGs
  (the mix of bench/loader.py) and titles of the real length;
- `models/vilt-b32-mlm/`: random weights in the hub layout (`pytorch_model.bin`
  with the MLM head, old preprocessor config, tokenizer files), of ViLT-B/32's
  sizes (`--config vilt-b32`) or a tiny one (`--config tiny`: 8 layers of width
  128, 32-px images, for CPU);

installs configs/food101.yaml as params.yaml with only the scale knobs changed
(dataset size, backbone path, `tune.epochs`, `solve.width`, the device and the
loader workers this machine has), runs `dvc repro evaluate@pal-0` (its output
kept in the scratch copy's logs/rehearsal.log), and prints per stage: wall
time, the part of it that is start-up, the steady samples/s, the share of
graphed steps, the GPU memory peak and the time spent waiting for data; then
projects one run of PAL and the preset's protocol on the full Food101 and
N24News from the start-ups and the steady rates.

    .venv/bin/python bench/rehearsal.py --config tiny --classes 21 --epochs 1 \\
        --width 1024                       # smallest scale, CPU, ~1 minute
    python bench/rehearsal.py --config vilt-b32 --classes 101 --train 12 --test 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from loader import SIZES, photo  # noqa: E402
from scratch_project import make_scratch_project  # noqa: E402

# full datasets (after Food101's smallest class is dropped): training and test
# samples, tasks, epochs of the presets
FULL = {"UPMC-Food101": (61127, 22716, 10), "N24News": (48988, 6106, 6)}
WORDS = "grilled chicken salad with fresh herbs and lemon dressing recipe".split()


def make_tree(root: Path, classes: int, train: int, test: int) -> int:
    """The Food101 titles-CSV tree; returns the number of photos."""
    rng = np.random.default_rng(0)
    (root / "texts").mkdir(parents=True)
    n = 0
    for split, count in (("train", train), ("test", test)):
        with (root / "texts" / f"{split}_titles.csv").open("w") as f:
            f.write("image_name,text,class_name\n")
            for c in range(classes):
                dish = f"dish_{c:03d}"
                for k in range(count - (split == "train" and c == classes - 1)):
                    name = f"{dish}_{k}.jpg"
                    path = root / "images" / split / dish / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    photo(SIZES[n % len(SIZES)], rng).save(path, quality=90)
                    title = " ".join(rng.choice(WORDS, 12))
                    f.write(f"{name},{title},{dish}\n")
                    n += 1
    return n


def make_backbone(folder: Path, config: str) -> None:
    """Random ViLT weights in the hub layout (`make_hub_vilt` for tiny)."""
    from helpers import make_hub_vilt

    make_hub_vilt(folder, layers=8, hidden=128)  # prompts at 0-7, pools of 128
    if config == "vilt-b32":  # the same layout at ViLT-B/32's sizes
        import torch
        from transformers import ViltConfig, ViltForMaskedLM

        cfg = ViltConfig(
            vocab_size=len((folder / "vocab.txt").read_text().split()),
            max_position_embeddings=40,
            max_image_length=-1,
            architectures=["ViltForMaskedLM"],
        )  # hidden 768, 12 layers, 384-px images, 32-px patches
        cfg.save_pretrained(folder)
        torch.save(ViltForMaskedLM(cfg).state_dict(), folder / "pytorch_model.bin")
        pre = json.loads((folder / "preprocessor_config.json").read_text())
        pre.update(size=384, size_divisor=32)
        (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("tiny", "vilt-b32"), default="tiny")
    ap.add_argument("--classes", type=int, default=21, help="one is dropped")
    ap.add_argument("--train", type=int, default=6, help="training photos per class")
    ap.add_argument("--test", type=int, default=2, help="test photos per class")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--width", type=int, default=15000, help="solve.width")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="pal-rehearsal-"))
    params = yaml.safe_load((ROOT / "configs" / "food101.yaml").read_text())
    preset_epochs = params["tune"]["epochs"]
    preset_runs = len(params["protocol"]["runs"])
    workers = max(0, min(params["extract"]["num_workers"], (os.cpu_count() or 1) - 1))
    params["data"]["root"] = "data/raw/food101"
    params["model"]["backbone"] = "models/vilt-b32-mlm"
    tune_workers = min(workers, params["tune"]["num_workers"])
    params["tune"].update(epochs=a.epochs, device=a.device, num_workers=tune_workers)
    params["extract"].update(device=a.device, num_workers=workers)
    params["solve"].update(width=a.width, device=a.device)
    params["protocol"] = {"runs": [0]}
    env = make_scratch_project(work, params)
    photos = make_tree(work / "data/raw/food101", a.classes, a.train, a.test)
    make_backbone(work / "models/vilt-b32-mlm", a.config)
    print(f"# rehearsal in {work}: {a.classes} classes, {photos} photos, "
          f"{a.config}, epochs {a.epochs}, width {a.width}, device {a.device}, "
          f"{workers} loader workers")  # fmt: skip

    starts: dict[str, float] = {}
    lines: list[str] = []
    proc = subprocess.Popen(
        ["dvc", "repro", "evaluate@pal-0"], cwd=work, env=env,  # dvc on its PATH
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        m = re.match(r"Running stage '(\w+)(?:@[^']*)?'", line)
        if m:
            starts[m.group(1)] = time.perf_counter()
    end = time.perf_counter()
    text = "".join(lines)
    log_file = work / "logs" / "rehearsal.log"
    log_file.parent.mkdir(exist_ok=True)
    log_file.write_text(text)
    if proc.wait() != 0:
        raise SystemExit(f"dvc repro failed (whole output in {log_file}):\n"
                         + "".join(lines[-40:]))  # fmt: skip
    names = list(starts)
    wall = {
        s: (starts[names[i + 1]] if i + 1 < len(names) else end) - starts[s]
        for i, s in enumerate(names)
    }
    samples = [json.loads(x) for x in (work / "data/prepare/0/samples.jsonl").open()]
    n_train = sum(s["split"] == "train" for s in samples)
    tasks = params["data"]["tasks"]
    n_test = sum(s["split"] == "test" for s in samples)
    # extraction embeds each step's training samples and every seen task's test
    n_extract = n_train + sum(k * n_test / tasks for k in range(1, tasks + 1))
    # steady state: tune's epochs (logs/tune.jsonl) and extract's batches (its
    # per-split log lines); the rest of a stage's wall time is start-up
    # (imports, model loading, graph capture, loader workers starting)
    timings = [json.loads(x) for x in (work / "logs/tune.jsonl").open()]
    busy = {"tune": sum(t["seconds"] for t in timings)}
    done = {"tune": sum(t["samples"] for t in timings)}
    waits = {"tune": sum(t["data_wait"] for t in timings)}
    # before its epochs each task runs the frozen backbone once over its
    # training samples (the queries): a per-sample cost, projected at its rate
    queries = re.findall(r"frozen queries of (\d+) samples in ([\d.]+) s", text)
    query_s = sum(float(q[1]) for q in queries)
    query_rate = sum(int(q[0]) for q in queries) / query_s if query_s else 0.0
    runs = re.findall(r"(\d+) samples in ([\d.]+) s, ([\d.]+) s of it waiting", text)
    busy["extract"] = sum(float(r[1]) for r in runs)
    done["extract"] = sum(int(r[0]) for r in runs)
    waits["extract"] = sum(float(r[2]) for r in runs)
    graphed = re.findall(r"(\d+) of (\d+) steps replayed a CUDA graph", text)
    replayed, steps = (sum(int(x[i]) for x in graphed) for i in (0, 1))
    share = f"{100 * replayed / steps:.1f} %" if graphed else "– (no CUDA graphs)"
    peaks = dict(re.findall(r"(tune|extract): GPU memory peak ([\d.]+) GiB", text))
    rate = {s: done[s] / busy[s] for s in busy if busy[s] > 0}
    startup = {s: wall[s] - busy[s] for s in busy}
    startup["tune"] -= query_s
    print(
        "| stage | wall s | start-up s | samples/s (steady) "
        "| graphed steps | GPU peak GiB | data wait s |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in names:
        r = f"{rate[s]:.1f}" if s in rate else ""
        u = f"{startup[s]:.1f}" if s in startup else ""
        g = share if s == "tune" else ""
        w = f"{waits[s]:.1f}" if s in waits else ""
        print(f"| {s} | {wall[s]:.1f} | {u} | {r} | {g} | {peaks.get(s, '')} | {w} |")
    print(f"({n_train} training samples x {a.epochs} epochs tuned, "
          f"{n_extract:.0f} samples extracted; tune's frozen queries took "
          f"{query_s:.1f} s, {query_rate:.1f} samples/s)")  # fmt: skip
    if "tune" not in rate or "extract" not in rate:
        raise SystemExit("no steady tune or extract time measured: nothing to project")
    # the preset's protocol: PAL tunes once per run; PAL, init and frozen each
    # extract once per run (init's and frozen's tune stages only start up)
    for name, (train, test, k) in FULL.items():
        n_ext = train + sum(j * test / k for j in range(1, k + 1))
        t = startup["tune"] + train * preset_epochs / rate["tune"]
        t += train / query_rate if query_rate else 0.0
        e = startup["extract"] + n_ext / rate["extract"]
        print(
            f"projected {name}, one run of PAL: tune {t / 60:.0f} min "
            f"({preset_epochs} epochs), extract {e / 60:.1f} min; "
            f"the protocol ({preset_runs} runs of PAL, init, frozen): "
            f"about {preset_runs * (t + 2 * startup['tune'] + 3 * e) / 3600:.1f} h"
        )


if __name__ == "__main__":
    main()
