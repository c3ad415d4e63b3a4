"""Prompt methods: the registry, an eighth method added as docs/USAGE.md says,
and each method's selection rule, training and frozen parameters."""

from typing import Literal, get_args

import pytest
import torch
import yaml
from helpers import write_params

from palcore.errors import ParamsError
from pipeline import contracts
from pipeline import params as pparams
from pipeline.methods import registry
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, Out, View, layer_prompts, no_aux
from pipeline.params import PromptParams


def test_every_method_name_has_one_class():
    assert list(registry.METHODS) == list(get_args(pparams.MethodName))
    for name, cls in registry.METHODS.items():
        assert issubclass(cls, Method), name


def test_an_unknown_method_is_one_line_naming_the_key(tmp_path, tiny_vilt):
    path = write_params(tmp_path / "params.yaml", tiny_vilt, prompt={"method": "x"})
    with pytest.raises(ParamsError, match=r"prompt\.method must be one of 'pal', "):
        pparams.load(path, "prompt")
    with pytest.raises(ParamsError, match=r"^prompt\.method must be one of .*'x'$"):
        PromptParams(method="x")


class Toy(Method):
    """docs/USAGE.md's example: one prompt shared by every sample, as prefix
    keys and values at the prompt layers, trained in the first task only."""

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        self.layers = tuple(params.layers)
        self.P = torch.nn.Parameter(torch.zeros(len(self.layers), params.length, dim))

    def add_task(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            if self.P.requires_grad and not self.P.any():
                self.P.normal_(0.0, 0.02, generator=generator)
            else:
                self.P.requires_grad_(False)

    def features(self, backbone: Backbone, view: View) -> Out:
        B = view.h.shape[0]
        P = self.P.float()[:, None].expand(-1, B, -1, -1)  # (J, B, L, D)
        prompts = layer_prompts(P, self.layers, "prefix")
        return no_aux(backbone.encode(view.h, view.mask, prompts)[:, 0].float())


def test_an_eighth_method_runs_through_tune_and_extract(
    tmp_path, tiny_vilt, tiny_prepare, monkeypatch
):
    from pipeline.stages.extract import extract
    from pipeline.stages.tune import tune

    # the section's steps 2 to 4: its line in METHODS, its name in
    # MethodName, its versions in contracts.yaml
    monkeypatch.setitem(registry.METHODS, "toy", Toy)
    names = (*get_args(pparams.MethodName), "toy")
    monkeypatch.setattr(pparams, "MethodName", Literal[names])
    versions = contracts.read_versions()
    with pytest.raises(contracts.ContractError, match="no version for 'tune.toy'"):
        versions.of("tune.toy")
    toy = {"tune.toy": 1, "extract.toy": 1}
    added = contracts.Versions({**versions.versions, **toy}, versions.reasons)
    monkeypatch.setattr(contracts, "read_versions", lambda root=None: added)
    params = write_params(tmp_path / "params.yaml", tiny_vilt, prompt={"method": "toy"})
    load = pparams.load
    ckpts = tune(
        tiny_prepare,
        tmp_path / "tune",
        load(params, "model"),
        load(params, "prompt"),
        load(params, "tune"),
    )
    states = [torch.load(p, weights_only=False) for p in ckpts]
    assert states[0]["params"]["prompt"]["method"] == "toy"
    first, last = states[0]["state"]["prompts.P"], states[-1]["state"]["prompts.P"]
    assert first.shape == (2, 4, 32) and first.abs().sum() > 0
    assert torch.equal(first, last)  # trained in task 1, frozen after
    log = [yaml.safe_load(line) for line in (tmp_path / "tune/log.jsonl").open()]
    assert [e["task"] for e in log] == [1, 2, 3] and all("aux" in e for e in log)
    folders = extract(
        tiny_prepare, tmp_path / "tune", tmp_path / "extract", load(params, "extract")
    )
    assert [f.name for f in folders] == ["step_01", "step_02", "step_03"]
    assert all((f / "test.h5").is_file() for f in folders)
    made_under = (tmp_path / "extract" / "contract.json").read_text()
    assert '"method": "toy", "method_version": 1' in made_under


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


@pytest.mark.parametrize(
    "method, prompt",
    [
        ("map", {"length": 4, "position": "input"}),
        ("msp", {"length": 4, "position": "input"}),
        ("rebq", {}),
        ("l2p", {"top_n": 2}),
        ("l2p", {"top_n": 2, "position": "input"}),
        ("dualprompt", {"g_layers": (0,), "g_length": 4, "layers": (1,)}),
    ],
)
def test_prompts_and_head_train_and_the_rest_stays_frozen(tiny, method, prompt):
    from pipeline.model.losses import loss

    model, cache, batches = _first_task(tiny, method, **prompt)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.startswith("backbone.") for n in frozen)
    trained = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[0] for n in trained} == {"prompts", "head"}

    batch = next(
        b
        for b in batches
        if len(b.complete)
        and (b.missing != 0).any()
        and len(set(b.labels.tolist())) > 1
    )
    # plain gradient descent on one batch: the loss falls at every step (the
    # random tiny ViLT's features are alike, so a few steps cannot fit the task)
    opt = torch.optim.SGD(model.trainable_parameters(), lr=0.02)
    losses, reached = [], set()
    named = dict(model.named_parameters())
    for _ in range(4):
        value, _ = loss(model, batch, cache, 1, 0.1)
        losses.append(value.item())
        opt.zero_grad()
        value.backward()
        reached |= {n for n in trained if named[n].grad.abs().sum() > 0}
        opt.step()
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    # every prompt tensor and head row gets a gradient (the prompts from the
    # second step on: the head starts at zero)
    assert reached == set(trained)
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in frozen.items())
    assert any(not torch.equal(now[n], p) for n, p in trained.items())


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
