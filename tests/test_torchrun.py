"""Extraction with 2 ranks launched for real (torch.distributed.run, CPU
processes): the part files hold the same bytes as one process's shards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pipeline import params as pparams
from pipeline.stages.extract import extract
from solver.shard_readers import open_features

pytestmark = pytest.mark.slow  # two fresh interpreters load torch: ~20 s


def _blocks(folder):
    """Every step's train and test blocks (features, labels, missing, bp_logits),
    through the shard reader."""
    out = []
    for s in open_features(folder):
        out.append(s.train.read_all())
        out += [s.test[t].read_all(with_bp_logits=True) for t in sorted(s.test)]
    return out


def test_two_ranks_equal_one_process(tuned, tmp_path):
    params_file, prepare, tune_dir = tuned
    raw = yaml.safe_load(params_file.read_text())
    raw["extract"].update(batch_size=5, processes=2)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    one = tmp_path / "one"
    extract(prepare, tune_dir, one, pparams.ExtractParams(batch_size=5, device="cpu"))
    two = tmp_path / "two"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "extract", "--params", str(params),
         "--prepare", str(prepare), "--tune", str(tune_dir), "--out", str(two)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "extract: 2 processes" in r.stderr
    assert sorted(p.name for p in (two / "step_03").iterdir()) == [
        "test-00000.h5", "test-00001.h5", "train-00000.h5", "train-00001.h5"
    ]  # fmt: skip
    a, b = _blocks(one), _blocks(two)
    assert len(a) == len(b) == 3 + 6  # step k: train + k test tasks
    for block_a, block_b in zip(a, b, strict=True):  # features, labels, missing, bp
        for x, y in zip(block_a, block_b, strict=True):
            assert (x is None and y is None) or x.tobytes() == y.tobytes()
