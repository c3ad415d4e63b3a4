"""`pal extract`: valid shards, determinism, resuming, parts, errors."""

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from palcore.errors import PalError
from pipeline import params as pparams
from pipeline.data.samples import read_prepare, select
from pipeline.model.checkpoint import checkpoint_path
from pipeline.stages.extract import cli, extract, parse_steps
from solver.shard_readers import open_features


def _digests(folder):
    return {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.h5"))
    }


@pytest.fixture(scope="module")
def extracted(tuned, tmp_path_factory):
    params, prepare, tune_dir = tuned
    out = tmp_path_factory.mktemp("extract") / "extract"
    extract(prepare, tune_dir, out, pparams.load(params, "extract"))
    return out


def test_shards_pass_the_solver_validator(extracted, tuned):
    _, prepare, tune_dir = tuned
    samples, tasks = read_prepare(prepare)
    steps = open_features(extracted)
    assert [s.step for s in steps] == [1, 2, 3]
    for s in steps:
        lo = sum(tasks.classes_per_task[: s.step - 1])
        assert s.classes_seen == lo + tasks.classes_per_task[s.step - 1]
        assert s.feature_dim == 32
        x, y, m, _ = s.train.read_all()
        train = select(samples, "train", [s.step])
        assert s.train.sample_ids() == [t.id for t in train]
        assert y.tolist() == [t.label for t in train]
        assert m.tolist() == [t.missing for t in train]
        assert lo <= y.min() and y.max() < s.classes_seen
        assert sorted(s.test) == list(range(1, s.step + 1))
        for task, block in s.test.items():
            xt, yt, mt, bp = block.read_all(with_bp_logits=True)
            assert bp.shape == (len(yt), s.classes_seen) and np.isfinite(bp).all()
            assert set(yt.tolist()) <= set(range(*_range(tasks, task)))
        import h5py

        with h5py.File(s.train.files[0]) as f:
            ckpt = json.loads(f.attrs["params"])
            assert ckpt["prompt"]["enabled"] is True
            assert f.attrs["checkpoint_hash"] != ""
            assert f.attrs["backbone"] == ckpt["model"]["backbone"]
    assert checkpoint_path(tune_dir, 3).is_file()


def _range(tasks, task):
    lo = sum(tasks.classes_per_task[: task - 1])
    return lo, lo + tasks.classes_per_task[task - 1]


def test_same_checkpoint_same_bytes(extracted, tuned, tmp_path):
    params, prepare, tune_dir = tuned
    again = tmp_path / "again"
    extract(prepare, tune_dir, again, pparams.load(params, "extract"))
    assert _digests(again) == _digests(extracted)
    assert not (tmp_path / "again.partial").exists()
    stamps = {p: p.stat().st_mtime_ns for p in again.rglob("*.h5")}
    (again / "step_02" / "test.h5").unlink()
    extract(prepare, tune_dir, again, pparams.load(params, "extract"), steps="2")
    assert _digests(again) == _digests(extracted)
    first = again / "step_01" / "train.h5"  # --steps 2 leaves step 1 alone
    assert first.stat().st_mtime_ns == stamps[first]


