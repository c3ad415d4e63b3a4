"""Multi-label samples through tune and extract: BCE over the task's classes
(`losses.head_loss`) for every method, its static form equal to the eager
one (on the tiny prepare with labels added to some samples), and the
generated MM-IMDb tree through every stage to F1, mAP and the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from helpers import make_model, random_head, two_epochs, write_params

from palcore.outputs import step_dir_name, task_group_name
from palcore.params import ProtocolParams
from pipeline import params as pparams
from pipeline.cli import main
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import label_sets, read_prepare, select
from pipeline.fakes.trees import make_mmimdb_tree
from pipeline.model.backbone import load_backbone
from pipeline.model.device import autocast
from pipeline.model.losses import (
    dummy_segments,
    head_loss,
    static_inputs,
    static_loss,
)
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache
from pipeline.params import method_names
from pipeline.stages.extract import extract
from pipeline.stages.tune import tune
from solver.evaluate import evaluate
from solver.params import SolveParams
from solver.report import build, write_report
from solver.solve import solve

T = 12  # model.max_text_len of the fixtures


def with_labels(src: Path, dst: Path) -> Path:
    """The tiny prepare (3 tasks × 2 classes) copied with a `labels` key on
    every other sample: its label and the next class (the other of its task,
    or for a task's second class the next task's first, which lies beyond its
    task and is neither learnt nor scored with it)."""
    shutil.copytree(src, dst)
    lines = (dst / "samples.jsonl").read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        row = json.loads(line)
        if i % 2 == 0 and row["label"] < 5:
            row["labels"] = [row["label"], row["label"] + 1]
        out.append(json.dumps(row))
    (dst / "samples.jsonl").write_text("\n".join(out) + "\n")
    return dst


@pytest.fixture(scope="module")
def multi(tmp_path_factory, tiny_prepare) -> Path:
    return with_labels(tiny_prepare, tmp_path_factory.mktemp("ml") / "prepare")


def test_head_loss_is_bce_over_the_tasks_classes_in_closed_form():
    """Mean over rows and classes of softplus(x) − x·y, y the row's labels in
    [lo, lo + C); padding rows (not `valid`) count for nothing; hits: the
    argmax among the row's labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    sets = torch.tensor([[2, 3], [4, -1], [3, 7], [2, 4]])  # lo 2: classes 2, 3, 4
    y = torch.tensor([[1, 1, 0], [0, 0, 1], [0, 1, 0], [1, 0, 1]], dtype=torch.float64)
    want = (F.softplus(x) - x * y).mean()
    got, hits = head_loss(x, torch.zeros(4, dtype=torch.int64), sets, 2)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    argmax_in = y[torch.arange(4), x.argmax(1)] > 0
    assert hits.item() == int(argmax_in.sum())
    valid = torch.tensor([True, True, False, True])
    got_v, hits_v = head_loss(x, torch.zeros(4, dtype=torch.int64), sets, 2, valid)
    rows = (F.softplus(x) - x * y).mean(1)
    assert got_v.item() == pytest.approx(rows[valid].mean().item(), rel=1e-12)
    assert hits_v.item() == int((argmax_in & valid).sum())


# each method's prompt params on the tiny ViLT (2 layers, hidden 32), as
# tests/test_static_baselines.py sets them
PROMPTS = {
    "pal": {},
    "rebq": {"method": "rebq"},
    "map": {"method": "map", "length": 4, "layers": (0, 1)},
    "msp": {"method": "msp", "length": 4, "layers": (0, 1)},
    "l2p": dict(method="l2p", pool_size=4, length=4, top_n=2, layers=(0,)),
    "dualprompt": dict(
        method="dualprompt", g_layers=(0,), g_length=4, layers=(1,), length=4
    ),
}


def multi_setup(tiny_vilt, multi: Path, device: str, task: int, method: str):
    """(model, dataset, cache, dummy) of `method` on the multi-label prepare's
    task `task`, the head's rows random so the BCE's gradient reaches the
    prompts."""
    samples, tasks = read_prepare(multi)
    backbone = load_backbone(str(tiny_vilt), T).place(torch.device(device))
    model = make_model(backbone, tasks, steps=task, **PROMPTS[method])
    random_head(model)
    model.to(backbone.device)
    train = select(samples, "train", [task])
    sets = label_sets(train, tasks.label_width, tasks)
    ds = SampleDataset(
        train, tasks.root, backbone.processor, T, backbone.image_side, label_sets=sets
    )
    with autocast(backbone.device):
        cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    dummy = dummy_segments(backbone, ds.empty_ids, ds.empty_mask, ds.dummy_image())
    return model, ds, cache, dummy


