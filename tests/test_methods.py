"""Prompt methods: the registry, every method as a variant of the pipeline,
and each method's selection rule (what every method must do, tests/
test_method_conformance.py; a new method's module run end to end,
tests/test_method_template.py)."""

import pytest
import torch
import yaml
from helpers import write_params

from palcore.errors import ParamsError
from pipeline import params as pparams
from pipeline.methods import registry
from pipeline.model.method import Method
from pipeline.params import PromptParams


def test_every_method_name_has_one_class():
    assert list(registry.METHODS) == list(pparams.method_names())
    for name, cls in registry.METHODS.items():
        assert issubclass(cls, Method) and cls.__module__ == f"pipeline.methods.{name}"


def test_every_method_solves_and_evaluates_as_a_variant(tmp_path, tiny_prepare):
    """PAL and the committed baselines' rows (pipelines.baselines), each
    tuned and extracted on a 4-layer tiny ViLT, then fitted, scored and
    reported as a pipeline: each baseline's row is its BP head's, named as
    the paper names it."""
    import json

    from helpers import committed_params, make_vilt

    from palcore.params import Source
    from pipeline.stages.extract import extract
    from pipeline.stages.tune import tune
    from solver import api

    committed = committed_params()
    names = ["pal", *committed["pipelines"]["baselines"]]
    vilt = make_vilt(tmp_path / "vilt", layers=4)
    path = write_params(tmp_path / "params.yaml", vilt)
    params = yaml.safe_load(path.read_text())
    params |= {
        "solve": {"eta": 1.0, "width": 64, "seed": 0, "device": "cpu"},
        "evaluate": {"device": "cpu"},
        "protocol": {"runs": [0], "vary": []},
        "ablation": {v: committed["ablation"][v] for v in names},
        "pipelines": {"main": names},
    }
    path.write_text(yaml.safe_dump(params))
    for v in names:
        src = Source(path, 0, v)
        load = pparams.load
        tune(tiny_prepare, tmp_path / "tune" / v, load(src, "model"),
             load(src, "prompt"), load(src, "tune"))  # fmt: skip
        extract(tiny_prepare, tmp_path / "tune" / v, tmp_path / "features" / v / "0",
                load(src, "extract"))  # fmt: skip
    source = Source(path)
    api.fit_pipeline(source, "main", tmp_path / "features", tmp_path / "solve")
    api.evaluate_pipeline(
        source, "main", tmp_path / "features", tmp_path / "solve",
        tmp_path / "evaluate", api.EvaluateParams(device="cpu"),
        report=tmp_path / "report",
    )  # fmt: skip
    report = json.loads((tmp_path / "report/metrics.json").read_text())
    per_run = {
        v: json.loads((tmp_path / f"evaluate/{v}/0/metrics.json").read_text())
        for v in names
    }
    for v in names[1:]:
        row = committed["ablation"][v]
        assert row["head"] == "bp" and report[v]["paper"] == row["paper"]
        assert report[v]["acc"]["mean"] == pytest.approx(per_run[v]["bp"]["acc"])
        assert 0.0 <= per_run[v]["acc"] <= 100.0  # the analytic head scored too
    assert report["pal"]["acc"]["mean"] == pytest.approx(per_run["pal"]["acc"])


# ---------------------------------------------------------------- per method


@pytest.fixture(scope="module")
def tiny(tiny_vilt, tiny_prepare):
    from pipeline.data.samples import read_prepare
    from pipeline.model.backbone import load_backbone

    return load_backbone(str(tiny_vilt), 12), *read_prepare(tiny_prepare)


def _first_task(tiny, method: str, **prompt):
    """A model of `method` at task 1, its cache and loader (batches of 4 with
    the reconstruction copies)."""
    from helpers import make_model

    from pipeline.data.loader import SampleDataset, make_loader
    from pipeline.data.samples import select
    from pipeline.model.network import build_cache

    backbone, samples, tasks = tiny
    model = make_model(backbone, tasks, method=method, **prompt)
    train = select(samples, "train", [1])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    return model, cache, list(make_loader(ds, 4, copies=True))


