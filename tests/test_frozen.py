"""`pal frozen`: the stored frozen queries equal the frozen pass of each state,
tune and extract read them in its place, the frozen variant's features are
its q_t, and a missing or damaged file is one line naming it.

Tolerance: the stored pass and a sample's own pass run HF's ViLT embedding
in other batches, so the patch order (drawn from torch's RNG) and the padding
differ. Attention is blind to the order of the key tokens and padded keys are
masked, so the two agree up to float32 summation order: ATOL 1e-5 on
LayerNorm outputs of magnitude ~1 (about 100 ulp; measured: 7e-7 on the pairs,
1e-7 on the tuned checkpoints, 2e-7 on the extracted features).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from helpers import make_model, write_params
from test_readers import make_food101_split_json

from palcore.codes import Missing
from palcore.errors import PalError
from pipeline import params as pparams
from pipeline.cli import main
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import checkpoint_path, load_checkpoint
from pipeline.model.queries import (
    FrozenQueries,
    batch_queries,
    queries_path,
    write_queries,
)
from pipeline.model.train import _query_cache
from pipeline.stages.extract import extract
from pipeline.stages.frozen import frozen_pairs
from pipeline.stages.tune import tune
from solver.shard_readers import open_features

ATOL = 1e-5
BACKBONE = {"max_text_len": 12}


def _backbone(vilt):
    return load_backbone(str(vilt), BACKBONE["max_text_len"]).place(torch.device("cpu"))


def _store(vilt, samples, root, folder):
    """queries.h5 of `samples` (all naturally complete) in `folder`."""
    natural = [dataclasses.replace(s, missing=Missing.COMPLETE) for s in samples]
    natural = sorted(natural, key=lambda s: s.id)
    pairs = frozen_pairs(_backbone(vilt), natural, root)
    attrs = {"backbone": str(vilt), **BACKBONE}
    write_queries(queries_path(folder), [s.id for s in natural], pairs, attrs)
    return folder


@pytest.fixture(scope="module")
def stored(tiny_vilt, tiny_prepare, tmp_path_factory):
    """(folder, samples, tasks) of the tiny prepare folder's stored queries."""
    samples, tasks = read_prepare(tiny_prepare)
    folder = _store(tiny_vilt, samples, tasks.root, tmp_path_factory.mktemp("fz"))
    return folder, samples, tasks


def _own_pass(backbone, sample, root):
    """(q_t, q_v) (D,) of one sample alone in a batch, in its state."""
    dataset = SampleDataset(
        [sample], root, backbone.processor, backbone.max_text_len,
        backbone.image_side, uint8=True,
    )  # fmt: skip
    (batch,) = list(make_loader(dataset, 1))
    with torch.inference_mode():
        q_t, q_v = batch_queries(backbone, batch)
    return torch.stack([q_t[0], q_v[0]]).numpy()


def test_stored_pairs_equal_each_samples_own_pass_in_each_state(stored, tiny_vilt):
    folder, samples, tasks = stored
    backbone = _backbone(tiny_vilt)
    file = FrozenQueries.open(queries_path(folder), str(tiny_vilt), 12, 32)
    assert file.pairs.shape == (len(samples), 3, 2, 32)
    assert file.pairs.dtype == np.float32 and not np.isnan(file.pairs).any()
    worst = 0.0
    for s in samples[::7]:
        for state in Missing:
            mine = _own_pass(
                backbone, dataclasses.replace(s, missing=state), tasks.root
            )
            stored_pair = file.pairs[file.row[s.id], state]
            assert np.allclose(stored_pair, mine, rtol=0, atol=ATOL), (s.id, state)
            worst = max(worst, float(np.abs(stored_pair - mine).max()))
    assert 0 < worst < ATOL  # other batches: the order of summation differs
    states = [dataclasses.replace(samples[0], missing=m) for m in Missing]
    q = file.queries(states)  # each state picks its own pair
    assert np.array_equal(q, file.pairs[file.row[samples[0].id]])


