"""The checkpoint as downloaded and photo-like data: a tiny ViLT in the hub's
`dandelin/vilt-b32-mlm` layout runs prepare → tune → extract → solve →
evaluate on a UPMC-Food101 tree (titles-CSV layout) of photo-shaped JPEGs."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
from click.testing import CliRunner
from helpers import PROMPT, make_hub_vilt
from PIL import Image

from pipeline.model.backbone import backbone_folder, load_backbone
from pipeline.stages.extract import cli as extract_cli
from pipeline.stages.prepare import cli as prepare_cli
from pipeline.stages.tune import cli as tune_cli
from solver.evaluate import evaluate
from solver.params import SolveParams
from solver.solve import solve

DISHES = ["apple_pie", "bibimbap", "churros", "donuts", "edamame"]
LONG = " ".join(["a photo of the big red cat and the small blue dog"] * 6)


def _photo(path: Path, kind: int, rng: np.random.Generator) -> None:
    """Landscape, portrait, grayscale, CMYK, or a PNG under a .jpg name."""
    size = [(96, 64), (48, 80), (64, 64), (72, 48), (50, 70)][kind % 5]
    pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind % 5 == 2:
        image.convert("L").save(path, format="JPEG")
    elif kind % 5 == 3:
        image.convert("CMYK").save(path, format="JPEG")
    elif kind % 5 == 4:
        image.save(path, format="PNG")
    else:
        image.save(path, format="JPEG", quality=85)


def make_food101_photos(root: Path) -> Path:
    """images/{train,test}/<dish>/<dish>_<k>.jpg + texts/{train,test}_titles.csv;
    the last dish has one training photo fewer (the one dropped)."""
    rng = np.random.default_rng(0)
    (root / "texts").mkdir(parents=True)
    for split, n in (("train", 5), ("test", 2)):
        with (root / "texts" / f"{split}_titles.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["image_name", "text", "class_name"])
            for c, dish in enumerate(DISHES):
                for k in range(n - (split == "train" and c == len(DISHES) - 1)):
                    name = f"{dish}_{k}.jpg"
                    _photo(root / "images" / split / dish / name, c + k, rng)
                    title = [f"{dish} crème brûlée à la maison № {k}", LONG][k % 2]
                    w.writerow([name, title, dish])
    return root


def test_hub_checkpoint_and_photos_run_end_to_end(tmp_path, capfd, caplog):
    vilt = make_hub_vilt(tmp_path / "vilt-b32-mlm")
    root = make_food101_photos(tmp_path / "raw")
    params = {
        "data": {"dataset": "food101", "root": str(root), "tasks": 2,
                 "missing_type": "both", "missing_rate": 0.5},
        "model": {"backbone": str(vilt), "max_text_len": 40},
        "prompt": dict(PROMPT),
        "tune": {"epochs": 1, "batch_size": 4, "lr": 1e-3, "device": "cpu"},
        "extract": {"batch_size": 3, "device": "cpu"},
    }  # fmt: skip
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    d = tmp_path / "data"
    runner = CliRunner()
    with caplog.at_level("INFO"):
        for cli, args in (
            (prepare_cli, ["--out", d / "prepare"]),
            (tune_cli, ["--prepare", d / "prepare", "--out", d / "tune",
                        "--timings", tmp_path / "t.jsonl"]),
            (extract_cli, ["--prepare", d / "prepare", "--tune", d / "tune",
                           "--out", d / "extract"]),
        ):  # fmt: skip
            r = runner.invoke(cli, ["--params", str(path), *map(str, args)])
            assert r.exit_code == 0, r.output
    loads = [m for m in caplog.messages if m.startswith("loaded ViLT")]
    n = len(load_backbone(str(vilt), 40).vilt.state_dict())
    line = (
        f"loaded ViLT {vilt}: 2 layers, hidden 32, {n} tensors; ignored mlm_score "
        "(6 tensors); randomly initialised nothing"
    )
    assert loads == [line, line]  # one line per load (tune, extract), no table
    assert "LOAD REPORT" not in capfd.readouterr().err
    tasks = json.loads((d / "prepare" / "tasks.json").read_text())
    assert tasks["class_order"] and "edamame" not in tasks["class_order"]
    (weights,) = solve(d / "extract", d / "solve", SolveParams(width=64, device="cpu"))
    (metrics,) = evaluate(d / "extract", [weights], tmp_path / "results")
    m = json.loads(metrics.read_text())
    assert len(m["matrix"]) == 2 and 0.0 <= m["acc"] <= 100.0


def test_processor_of_the_hub_layout_keeps_the_aspect_ratio(tmp_path):
    vilt = load_backbone(str(make_hub_vilt(tmp_path / "vilt")), 40)
    ip = vilt.processor.image_processor
    out = ip(images=Image.new("RGB", (96, 64)), return_tensors="np", do_pad=False)
    assert out["pixel_values"].shape[2:] == (32, 48)  # shorter side 32, ÷ 8
    ids = vilt.processor.tokenizer(LONG, truncation=True, max_length=40)["input_ids"]
    assert len(ids) == 40  # a title longer than 40 tokens is cut


def test_hub_id_resolves_offline_from_the_hf_cache(tmp_path):
    cache = tmp_path / "hub"
    snapshot = cache / "models--dandelin--vilt-b32-mlm" / "snapshots" / "0123abcd"
    make_hub_vilt(snapshot)
    (cache / "models--dandelin--vilt-b32-mlm" / "refs").mkdir()
    (cache / "models--dandelin--vilt-b32-mlm" / "refs" / "main").write_text("0123abcd")
    code = (
        "from pipeline.model.backbone import backbone_folder, load_backbone; "
        "b = load_backbone('dandelin/vilt-b32-mlm', 40); "
        "print(b.hidden_size, backbone_folder('dandelin/vilt-b32-mlm'))"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["32", str(snapshot)]
    assert backbone_folder(str(snapshot)) == snapshot
