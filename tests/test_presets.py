"""The dataset presets in configs/ load strictly and carry the paper's settings."""

from pathlib import Path

import pytest

from palcore.params import load_section
from pipeline.params import SECTIONS, load
from solver.params import SolveParams

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name, dataset, tasks", [("food101", "food101", 10), ("n24news", "n24news", 6)]
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