def _extract_interrupted(monkeypatch, params, prepare, tune_dir, out, at):
    """An extract run that stops (KeyboardInterrupt) when it reaches step `at`."""
    import pipeline.stages.extract as extract_module

    real = extract_module.extract_step

    def interrupted(model, step, *args, **kwargs):
        if step == at:
            raise KeyboardInterrupt
        return real(model, step, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(extract_module, "extract_step", interrupted)
        with pytest.raises(KeyboardInterrupt):
            extract(prepare, tune_dir, out, pparams.load(params, "extract"))


def test_interrupted_run_resumes_to_the_same_bytes(
    extracted, tuned, tmp_path, monkeypatch, caplog
):
    params, prepare, tune_dir = tuned
    out = tmp_path / "extract"
    _extract_interrupted(monkeypatch, params, prepare, tune_dir, out, at=3)
    partial = tmp_path / "extract.partial"
    assert not out.exists()
    assert sorted(p.relative_to(partial).as_posix() for p in partial.rglob("*.h5")) == [
        "step_01/test.h5",
        "step_01/train.h5",
        "step_02/test.h5",
        "step_02/train.h5",
    ]
    with caplog.at_level("INFO", logger="pipeline.stages.extract"):
        extract(prepare, tune_dir, out, pparams.load(params, "extract"))
    assert (
        "reused steps 1,2 of an interrupted run with the same code, params and "
        f"inputs ({partial}; `pal extract --fresh` discards them)" in caplog.messages
    )
    assert _digests(out) == _digests(extracted)
    assert not partial.exists()


def test_a_rerun_keeps_the_steps_whose_own_samples_did_not_change(
    tuned, tmp_path, monkeypatch, caplog
):
    import shutil

    params, prepare, tune_dir = tuned
    out = tmp_path / "extract"
    _extract_interrupted(monkeypatch, params, prepare, tune_dir, out, at=3)
    # a test sample of task 2 changes: steps 2 and 3 hold it, step 1 does not
    edited = tmp_path / "prepare-edited"
    shutil.copytree(prepare, edited)
    lines = (edited / "samples.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        row = json.loads(line)
        if row["split"] == "test" and row["task"] == 2:
            lines[i] = json.dumps({**row, "text": "edited"})
            break
    (edited / "samples.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level("INFO"):
        extract(edited, tune_dir, out, pparams.load(params, "extract"))
    partial = tmp_path / "extract.partial"
    assert (
        f"{partial}: keeping steps 1-1; the inputs of step 2 on changed "
        "(--fresh discards all)" in caplog.messages
    )
    assert (
        "reused steps 1 of an interrupted run with the same code, params and "
        f"inputs ({partial}; `pal extract --fresh` discards them)" in caplog.messages
    )
    fresh = tmp_path / "fresh"
    extract(edited, tune_dir, fresh, pparams.load(params, "extract"))
    assert _digests(out) == _digests(fresh)


def test_steps_beyond_the_tasks_are_removed(extracted, tuned, tmp_path):
    params, prepare, tune_dir = tuned
    out = tmp_path / "extract"
    (out / "step_04").mkdir(parents=True)
    (out / "step_04" / "train.h5").write_bytes(b"from a run with 4 tasks")
    extract(prepare, tune_dir, out, pparams.load(params, "extract"))
    assert sorted(p.name for p in out.iterdir()) == [
        "contract.json",
        "step_01",
        "step_02",
        "step_03",
    ]


def test_batch_size_changes_only_float_noise(extracted, tuned, tmp_path):
    params, prepare, tune_dir = tuned
    other = pparams.ExtractParams(batch_size=3, device="cpu")
    extract(prepare, tune_dir, tmp_path / "x", other, steps=[3])
    a = open_features(extracted)[2].test[1].read_all()[0]
    b = open_step_3(tmp_path / "x").test[1].read_all()[0]
    assert np.abs(a - b).max() < 1e-5


def open_step_3(folder):
    from solver.shard_readers import open_step

    return open_step(folder / "step_03", 3)


def test_rank_parts_read_as_one_shard(extracted, tuned, tmp_path, monkeypatch):
    params, prepare, tune_dir = tuned
    out = tmp_path / "parts"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        extract(prepare, tune_dir, out, pparams.load(params, "extract"))
    assert sorted(p.name for p in (out / "step_02").iterdir()) == [
        "test-00000.h5",
        "test-00001.h5",
        "train-00000.h5",
        "train-00001.h5",
    ]
    parts, whole = open_features(out), open_features(extracted)
    for p, w in zip(parts, whole, strict=True):
        assert p.train.sample_ids() == w.train.sample_ids()
        assert np.abs(p.train.read_all()[0] - w.train.read_all()[0]).max() < 1e-5
        for task in p.test:
            assert p.test[task].sample_ids() == w.test[task].sample_ids()


def test_float16_features(tuned, tmp_path):
    params, prepare, tune_dir = tuned
    extract(
        prepare,
        tune_dir,
        tmp_path / "h",
        pparams.ExtractParams(dtype="float16", device="cpu"),
        steps=[1],
    )
    import h5py

    with h5py.File(tmp_path / "h" / "step_01" / "train.h5") as f:
        assert f["features"].dtype == np.float16


def test_parse_steps():
    assert parse_steps(None, 4) == [1, 2, 3, 4]
    assert parse_steps("1,3-4", 4) == [1, 3, 4]
    with pytest.raises(PalError, match=r"^--steps '5': steps must lie in 1\.\.4$"):
        parse_steps("5", 4)
    with pytest.raises(PalError, match=r"^--steps 'x': expected e\.g\. 2, 1,3 or 2-4$"):
        parse_steps("x", 4)


def _cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output.strip()


def test_checkpoint_errors_are_one_line(tuned, tmp_path):
    params, prepare, tune_dir = tuned
    import shutil

    tune2 = tmp_path / "tune"
    shutil.copytree(tune_dir, tune2)
    out = tmp_path / "out"
    checkpoint_path(tune2, 2).write_bytes(b"garbage")
    code, output = _cli(
        "--params", params, "--prepare", prepare, "--tune", tune2, "--out", out
    )
    assert code == 1 and output.startswith(
        f"Error: {tune2}/step_02.pt: not a readable tune checkpoint"
    )
    assert "\n" not in output
    checkpoint_path(tune2, 2).unlink()
    code, output = _cli(
        "--params",
        params,
        "--prepare",
        prepare,
        "--tune",
        tune2,
        "--out",
        out,
        "--steps",
        "2",
    )
    assert (code, output) == (
        1,
        f"Error: {tune2}/step_02.pt: tune checkpoint missing (run `pal tune`)",
    )
    # a prepare folder with another class order: the checkpoints do not fit it
    other = tmp_path / "prepare"
    shutil.copytree(prepare, other)
    doc = json.loads((other / "tasks.json").read_text())
    doc["class_order"] = doc["class_order"][::-1]
    (other / "tasks.json").write_text(json.dumps(doc))
    rows = [json.loads(line) for line in (other / "samples.jsonl").open()]
    for row in rows:  # each sample names its class as the new order does
        row["class_name"] = doc["class_order"][row["label"]]
    (other / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, output = _cli(
        "--params", params, "--prepare", other, "--tune", tune_dir, "--out", out
    )
    assert (code, output) == (
        1,
        f"Error: {tune_dir}/step_01.pt: checkpoint from other "
        "data (its class order or task split differs from "
        "tasks.json); rerun `pal tune`",
    )


def test_a_model_without_prompts_embeds_each_test_set_once(
    tiny_vilt, tiny_prepare, tmp_path, caplog
):
    """The frozen variant: a test sample's features are the same at every
    step, so step k embeds only task k's samples; the earlier tasks' features
    are step k-1's bytes, their BP logits come from step k's head."""
    import logging

    import h5py
    from helpers import write_params

    from pipeline.methods import model_from_checkpoint
    from pipeline.model.backbone import load_backbone
    from pipeline.model.checkpoint import load_checkpoint
    from pipeline.stages.tune import tune

    params = write_params(
        tmp_path / "p.yaml", tiny_vilt, prompt={"enabled": False}, tune={"epochs": 0}
    )
    load = pparams.load
    tune(tiny_prepare, tmp_path / "tune", load(params, "model"),
         load(params, "prompt"), load(params, "tune"))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="pipeline"):
        extract(
            tiny_prepare, tmp_path / "tune", tmp_path / "x", load(params, "extract")
        )
    samples, tasks = read_prepare(tiny_prepare)
    embedded = [
        int(r.getMessage().split()[2])
        for r in caplog.records
        if r.getMessage().startswith("step ") and " samples in " in r.getMessage()
    ]
    per_task = [
        len(select(samples, "train", [k])) + len(select(samples, "test", [k]))
        for k in (1, 2, 3)
    ]
    assert embedded == per_task  # each test set once, not 1 + 2 + 3 times
    shards = {
        k: h5py.File(tmp_path / "x" / f"step_{k:02d}" / "test.h5") for k in (1, 2, 3)
    }
    for task in (1, 2):
        first = shards[task][f"task_{task:02d}"]["features"][()]
        for later in range(task + 1, 4):
            g = shards[later][f"task_{task:02d}"]
            assert g["features"][()].tobytes() == first.tobytes()
            assert g["bp_logits"].shape == (len(first), 2 * later)
    ckpt = load_checkpoint(checkpoint_path(tmp_path / "tune", 3))
    model = model_from_checkpoint(ckpt, load_backbone(str(tiny_vilt), 12))
    import torch

    feats = shards[3]["task_01"]["features"][()]
    with torch.inference_mode():
        head = model.head(torch.from_numpy(feats)).float().numpy()
    assert np.array_equal(shards[3]["task_01"]["bp_logits"][()], head)
    assert len(open_features(tmp_path / "x")) == 3  # the solver reads them


def _cache(prepare, tiny_vilt, folder):
    """A pixel cache of the prepare folder's images (`pal pixels`' file)."""
    from pipeline.data.pixel_cache import FILE, write_cache
    from pipeline.model.backbone import load_backbone

    samples, tasks = read_prepare(prepare)
    backbone = load_backbone(str(tiny_vilt), 12)
    rels = [s.image for s in samples if s.image]
    write_cache(folder / FILE, tasks.root, rels,
                backbone.processor.image_processor, backbone.image_side)  # fmt: skip
    return folder


def test_one_loader_with_the_cache_starts_its_workers_once(
    extracted, tuned, tiny_vilt, tmp_path, monkeypatch
):
    """Two workers over three steps, images from the pixel cache: the loader's
    worker pool starts once for the stage (a loader per step started it three
    times), and the shards are the bytes of a run that decodes."""
    from torch.utils.data import dataloader

    params, prepare, tune_dir = tuned
    starts = []
    init = dataloader._MultiProcessingDataLoaderIter.__init__

    def counted(self, loader):
        starts.append(loader.num_workers)
        init(self, loader)

    monkeypatch.setattr(dataloader._MultiProcessingDataLoaderIter, "__init__", counted)
    ext = pparams.ExtractParams(batch_size=8, device="cpu", num_workers=2)
    pixels = _cache(prepare, tiny_vilt, tmp_path / "pixels")
    extract(prepare, tune_dir, tmp_path / "x", ext, pixels=pixels)
    assert starts == [2]
    assert _digests(tmp_path / "x") == _digests(extracted)


def test_one_loader_writes_what_a_loader_per_step_embeds(extracted, tuned):
    """Each step's features and BP logits, row for row, equal `embed_samples`
    of the step's samples with a loader of their own (the path before one
    loader served every step): the same batches under the same seeds."""
    from pipeline.methods import model_from_checkpoint
    from pipeline.model.backbone import load_backbone
    from pipeline.model.checkpoint import load_checkpoint
    from pipeline.model.embed import embed_samples
    from solver.shard_readers import open_step

    params, prepare, tune_dir = tuned
    ext = pparams.load(params, "extract")
    samples, tasks = read_prepare(prepare)
    m = load_checkpoint(checkpoint_path(tune_dir, 1))["params"]["model"]
    backbone = load_backbone(m["backbone"], m["max_text_len"])
    for step in (1, 2, 3):
        ckpt = load_checkpoint(checkpoint_path(tune_dir, step))
        model = model_from_checkpoint(ckpt, backbone)
        rows = select(samples, "train", [step]) + select(
            samples, "test", range(1, step + 1)
        )
        x, logits = embed_samples(model, rows, tasks.root, ext)
        shard = open_step(extracted / f"step_{step:02d}", step)
        got = [shard.train.read_all()[0]]
        bp = []
        for task in range(1, step + 1):
            feats, _, _, b = shard.test[task].read_all(with_bp_logits=True)
            got.append(feats)
            bp.append(b)
        n_train = len(select(samples, "train", [step]))
        assert np.concatenate(got).tobytes() == x.tobytes()
        assert np.concatenate(bp).tobytes() == logits[n_train:].tobytes()
