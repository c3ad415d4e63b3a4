"""Prompt methods: the registry, an eighth method added as docs/USAGE.md says,
and each method's selection rule, training and frozen parameters."""

from typing import Literal, get_args

import pytest
import torch
import yaml
from helpers import write_params

from palcore.errors import ParamsError
from pipeline import params as pparams
from pipeline.methods import Method, Out, View, layer_prompts, no_aux, registry
from pipeline.model.backbone import Backbone
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

    # the section's steps 2 and 3: its line in METHODS, its name in MethodName
    monkeypatch.setitem(registry.METHODS, "toy", Toy)
    names = (*get_args(pparams.MethodName), "toy")
    monkeypatch.setattr(pparams, "MethodName", Literal[names])
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