def test_map_gives_each_sample_the_set_of_its_missing_case(tiny):
    from pipeline.methods.map import Map

    backbone, _, tasks = tiny
    params = PromptParams(method="map", length=4, layers=(0, 1), position="input")
    m = Map(params, 3, 32, 2)
    m.add_task(torch.Generator())
    with torch.no_grad():
        m.P.copy_(torch.arange(m.P.numel(), dtype=torch.float32).view_as(m.P))
    codes = torch.tensor([2, 0, 1, 1])
    P = m.prompts(codes)  # (J, B, L, D)
    assert P.shape == (2, 4, 4, 32)
    for i, code in enumerate(codes.tolist()):
        assert torch.equal(P[:, i], m.P[code])
    # the init: zeros with a row of ones, a different row per case
    fresh = Map(params, 3, 32, 2)
    fresh.add_task(torch.Generator())
    rows = (fresh.P != 0).any(-1)  # (3, J, L)
    assert rows.sum().item() == 3 * 2
    assert [r.nonzero()[0, 1].item() for r in rows] == [0, 1, 2]
    # no CL mechanism: later tasks train the same sets and every head row
    model = _first_task(tiny, "map", length=4)[0]
    model.add_task(torch.Generator())
    assert model.prompts.P.requires_grad and not model.masked
    assert all(p.requires_grad for p in model.head.parameters())
    assert model.train_range(2) == (0, sum(tasks.classes_per_task[:2]))


def test_msp_prompts_are_those_of_the_present_modalities():
    from pipeline.methods.msp import Msp

    for position in ("input", "prefix"):
        params = PromptParams(method="msp", length=4, layers=(0,), position=position)
        m = Msp(params, 3, 8, 2)
        m.add_task(torch.Generator())
        P, mask = m.prompts(torch.tensor([0, 1, 2]))  # complete, no text, no image
        assert P.shape == (1, 3, 8, 8)
        if position == "input":  # the text set's tokens, then the image set's
            assert torch.equal(P[0, 0], torch.cat([m.P[0, 0], m.P[1, 0]]))
        assert mask.tolist() == (
            [[True] * 8, [False] * 4 + [True] * 4, [True] * 4 + [False] * 4]
            if position == "input"  # [text set, image set]
            else [  # [text keys, image keys, text values, image values]
                [True] * 8,
                [False, False, True, True, False, False, True, True],
                [True, True, False, False, True, True, False, False],
            ]
        )
    # the orthogonality loss: ‖P_t P_vᵀ‖²_F / (‖P_t‖²_F ‖P_v‖²_F), mean over layers
    # the init: 2 L_p orthonormal rows per layer, so the sets start orthogonal
    rows = m.P.detach()[:, 0].reshape(8, 8).double()
    assert torch.allclose(rows @ rows.T, torch.eye(8, dtype=torch.float64), atol=1e-6)
    assert m.orthogonality().item() == pytest.approx(0.0, abs=1e-10)
    with pytest.raises(ParamsError, match=r"^prompt\.length 5: MSP's two sets need"):
        Msp.check(PromptParams(method="msp", length=5, position="input"), 3, 8, 2)
    with torch.no_grad():
        m.P.copy_(torch.randn(m.P.shape, generator=torch.Generator().manual_seed(0)))
    t, v = m.P[0, 0].double(), m.P[1, 0].double()
    expect = ((t @ v.T) ** 2).sum() / ((t**2).sum() * (v**2).sum())
    assert m.orthogonality().item() == pytest.approx(expect.item(), rel=1e-5)
    with torch.no_grad():  # every row of both sets along one direction: 1
        u = torch.randn(8, generator=torch.Generator().manual_seed(1))
        m.P[0, 0].copy_(torch.arange(1.0, 5.0)[:, None] * u)
        m.P[1, 0].copy_(-2.0 * m.P[0, 0])
    assert m.orthogonality().item() == pytest.approx(1.0, rel=1e-5)


def test_rebq_reconstructs_with_its_memory_pool(tiny):
    model, cache, batches = _first_task(tiny, "rebq")
    rebq, backbone = model.prompts, model.backbone
    batch = next(b for b in batches if (b.missing != 0).any())
    from pipeline.model.vision import batch_inputs

    ids, am, px, pm = batch_inputs(batch, backbone.device)
    h, mask = backbone.embed(ids, am, px, pm, batch.image_sizes)
    q = cache.q[batch.index]
    text_missing = torch.tensor([True, False] * (batch.n // 2) + [True] * (batch.n % 2))
    args = (backbone, h[: batch.n], mask[: batch.n], ids.shape[1])

    def q_hat():
        with torch.no_grad():
            return rebq.reconstruct(*args, q[:, 0], q[:, 1], text_missing)

    before = q_hat()
    with torch.no_grad():
        rebq.text.P[0].mul_(3.0)
        rebq.image.P[0].mul_(3.0)
    assert torch.equal(q_hat(), before)  # the modality pools play no part
    with torch.no_grad():
        rebq.memory.P[0].mul_(3.0)
    assert not torch.allclose(q_hat(), before)
    # PAL's pools as in PAL, with the memory pool grown beside them
    assert {n.split(".")[0] for n, _ in rebq.named_parameters()} == {
        "text",
        "image",
        "memory",
    }
    assert rebq.masked and rebq.copies
