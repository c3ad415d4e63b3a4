"""Shared test set-up: offline, no telemetry; the session fixtures (a tiny
ViLT, a prepare folder, one complete tune run), each built once per session."""

import os
from pathlib import Path

import pytest
from helpers import make_prepare, make_vilt, write_params

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip where torch sees no CUDA GPU (one hook for all)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU: torch sees none")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_vilt(tmp_path_factory) -> Path:
    """Folder of a random tiny ViLT (hidden 32, 2 layers, 32-px images)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return make_vilt(tmp_path_factory.mktemp("vilt") / "vilt")


@pytest.fixture(scope="session")
def tiny_prepare(tmp_path_factory) -> Path:
    """A prepare folder: 3 tasks × 2 classes, 6 train + 3 test per class."""
    return make_prepare(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def tuned(tmp_path_factory, tiny_vilt, tiny_prepare):
    """(params file, prepare folder, tune folder) of one complete `tune` run."""
    from pipeline import params as pparams
    from pipeline.stages.tune import tune

    folder = tmp_path_factory.mktemp("tuned")
    params = write_params(folder / "params.yaml", tiny_vilt)
    load = pparams.load
    tune(
        tiny_prepare,
        folder / "tune",
        load(params, "model"),
        load(params, "prompt"),
        load(params, "tune"),
        timings=folder / "timings.jsonl",
    )
    return params, tiny_prepare, folder / "tune"


@pytest.fixture(autouse=True)
def _unsealed_shards_already_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic features are recorded by no lock: the readers' once-a-process
    warning that they cannot be verified is taken as given here, so a test's
    output does not depend on which test read shards first
    (tests/test_export.py checks the warning itself)."""
    from palcore import recorded

    monkeypatch.setattr(recorded, "_WARNED", {Path("(tests)")})
