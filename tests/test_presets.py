"""The dataset presets in configs/ load strictly and carry the paper's settings."""

from pathlib import Path

import pytest
import yaml

from palcore.params import load_section
from pipeline.params import SECTIONS, load
from solver.params import SolveParams

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name, dataset, tasks",
    [("food101", "food101", 10), ("n24news", "n24news", 6), ("mmimdb", "mmimdb", 5)],
)
def test_preset_loads_with_paper_settings(name: str, dataset: str, tasks: int) -> None:
    path = ROOT / "configs" / f"{name}.yaml"
    sections = {s: load(path, s) for s in SECTIONS}
    solve = load_section(path, "solve", SolveParams)
    data, prompt, tune = sections["data"], sections["prompt"], sections["tune"]
    assert (data.dataset, data.tasks) == (dataset, tasks)
    assert (data.missing_type, data.missing_rate) == ("both", 0.7)
    assert sections["model"].backbone == "models/vilt-b32-mlm"
    assert (prompt.pool_size, prompt.length, prompt.layers) == (128, 8, tuple(range(8)))
    assert (tune.lr, tune.batch_size, tune.recon_weight) == (1e-4, 4, 0.01)
    assert (solve.width, solve.eta, solve.method) == (15000, 1.0, "gram")


def test_the_mmimdb_preset_follows_rebqs_protocol() -> None:
    """20 genres in 5 tasks of 4, text up to 1024 tokens (RebQ's MM-IMDb
    config), F1 at 0.5, and a solve the multi-label shards take: a fixed η
    and no heads (`pal check` names either otherwise)."""
    from solver.params import EvaluateParams

    path = ROOT / "configs" / "mmimdb.yaml"
    data, model = load(path, "data"), load(path, "model")
    assert (data.dataset, data.tasks, data.label_count) == ("mmimdb", 5, 20)
    assert model.max_text_len == 1024
    assert load_section(path, "evaluate", EvaluateParams).threshold == 0.5
    solve = load_section(path, "solve", SolveParams)
    assert (solve.is_auto, solve.heads) == (False, ())


@pytest.fixture(scope="module")
def photos(tmp_path_factory, tiny_vilt):
    """A 12-layer tiny ViLT of hidden size 128 (the presets' prompt layers
    reach layer 7, PAL's pools hold 128 orthogonal keys) and a
    prepare folder whose photos have mixed sizes, as Food101's do: padded
    batches with per-sample patch counts."""
    import numpy as np
    from helpers import make_prepare, make_vilt
    from PIL import Image

    from pipeline.data.samples import read_prepare
    from pipeline.model.backbone import load_backbone

    folder = tmp_path_factory.mktemp("photos")
    prepare = make_prepare(folder)
    shapes = [(32, 32), (32, 48), (48, 32), (40, 56)]
    for i, path in enumerate(sorted((folder / "dataset/images").glob("*.png"))):
        pix = np.asarray(Image.open(path).convert("RGB"))
        h, w = shapes[i % len(shapes)]
        Image.fromarray(np.resize(pix, (h, w, 3))).save(path)
    vilt = make_vilt(folder / "vilt", hidden=128, layers=12)
    return load_backbone(str(vilt), 12), *read_prepare(prepare)


def _preset_variants() -> list[tuple[str, str]]:
    """(preset, variant) of PAL and each baseline, once per distinct setting
    (the two presets share most rows)."""
    from palcore.params import Source

    rows, seen = [], set()
    for name in ("food101", "n24news"):
        path = ROOT / "configs" / f"{name}.yaml"
        params = yaml.safe_load(path.read_text())
        for v in ["pal", *params["pipelines"]["baselines"]]:
            src = Source(path, 0, v)
            setting = (load(src, "prompt"), load(src, "tune").recon_weight)
            if setting not in seen:
                seen.add(setting)
                rows.append((name, v))
    return rows


@pytest.mark.parametrize("preset, variant", _preset_variants())
def test_each_method_of_a_preset_trains_and_extracts_on_mixed_size_photos(
    photos, preset, variant
):
    # the presets' prompt settings (six accumulating input layers for MAP and
    # MSP, L2P's pool, DualPrompt's G- and E-layers) on padded photo batches:
    # one training step gives a finite loss and gradients, extraction one
    # embedding per sample (MSP's tune once failed on exactly this)
    import torch

    from palcore.params import Source
    from pipeline.data.loader import SampleDataset, make_loader
    from pipeline.data.samples import select
    from pipeline.methods import build_model
    from pipeline.model.losses import loss
    from pipeline.model.network import build_cache

    backbone, samples, tasks = photos
    src = Source(ROOT / "configs" / f"{preset}.yaml", 0, variant)
    prompt, tune = load(src, "prompt"), load(src, "tune")
    model = build_model(backbone, prompt, tasks.classes_per_task)
    model.add_task(torch.Generator().manual_seed(0))
    train = select(samples, "train", [1])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    batches = list(make_loader(ds, 8, copies=True))
    sizes = {tuple(s.tolist()) for b in batches for s in b.image_sizes}
    assert len(sizes) > 1, "the batches must hold photos of several sizes"
    cache = build_cache(model, make_loader(ds, 8, copies=True), len(ds))
    value, _ = loss(model, batches[0], cache, 1, tune.recon_weight)
    value.backward()
    assert torch.isfinite(value)
    grads = [p.grad for p in model.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    with torch.no_grad():
        x, logits = model.features(batches[0])
    assert x.shape == (batches[0].n, 128)
    assert logits.shape == (batches[0].n, tasks.classes_per_task[0])