def test_the_gathered_cache_equals_the_frozen_pass_of_tune(stored, tiny_vilt):
    folder, samples, tasks = stored
    backbone = _backbone(tiny_vilt)
    file = FrozenQueries.open(queries_path(folder), str(tiny_vilt), 12, 32)
    model = make_model(backbone, tasks)
    train = select(samples, "train", [1])
    assert {s.missing for s in train} == {0, 1, 2}
    dataset = SampleDataset(
        train, tasks.root, backbone.processor, 12, backbone.image_side, uint8=True
    )
    with torch.inference_mode():
        built = _query_cache(model, dataset, 1, copies=True, num_workers=0)
    gathered = file.cache(train, torch.device("cpu"))
    assert gathered.q.shape == built.q.shape == (len(train), 2, 32)
    assert torch.allclose(gathered.q, built.q, rtol=0, atol=ATOL)
    assert torch.allclose(gathered.copies, built.copies, rtol=0, atol=ATOL)
    complete = torch.tensor([s.missing == 0 for s in train])
    assert (gathered.copies[~complete] == 0).all()


@pytest.fixture(scope="module")
def tuned_with_file(stored, tiny_vilt, tiny_prepare, tmp_path_factory):
    """The tune folder of the `tuned` fixture's run, with the stored queries."""
    work = tmp_path_factory.mktemp("tunefz")
    params = write_params(work / "params.yaml", tiny_vilt)
    load = pparams.load
    tune(tiny_prepare, work / "tune", load(params, "model"), load(params, "prompt"),
         load(params, "tune"), frozen_dir=stored[0])  # fmt: skip
    return work / "tune"


def test_tune_and_extract_with_the_file_match_without_it(
    tuned, tuned_with_file, stored, tmp_path
):
    """Checkpoints and features within float noise of a run without the file
    (the same seeds; only the queries' summation order differs)."""
    params, prepare, tune_dir = tuned
    tune_fz = tuned_with_file
    for k in (1, 2, 3):
        a = load_checkpoint(checkpoint_path(tune_dir, k))["state"]
        b = load_checkpoint(checkpoint_path(tune_fz, k))["state"]
        assert a.keys() == b.keys()
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=0, atol=ATOL), (k, key)
    ext = pparams.load(params, "extract")
    extract(prepare, tune_dir, tmp_path / "without", ext)
    extract(prepare, tune_dir, tmp_path / "with", ext, frozen_dir=stored[0])
    for s_without, s_with in zip(
        open_features(tmp_path / "without"), open_features(tmp_path / "with"),
        strict=True,
    ):  # fmt: skip
        x0, *_ = s_without.train.read_all()
        x1, *_ = s_with.train.read_all()
        assert x0.shape == x1.shape and np.allclose(x0, x1, rtol=0, atol=ATOL)


def test_the_frozen_variants_features_are_the_stored_q_t_without_images(
    stored, tiny_vilt, tiny_prepare, tmp_path, monkeypatch
):
    folder, samples, _ = stored
    prepare = tiny_prepare
    params = write_params(tmp_path / "params.yaml", tiny_vilt,
                          prompt={"enabled": False}, tune={"epochs": 1})  # fmt: skip
    load = pparams.load

    def no_image(self, path):
        raise AssertionError(f"decoded {path}")

    monkeypatch.setattr(SampleDataset, "_image", no_image)
    tune(prepare, tmp_path / "tune", load(params, "model"), load(params, "prompt"),
         load(params, "tune"), frozen_dir=folder)  # fmt: skip
    extract(prepare, tmp_path / "tune", tmp_path / "ext", load(params, "extract"),
            frozen_dir=folder)  # fmt: skip
    file = FrozenQueries.open(queries_path(folder), str(tiny_vilt), 12, 32)
    for step in open_features(tmp_path / "ext"):
        x, *_ = step.train.read_all()
        train = select(samples, "train", [step.step])
        assert np.array_equal(x, file.queries(train)[:, 0])
        for task, block in step.test.items():
            xt, *_ = block.read_all()
            assert np.array_equal(
                xt, file.queries(select(samples, "test", [task]))[:, 0]
            )