@pytest.mark.gpu
def test_graphed_bce_steps_train_like_eager_steps(tiny_vilt, multi):
    """CUDA graphs replay PAL's BCE step on multi-label batches: over two
    epochs each batch's loss and the final parameters equal the eager
    steps' (the short last batch padded with rows of label set -1)."""
    task, results = 1, []
    for graphed in (False, True):
        torch.manual_seed(0)
        model, ds, cache, dummy = multi_setup(tiny_vilt, multi, "cuda", task, "pal")
        batches = list(make_loader(ds, 5, copies=False))
        assert [b.n for b in batches] == [5, 5, 2]  # the last padded to 5 rows
        params, losses, runner = two_epochs(
            model, cache, dummy, task, batches, 5, graphed
        )
        if graphed:
            assert runner.graphs and runner.eager_steps < len(losses)
        results.append((params, losses))
    (p_eager, l_eager), (p_graph, l_graph) = results
    assert l_graph == pytest.approx(l_eager, rel=1e-3, abs=1e-4)
    for a, b in zip(p_eager, p_graph, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)


def test_every_method_is_checked():
    assert sorted(PROMPTS) == sorted(method_names())


@pytest.mark.parametrize("method", sorted(PROMPTS))
def test_static_bce_equals_the_eager_bce_with_padding_rows(tiny_vilt, multi, method):
    """Each batch's loss parts and every gradient, eager (copies on the host)
    against static (copies spliced, 2 padding rows), on multi-label batches."""
    task = 1
    model, ds, cache, dummy = multi_setup(tiny_vilt, multi, "cpu", task, method)
    tasks = read_prepare(multi)[1]
    sets = ds.label_sets
    assert (sets[:, 1] >= 0).any() and (sets[:, 1] < 0).any()
    pairs = zip(
        make_loader(ds, 4, copies=True), make_loader(ds, 4, copies=False), strict=True
    )
    for b_dyn, b_st in pairs:
        assert b_st.label_sets.shape == (b_st.n, tasks.label_width)
        loss_d, parts_d = batch_loss(model, b_dyn, cache, task, 0.5)
        loss_d.backward()
        grads_d = {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }
        model.zero_grad(set_to_none=True)
        inputs = static_inputs(model, b_st, b_st.n + 2)
        assert (inputs["label_sets"][b_st.n :] == -1).all()
        loss_s, parts_s = static_loss(model, inputs, cache, dummy, task, 0.5)
        loss_s.backward()
        grads_s = {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }
        model.zero_grad(set_to_none=True)
        assert loss_s.item() == pytest.approx(loss_d.item(), rel=1e-5, abs=1e-6)
        for key in ("ce", "aux", "correct"):
            assert parts_s[key].item() == pytest.approx(
                parts_d[key].item(), rel=1e-5, abs=1e-6
            ), key
        assert grads_s.keys() == grads_d.keys() and grads_d
        for name, grad in grads_d.items():
            torch.testing.assert_close(grads_s[name], grad, rtol=1e-4, atol=1e-6)


