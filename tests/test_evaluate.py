"""The evaluate stage: accuracy matrix, metrics, CSVs and plot from shards + weights."""

import json

import h5py
import numpy as np
import pytest

from palcore.errors import PalError
from solver.evaluate import evaluate
from solver.metrics import forgetting, forgetting_diag
from solver.params import SolveParams
from solver.rls import upsampling_matrix
from solver.shard_readers import open_features
from solver.solve import solve
from solver.synthetic import make_features

D, WIDTH = 16, 96


def make(root, bp=True, seed=2):
    return make_features(
        root,
        rows_per_step=[120, 90, 100],
        classes_per_step=[3, 3, 2],
        feature_dim=D,
        test_rows=30,
        seed=seed,
        noise=0.9,
        separation=0.25,
        bp_logits=bp,
    )


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    features = make(root / "extract")
    p = SolveParams(eta=1.0, width=WIDTH, seed=5, device="cpu")
    (weights,) = solve(features, root / "solve", p)
    return features, weights


def manual_scores(features, weights_path, eta_width_seed=(WIDTH, 5)):
    """Accuracy matrix and final per-missing accuracy, computed the plain way."""
    width, seed = eta_width_seed
    W_up = upsampling_matrix(D, width, seed)
    with h5py.File(weights_path, "r") as f:
        Ws = [f[f"step_{k:02d}/W"][()] for k in range(1, 4)]
    matrix, bp_matrix, final = [], [], []
    for s in open_features(features):
        row, bp_row = [], []
        for task in range(1, s.step + 1):
            X, y, m, bp = s.test[task].read_all(with_bp_logits=True)
            pred = np.argmax(np.maximum(X.astype(float) @ W_up, 0) @ Ws[s.step - 1], 1)
            row.append(100 * np.mean(pred == y))
            bp_row.append(100 * np.mean(np.argmax(bp, 1) == y))
            if s.step == 3:
                final.append((pred == y, np.argmax(bp, 1) == y, m))
        matrix.append(row)
        bp_matrix.append(bp_row)
    return matrix, bp_matrix, final


def test_metrics_match_a_plain_computation(solved, tmp_path):
    features, weights = solved
    (path,) = evaluate(features, [weights], tmp_path)
    assert path == tmp_path / "metrics.json"
    m = json.loads(path.read_text())
    matrix, bp_matrix, final = manual_scores(features, weights)
    assert m["matrix"] == [[round(a, 6) for a in row] for row in matrix]
    assert m["bp"]["matrix"] == [[round(a, 6) for a in row] for row in bp_matrix]
    assert m["acc"] == pytest.approx(np.mean(matrix[-1]), abs=1e-6)
    assert m["last"] == pytest.approx(matrix[-1][-1], abs=1e-6)
    assert m["fg"] == pytest.approx(forgetting(matrix), abs=1e-6)
    assert m["fg_diag"] == pytest.approx(forgetting_diag(matrix), abs=1e-6)
    assert m["bp"]["fg"] == pytest.approx(forgetting(bp_matrix), abs=1e-6)
    # equal test-set sizes: pooled accuracy after step k = mean of row k
    assert m["aia"] == pytest.approx(np.mean([np.mean(r) for r in matrix]), abs=1e-6)
    hit = np.concatenate([h for h, _, _ in final])
    hit_bp = np.concatenate([h for _, h, _ in final])
    miss = np.concatenate([x for _, _, x in final])
    for code, key in enumerate(("complete", "text_missing", "image_missing")):
        assert m["acc_by_missing"][key] == round(100 * hit[miss == code].mean(), 6)
        assert m["bp"]["acc_by_missing"][key] == round(
            100 * hit_bp[miss == code].mean(), 6
        )
    assert 30 < m["acc"] < 100  # a task that is neither trivial nor hopeless
    assert m["bp"]["fg"] > 0  # the synthetic BP head forgets