def test_a_missing_or_damaged_file_is_one_line_naming_it(
    stored, tiny_vilt, tiny_prepare, tmp_path
):
    folder = stored[0]
    path = queries_path(tmp_path)
    with pytest.raises(PalError, match=f"^{path}: not found \\(run `pal frozen`\\)$"):
        FrozenQueries.open(path, str(tiny_vilt), 12, 32)
    whole = queries_path(folder).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(PalError, match=f"^{path}: not a readable frozen-queries file"):
        FrozenQueries.open(path, str(tiny_vilt), 12, 32)
    with pytest.raises(
        PalError, match="made with model.backbone .* rerun `pal frozen`"
    ):
        FrozenQueries.open(queries_path(folder), str(tiny_vilt), 16, 32)
    params, prepare = tmp_path / "p.yaml", tiny_prepare
    write_params(params, tiny_vilt)
    r = CliRunner().invoke(main, ["tune", "--params", str(params), "--prepare",
                                  str(prepare), "--out", str(tmp_path / "t"),
                                  "--frozen", str(tmp_path)])  # fmt: skip
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1] == (
        f"Error: {path}: not a readable frozen-queries file ({_h5_reason(path)}); "
        "rerun `pal frozen`"
    )  # after the backbone's log line


def _h5_reason(path):
    import h5py

    try:
        h5py.File(path, "r")
    except OSError as exc:
        return str(exc).splitlines()[0]
    raise AssertionError("the truncated file opened")


def test_a_state_the_sample_cannot_take_is_refused(stored, tiny_vilt, tmp_path):
    """A sample stored with its image naturally absent has only its
    image-missing pair; asking its complete pair names it."""
    folder, samples, tasks = stored
    s = dataclasses.replace(samples[0], image=None, missing=Missing.IMAGE)
    pairs = frozen_pairs(_backbone(tiny_vilt), [s], tasks.root)
    assert np.isnan(pairs[0, :2]).all() and not np.isnan(pairs[0, 2]).any()
    write_queries(queries_path(tmp_path), [s.id], pairs,
                  {"backbone": str(tiny_vilt), **BACKBONE})  # fmt: skip
    file = FrozenQueries.open(queries_path(tmp_path), str(tiny_vilt), 12, 32)
    assert np.array_equal(file.queries([s]), pairs[:, 2])
    with pytest.raises(PalError, match=f"sample '{s.id}' has no complete pair"):
        file.queries([dataclasses.replace(s, missing=Missing.COMPLETE)])
    with pytest.raises(PalError, match="holds no sample 'nope'"):
        file.queries([dataclasses.replace(s, id="nope")])


def test_the_stage_lists_the_dataset_and_writes_the_same_bytes_twice(
    tiny_vilt, tmp_path
):
    """`pal frozen` on a Food101 tree with one image file gone and one text
    empty: every listed sample once, those two in their one state; the
    missing tables and class order are not read (they may be anything);
    same params, same bytes."""
    root = make_food101_split_json(tmp_path / "food", no_text=("dish_000_0.jpg",))
    (root / "images" / "train" / "dish_001" / "dish_001_3.jpg").unlink()
    params = tmp_path / "params.yaml"
    data = {"dataset": "food101", "root": str(root), "per_class": 1,
            "missing_rate": "not read", "class_order_seed": "not read"}  # fmt: skip
    params.write_text(yaml.safe_dump({
        "data": data, "model": {"backbone": str(tiny_vilt), **BACKBONE},
        "extract": {"device": "cpu"},
    }))  # fmt: skip
    digests = []
    for out in ("a", "b"):
        r = CliRunner().invoke(main, ["frozen", "--params", str(params),
                                      "--out", str(tmp_path / out)])  # fmt: skip
        assert r.exit_code == 0, r.output
        digests.append(hashlib.sha256(queries_path(tmp_path / out).read_bytes()))
    assert digests[0].hexdigest() == digests[1].hexdigest()
    file = FrozenQueries.open(queries_path(tmp_path / "a"), str(tiny_vilt), 12, 32)
    assert len(file.row) == 100 * 3  # per_class 1: train, val, test of 100 classes
    assert list(file.row) == sorted(file.row)
    have = ~np.isnan(file.pairs[:, :, 0, 0])
    assert have[file.row["train/dish_000_0.jpg"]].tolist() == [False, True, False]
    assert have[file.row["val/dish_001_3.jpg"]].tolist() == [False, False, True]
    assert have.sum() == 3 * 300 - 4
