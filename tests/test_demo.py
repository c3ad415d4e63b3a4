"""`pal demo`: class design, images, captions, the saved tiny ViLT, determinism."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.fakes import demo_data as demo_data
from pipeline.params import DemoParams
from pipeline.stages import demo

SMALL = {
    "seed": 0,
    "n_classes": 4,
    "train_per_class": 3,
    "val_per_class": 1,
    "test_per_class": 2,
    "image_size": 32,
    "patch_size": 16,
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "pretrain_steps": 3,
    "pretrain_batch": 8,
}


def run_demo(tmp_path: Path, out: Path, **overrides):
    params = tmp_path / f"params-{out.name}.yaml"
    params.write_text(yaml.safe_dump({"demo": {**SMALL, **overrides}}))
    return CliRunner().invoke(
        main, ["demo", "--params", str(params), "--out", str(out)]
    )


def digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("demo")
    r = run_demo(tmp, tmp / "out")
    assert r.exit_code == 0, r.output
    return tmp / "out"


@pytest.mark.parametrize("n", [4, 5, 7, 20, 32])
def test_each_modality_alone_is_ambiguous_the_pair_is_not(n):
    classes = demo_data.demo_classes(n)
    looks = Counter(c.look for c in classes)
    flavours = Counter(c.flavour for c in classes)
    assert len({(c.look, c.flavour) for c in classes}) == n  # pairs identify classes
    assert len({c.name for c in classes}) == n
    assert max(looks.values()) == 2 and max(flavours.values()) == 2
    # every class shares its look or its flavour with another class
    shared = [looks[c.look] == 2 or flavours[c.flavour] == 2 for c in classes]
    assert all(shared)
    if n % 2 == 0:  # chained: every look and every flavour serves two classes
        assert set(looks.values()) == {2} and set(flavours.values()) == {2}


def test_pretrain_pairs_are_disjoint_from_demo_classes():
    classes = demo_data.demo_classes(20)
    pairs = demo_data.pretrain_pairs(20)
    assert not {(c.look, c.flavour) for c in classes} & set(pairs)
    assert len(pairs) == 90 * 16 - 20
    assert len(set(demo_data.all_looks())) == 90


def test_render_image_is_seeded():
    look = demo_data.look_of(3)
    a = demo_data.render_image(look, 48, np.random.default_rng(7), 0.05)
    b = demo_data.render_image(look, 48, np.random.default_rng(7), 0.05)
    c = demo_data.render_image(look, 48, np.random.default_rng(8), 0.05)
    assert a.shape == (48, 48, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_caption_holds_the_flavour_word_among_fillers():
    rng = np.random.default_rng(0)
    caps = [demo_data.make_caption(4, rng, noise=0.0) for _ in range(50)]
    vocab = set(demo_data.vocabulary())
    for cap in caps:
        words = cap.split()
        assert sum(w in demo_data.FLAVOURS[4] for w in words) == 1
        assert set(words) <= vocab
    noisy = [demo_data.make_caption(4, rng, noise=1.0) for _ in range(20)]
    assert not any(w in demo_data.FLAVOURS[4] for cap in noisy for w in cap.split())


def test_dataset_files(small_demo):
    manifest = json.loads((small_demo / "dataset" / "captions.json").read_text())
    assert manifest["format"] == "pal-demo"
    assert [c["name"] for c in manifest["classes"]] == [
        c.name for c in demo_data.demo_classes(4)
    ]
    samples = manifest["samples"]
    assert len(samples) == 4 * (3 + 1 + 2)
    assert Counter(s["split"] for s in samples) == {"train": 12, "val": 4, "test": 8}
    assert len({s["id"] for s in samples}) == len(samples)
    pngs = sorted((small_demo / "dataset" / "images").rglob("*.png"))
    assert len(pngs) == len(samples)
    from PIL import Image

    with Image.open(small_demo / "dataset" / samples[0]["image"]) as im:
        assert (im.format, im.mode, im.size) == ("PNG", "RGB", (32, 32))


def test_backbone_loads_offline_and_runs(small_demo):
    import torch
    from PIL import Image
    from transformers import ViltModel, ViltProcessor

    model = ViltModel.from_pretrained(small_demo / "vilt").eval()
    processor = ViltProcessor.from_pretrained(small_demo / "vilt")
    assert type(processor.image_processor).__name__ == "ViltImageProcessorPil"
    assert model.config.hidden_size == 32 and model.config.max_position_embeddings == 40
    manifest = json.loads((small_demo / "dataset" / "captions.json").read_text())
    rows = manifest["samples"][:3]
    images = [
        Image.open(small_demo / "dataset" / r["image"]).convert("RGB") for r in rows
    ]
    enc = processor(
        images=images,
        text=[r["text"] for r in rows],
        padding="max_length",
        max_length=40,
        return_tensors="pt",
    )
    unk = processor.tokenizer.convert_tokens_to_ids("[UNK]")
    assert not (enc["input_ids"] == unk).any()  # the vocabulary covers the captions
    with torch.inference_mode():
        out = model(**enc).last_hidden_state
    assert out.shape == (3, 40 + 1 + 4, 32)  # text, image CLS, (32/16)^2 patches
    assert torch.isfinite(out).all()


def test_same_seed_same_bytes_other_seed_other_files(tmp_path, small_demo):
    r = run_demo(tmp_path, tmp_path / "again")
    assert r.exit_code == 0, r.output
    assert digest(tmp_path / "again") == digest(small_demo)
    r = run_demo(tmp_path, tmp_path / "seed1", seed=1)
    assert r.exit_code == 0, r.output
    a, b = digest(small_demo), digest(tmp_path / "seed1")
    for f in ("dataset/captions.json", "vilt/model.safetensors"):
        assert a[f] != b[f]
    assert a["vilt/vocab.txt"] == b["vilt/vocab.txt"]


def test_prepare_reads_the_demo(tmp_path, small_demo):
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "dataset": "demo",
                    "root": str(small_demo / "dataset"),
                    "tasks": 2,
                    "missing_type": "both",
                    "missing_rate": 0.5,
                }
            }
        )
    )
    r = CliRunner().invoke(
        main, ["prepare", "--params", str(params), "--out", str(tmp_path / "prep")]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "prep" / "tasks.json").read_text())
    assert [t["labels"] for t in doc["tasks"]] == [[0, 1], [2, 3]]
    assert doc["tasks"][0]["counts"]["train"] == {"total": 6, "by_missing": [3, 2, 1]}
    assert doc["absent"]["image"]["count"] == 0


def test_failed_run_keeps_the_earlier_demo(tmp_path, small_demo, monkeypatch):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(small_demo, out)
    before = digest(out)

    def boom(params, folder):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(demo, "write_backbone", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        demo.make_demo(DemoParams(**SMALL), out)
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left


def test_bad_demo_params(tmp_path):
    out = tmp_path / "out"
    r = run_demo(tmp_path, out, n_classes=40)
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert (
        r.output.strip()
        .splitlines()[-1]
        .endswith("demo.n_classes must lie in [4, 32], got 40")
    )
    r = run_demo(tmp_path, out, image_size=30)
    assert "demo.image_size must be a multiple of demo.patch_size (16)" in r.output
    assert not out.exists()


# The designs of a gap (demo.variants, demo.colour_free, demo.side_dish)


def test_variants_differ_only_in_texture_and_cooking_word():
    classes = demo_data.demo_classes(20, variants=2)
    assert len({c.name for c in classes}) == 20
    visible = demo_data.demo_classes(10)
    for c in classes:
        base = visible[c.index // 2]
        k = c.index % 2
        assert (c.look.shape, c.look.colour, c.flavour) == (
            base.look.shape,
            base.look.colour,
            base.flavour,
        )
        assert (c.look.texture, c.cooking) == (k, k)
    assert classes[3].name == "sweet_grilled_striped_red_circle"
    three = demo_data.demo_classes(12, variants=3)
    assert [c.cooking for c in three[:3]] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"n_classes must lie in \[12, 32\], got 8"):
        demo_data.demo_classes(8, variants=3)


def test_colour_free_looks_are_shape_and_texture():
    classes = demo_data.demo_classes(20, colour_free=True)
    looks = {(c.look.shape, c.look.texture) for c in classes}
    assert len(looks) == 10 and {c.look.colour for c in classes} == {0}
    pairs = set(demo_data.pretrain_pairs(20, colour_free=True))
    for c in classes:  # no pre-training pair is a demo class in any colour
        for colour in range(len(demo_data.COLOURS)):
            look = demo_data.Look(c.look.shape, colour, c.look.texture)
            assert (look, c.flavour) not in pairs
    assert len(pairs) == 90 * 16 - 20 * 6


def test_caption_with_a_cooking_word():
    rng = np.random.default_rng(0)
    vocab = set(demo_data.vocabulary(cooking=True))
    assert set(demo_data.COOKING) <= vocab
    assert not set(demo_data.COOKING) & set(demo_data.vocabulary())
    for _ in range(30):
        words = demo_data.make_caption(2, rng, 0.0, cooking=1).split()
        assert words.count("grilled") == 1 and set(words) <= vocab
        assert not {"steamed", "fried"} & set(words)


def test_side_dish_adds_a_second_object_behind_the_first():
    look = demo_data.look_of(0)  # a solid red circle
    side = demo_data.Look(0, list(demo_data.COLOURS).index("purple"), 0)
    alone = demo_data.render_image(look, 64, np.random.default_rng(3), 0.0)
    both = demo_data.render_image(look, 64, np.random.default_rng(3), 0.0, side)
    purple = np.array(demo_data.COLOURS["purple"], dtype=float)

    def near(img, rgb):  # pixels within the shade jitter of an unshaded colour
        return int((np.abs(img.astype(float) - rgb).max(-1) <= 30).sum())

    assert near(alone, purple) == 0 and near(both, purple) > 40
    assert not np.array_equal(alone, both)


@pytest.mark.parametrize(
    ("design", "n_classes", "keys"),
    [
        ({"variants": 2}, 8, {"cooking"}),
        ({"colour_free": True}, 4, set()),
        ({"side_dish": True}, 4, set()),
    ],
)
def test_each_design_writes_a_seeded_demo(tmp_path, design, n_classes, keys):
    a = run_demo(tmp_path, tmp_path / "a", n_classes=n_classes, **design)
    b = run_demo(tmp_path, tmp_path / "b", n_classes=n_classes, **design)
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    manifest = json.loads((tmp_path / "a" / "dataset" / "captions.json").read_text())
    entry = manifest["classes"][0]
    assert set(entry) == {"name", "shape", "colour", "texture", "flavour"} | keys
    if design.get("colour_free"):
        assert {c["colour"] for c in manifest["classes"]} == {"any"}
    vocab = (tmp_path / "a" / "vilt" / "vocab.txt").read_text().split()
    assert ("grilled" in vocab) == ("cooking" in keys)


def test_a_design_combination_that_cannot_work_is_refused(tmp_path):
    r = run_demo(tmp_path, tmp_path / "c", n_classes=8, variants=2, colour_free=True)
    assert r.exit_code != 0
    assert r.output.strip().splitlines() == [
        f"Error: {tmp_path / 'params-c.yaml'}: demo.colour_free cannot be combined "
        "with demo.variants > 1 (both take over texture)"
    ]
    r = run_demo(tmp_path, tmp_path / "d", n_classes=10, variants=3)
    assert r.exit_code != 0
    assert r.output.strip().splitlines() == [
        f"Error: {tmp_path / 'params-d.yaml'}: demo.n_classes must be a multiple "
        "of demo.variants (3) and at least 12, got 10"
    ]
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()