def test_csvs_and_plot(solved, tmp_path):
    features, weights = solved
    evaluate(features, [weights], tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())
    lines = (tmp_path / "accuracy_matrix.csv").read_text().splitlines()
    assert lines[0] == "step,task_01,task_02,task_03"
    assert lines[1] == f"1,{m['matrix'][0][0]:.4f},,"
    assert lines[3].split(",")[3] == f"{m['matrix'][2][2]:.4f}"
    rows = (tmp_path / "step_accuracy.csv").read_text().splitlines()
    assert rows[0] == "step,al,bp" and len(rows) == 4
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]
    assert float(rows[1].split(",")[1]) == pytest.approx(m["matrix"][0][0], abs=1e-4)
    png = (tmp_path / "step_accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_outputs_are_byte_identical_across_runs(solved, tmp_path):
    features, weights = solved
    evaluate(features, [weights], tmp_path / "a")
    evaluate(features, [weights], tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == [
        "accuracy_matrix.csv",
        "metrics.json",
        "step_accuracy.csv",
        "step_accuracy.png",
    ]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (
            tmp_path / "b" / name
        ).read_bytes()


def test_without_bp_logits_there_is_no_bp(tmp_path):
    features = make(tmp_path / "extract", bp=False)
    (weights,) = solve(
        features, tmp_path / "solve", SolveParams(width=32, device="cpu")
    )
    evaluate(features, [weights], tmp_path / "out")
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "bp" not in m
    rows = (tmp_path / "out" / "step_accuracy.csv").read_text().splitlines()
    assert all(r.endswith(",") for r in rows[1:])


def test_sweep_folder_gives_one_metrics_file_per_eta(solved, tmp_path):
    features, _ = solved
    p = SolveParams(eta=(0.5, 2.0), width=WIDTH, seed=5, device="cpu")
    solve(features, tmp_path / "sweep", p)
    paths = evaluate(features, [tmp_path / "sweep"], tmp_path / "out")
    assert [x.name for x in paths] == ["metrics-eta0.5.json", "metrics-eta2.json"]
    for eta in (0.5, 2.0):
        for stem in ("accuracy_matrix", "step_accuracy"):
            assert (tmp_path / "out" / f"{stem}-eta{eta:g}.csv").is_file()
        (single,) = solve(
            features,
            tmp_path / f"one{eta}",
            SolveParams(eta=eta, width=WIDTH, seed=5, device="cpu"),
        )
        evaluate(features, [single], tmp_path / f"one{eta}")
        assert (tmp_path / "out" / f"metrics-eta{eta:g}.json").read_bytes() == (
            tmp_path / f"one{eta}" / "metrics.json"
        ).read_bytes()


def test_weights_that_do_not_fit_the_features(solved, tmp_path):
    features, weights = solved
    other = make(tmp_path / "other", bp=False, seed=3)
    with h5py.File(other / "step_03" / "train.h5", "r+") as f:
        f.attrs["classes_seen"] = 9
    with h5py.File(other / "step_03" / "test.h5", "r+") as f:
        f.attrs["classes_seen"] = 9
    with pytest.raises(PalError, match=r"weights\.h5: step 3 has 8 classes, but the "):
        evaluate(other, [weights], tmp_path / "out")
    wide = make_features(tmp_path / "wide", [20], [2], feature_dim=D + 1, test_rows=4)
    with pytest.raises(PalError, match=r"solved for feature_dim 16, but the features"):
        evaluate(wide, [weights], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unreadable_weights(solved, tmp_path):
    features, weights = solved
    bad = tmp_path / "weights.h5"
    bad.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PalError, match=r"weights\.h5: truncated or not an HDF5 file"):
        evaluate(features, [bad], tmp_path / "out")
    with pytest.raises(PalError, match=r"nope\.h5: weights file not found"):
        evaluate(features, [tmp_path / "nope.h5"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PalError) as err:
        evaluate(features, [tmp_path / "empty"], tmp_path / "out")
    assert str(err.value) == (
        f"{tmp_path / 'empty'}: no weights.h5 or weights-eta*.h5 files in this folder"
    )