def test_a_generated_mmimdb_tree_through_every_stage_to_f1_and_map(tiny_vilt, tmp_path):
    """The generated MM-IMDb tree at RebQ's missing setting (both at 70 %),
    on CPU settings: prepare places the films, tune learns by BCE, extract
    writes each block's multi-hot targets over the classes seen (a film's
    labels of its own task only), solve fits them, evaluate writes macro F1
    and mAP, and the report's table reads F1 with mAP's columns."""
    tree = make_mmimdb_tree(tmp_path / "mmimdb", train=60, val=10, test=40)
    params = write_params(tmp_path / "params.yaml", tiny_vilt)
    raw = yaml.safe_load(params.read_text())
    raw["data"] = {
        "dataset": "mmimdb",
        "root": str(tree),
        "tasks": 2,
        "label_count": 8,
        "missing_type": "both",
        "missing_rate": 0.7,
    }
    params.write_text(yaml.safe_dump(raw))
    prep = tmp_path / "prepare"
    r = CliRunner().invoke(
        main, ["prepare", "--params", str(params), "--out", str(prep)]
    )
    assert r.exit_code == 0, r.output
    samples, tasks = read_prepare(prep, tree)
    assert tasks.label_width > 1 and [tasks.end(k) for k in (1, 2)] == [4, 8]
    load = pparams.load
    tune(
        prep,
        tmp_path / "tune",
        load(params, "model"),
        load(params, "prompt"),
        load(params, "tune"),
        data_root=tree,
    )
    out = tmp_path / "extract"
    extract(prep, tmp_path / "tune", out, load(params, "extract"), data_root=tree)
    by_id = {s.id: s for s in samples}
    for step in (1, 2):
        with h5py.File(out / step_dir_name(step) / "test.h5", "r") as f:
            for task in range(1, step + 1):
                g = f[task_group_name(task)]
                ids = [i.decode() for i in g["sample_ids"][()]]
                want = np.zeros((len(ids), tasks.end(step)), np.uint8)
                for row, sid in enumerate(ids):
                    s = by_id[sid]
                    want[row, list(s.targets(tasks.end(s.task)))] = 1
                assert (g["targets"][()] == want).all()
    solved = SolveParams(eta=1.0, width=64, device="cpu")
    (weights,) = solve(out, tmp_path / "solve", solved)
    run = tmp_path / "evaluate" / "pal" / "0"
    (metrics,) = evaluate(out, [weights], run)
    m = json.loads(metrics.read_text())
    assert m["measure"] == "macro_f1" and len(m["matrix"]) == 2
    assert 0 <= m["acc"] <= 100 and 0 < m["map"]["acc"] <= 100
    assert m["bp"]["measure"] == "macro_f1" and len(m["bp"]["matrix"]) == 2
    check_predicted_labels(tree, samples, tmp_path, weights)
    report = build(tmp_path / "evaluate", ["pal"], ProtocolParams(runs=(0,)))
    write_report(tmp_path / "results", report)
    table = (tmp_path / "results" / "table.md").read_text().splitlines()
    assert table[0].startswith("Macro F1 (%, scores > 0.5) and macro mAP (%)")
    assert "| F1 |" in table[2] and table[2].endswith("| mAP Last |")
    assert table[4].startswith(f"| pal | {m['acc']:.2f} |")


def check_predicted_labels(tree: Path, samples, tmp_path: Path, weights: Path) -> None:
    """`pal predict` on test films of a model tuned on multi-label data: each
    row's `labels` are the classes scored above the threshold, highest
    first (every class in `top` at --top-k 8), at the median score so that
    some labels pass and some do not; its default threshold is
    evaluate.threshold of --params."""
    films = [s for s in samples if s.split == "test" and s.image and s.text][:6]
    listing = tree / "films.jsonl"
    listing.write_text(
        "".join(
            json.dumps({"id": s.id, "image": s.image, "text": s.text}) + "\n"
            for s in films
        )
    )
    params = tmp_path / "predict.yaml"
    params.write_text("solve: {eta: 1.0, width: 64}\nevaluate: {threshold: 0.25}\n")
    args = ["predict", str(listing), "--tune", str(tmp_path / "tune")]
    args += ["--weights", str(weights), "--top-k", "8", "--params", str(params)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    first = [json.loads(line) for line in r.stdout.splitlines()]
    scores = [c["score"] for row in first for c in row["top"]]
    cut = float(np.median(scores))
    for row in first:  # evaluate.threshold 0.25 of --params
        assert row["labels"] == [c["class"] for c in row["top"] if c["score"] > 0.25]
    r = CliRunner().invoke(main, [*args, "--threshold", str(cut)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["id"] for row in rows] == [s.id for s in films]
    for row in rows:
        assert len(row["top"]) == 8
        assert row["labels"] == [c["class"] for c in row["top"] if c["score"] > cut]
    n_labels = sum(len(row["labels"]) for row in rows)
    assert 0 < n_labels < len(scores)
