"""Multi-label shards (`Block.targets`, multi-hot) through the shard format,
the solve and evaluate: each target column an independent ridge, the ridge
unchanged, so W equals (G + ηI)⁻¹ HᵀY with Y multi-hot; the η rules and the
heads, which score single-label rows, refuse them in one line; evaluate
scores macro F1 and mAP, equal to sklearn's."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from palcore.errors import PalError, ParamsError, ShardError
from palcore.outputs import step_dir_name, task_group_name
from solver.backend import Backend
from solver.classifier import Classifier
from solver.evaluate import evaluate
from solver.multilabel import task_matrices
from solver.params import EvaluateParams, SolveParams
from solver.rls import Expander, make_rls, upsampling_matrix
from solver.shard_readers import open_features
from solver.shards import Block, ShardAttrs, write_test, write_train
from solver.solve import solve
from solver.synthetic import make_features
from solver.weights import WeightsFile

D, WIDTH = 16, 96
ROWS, CLASSES = [90, 70], [3, 4]  # C_k = 3, 7


def multi_hot(labels: np.ndarray, classes_seen: int, task_end: int, seed: int):
    """Each row's label, and a second label of its task's range at or above
    it with probability 1/2 (its label stays the first of its targets)."""
    rng = np.random.default_rng(seed)
    T = np.zeros((len(labels), classes_seen), np.uint8)
    T[np.arange(len(labels)), labels] = 1
    extra = rng.integers(labels, task_end)  # in [label, task_end)
    keep = rng.random(len(labels)) < 0.5
    T[np.arange(len(labels))[keep], extra[keep]] = 1
    return T


def with_targets(src: Path, dst: Path, bp: bool = False) -> Path:
    """The synthetic shards of `src` rewritten into `dst` with multi-hot
    targets; with `bp`, their test blocks keep the BP head's logits."""
    ends = np.cumsum(CLASSES)
    for s in open_features(src):
        attrs = ShardAttrs(s.step, s.classes_seen, s.feature_dim)
        folder = dst / step_dir_name(s.step)
        folder.mkdir(parents=True)
        X, y, m, _ = s.train.read_all()
        T = multi_hot(y, s.classes_seen, int(ends[s.step - 1]), s.step)
        ids = s.train.sample_ids()
        write_train(folder / "train.h5", Block(X, y, m, ids, targets=T), attrs)
        tests = {}
        for task, block in s.test.items():
            X, y, m, logits = block.read_all(with_bp_logits=bp)
            T = multi_hot(y, s.classes_seen, int(ends[task - 1]), 10 * s.step + task)
            tests[task] = Block(
                X, y, m, block.sample_ids(), bp_logits=logits, targets=T
            )
        write_test(folder / "test.h5", tests, attrs)
    return dst


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ml")
    plain = make_features(root / "plain", ROWS, CLASSES, feature_dim=D, test_rows=12)
    return with_targets(plain, root / "multi")


def closed_forms(
    features: Path, eta: float, seed: int, width: int = WIDTH
) -> list[np.ndarray]:
    """Per step: (HᵀH + ηI)⁻¹ HᵀY over every row so far, Y multi-hot."""
    W_up = upsampling_matrix(D, width, seed)
    Hs, Ts, out = [], [], []
    for s in open_features(features):
        X, _, _, _ = s.train.read_all()
        Hs.append(np.maximum(X.astype(np.float64) @ W_up, 0))
        Ts.append(s.train.targets())
        H = np.vstack(Hs)
        Y = np.zeros((len(H), s.classes_seen))
        row = 0
        for T in Ts:
            Y[row : row + len(T), : T.shape[1]] = T
            row += len(T)
        out.append(np.linalg.solve(H.T @ H + eta * np.eye(width), H.T @ Y))
    return out


def test_targets_round_trip_and_a_single_label_shard_has_none(features, tmp_path):
    (step,) = [s for s in open_features(features) if s.step == 1]
    assert step.train.has_targets and step.test[1].has_targets
    T = step.train.targets()
    _, y, _, _ = step.train.read_all()
    assert T.dtype == np.uint8 and T.shape == (ROWS[0], 3)
    assert (T[np.arange(len(y)), y] == 1).all() and T.sum() > len(y)
    plain = make_features(tmp_path / "p", [20], [2], feature_dim=D, test_rows=4)
    (s,) = open_features(plain)
    assert not s.train.has_targets and s.train.targets() is None
    with h5py.File(plain / "step_01" / "train.h5") as f:
        assert "targets" not in f


@pytest.mark.parametrize("method", ["gram", "woodbury"])
def test_the_solve_fits_multi_hot_targets(features, tmp_path, method):
    p = SolveParams(eta=0.5, width=WIDTH, seed=2, method=method, device="cpu")
    (path,) = solve(features, tmp_path, dataclasses.replace(p, batch_rows=33))
    wf = WeightsFile(path)
    for k, closed in enumerate(closed_forms(features, 0.5, 2), start=1):
        W = wf.W(k)
        assert np.linalg.norm(W - closed) / np.linalg.norm(closed) <= 1e-9


def test_the_dual_form_fits_multi_hot_targets(features):
    """Few rows against a wide layer: step 1 (90 rows <= d/2 = 128) in the
    gram solve's dual form, whose kept targets are padded to the step's
    classes; step 2 (160 rows) in the primal form."""
    b, width = Backend(), 256
    W_up = upsampling_matrix(D, width, 2)
    expand = Expander(b, W_up, np.float64)
    dual = make_rls("gram", b, width, (0.5,), 7, expand=expand)
    closed = closed_forms(features, 0.5, 2, width)
    for s in open_features(features):
        X, _, _, _ = s.train.read_all()
        T = s.train.targets()
        for lo in range(0, len(X), 40):
            rows = slice(lo, lo + 40)
            dual.partial_fit(expand(X[rows]), T[rows], s.classes_seen, X=X[rows])
        (W,) = dual.weights(s.classes_seen)
        ref = closed[s.step - 1]
        assert np.linalg.norm(W - ref) / np.linalg.norm(ref) <= 1e-9
        assert dual.dual_steps_ == 1  # step 1's


def test_eta_auto_and_heads_refuse_multi_label_rows(features, tmp_path):
    shard = features / "step_01" / "train.h5"
    base = SolveParams(eta=1.0, width=WIDTH, device="cpu")
    with pytest.raises(PalError) as e:
        solve(features, tmp_path / "a", dataclasses.replace(base, eta="auto"))
    assert str(e.value) == (
        f"solve.eta: auto: {shard} holds multi-label targets; the η rules and "
        "heads score single-label rows (a fixed solve.eta, or a list, fits them)"
    )
    with pytest.raises(PalError) as e:
        solve(features, tmp_path / "b", dataclasses.replace(base, heads=("ncm",)))
    assert str(e.value).startswith(f"solve.heads: {shard} holds multi-label targets")


def test_a_threshold_that_is_not_finite_is_a_params_error():
    with pytest.raises(ParamsError) as e:
        EvaluateParams(threshold=float("nan"))
    assert str(e.value) == "evaluate.threshold must be a finite number, got nan"


@pytest.mark.parametrize("threshold", [0.5, 0.3])
def test_evaluate_writes_f1_and_map_equal_to_sklearn(features, tmp_path, threshold):
    """metrics.json on multi-label shards: the F1 task matrix, its summary
    (RebQ's avg, fg_diag, last), the pooled F1 of each step, F1 by missing
    type and the mAP matrix, each equal to sklearn on the weights' raw scores
    (which leave [0, 1]); the CSVs beside it; no accuracy files."""
    from sklearn.metrics import average_precision_score, f1_score

    (weights,) = solve(
        features,
        tmp_path / "w",
        SolveParams(eta=0.5, width=WIDTH, seed=2, device="cpu"),
    )
    out = tmp_path / "eval"
    (path,) = evaluate(features, [weights], out, threshold=threshold)
    got = json.loads(path.read_text())
    assert sorted(p.name for p in out.iterdir()) == [
        "f1_matrix.csv",
        "map_matrix.csv",
        "metrics.json",
    ]
    assert (got["measure"], got["threshold"], got["eta"]) == (
        "macro_f1",
        threshold,
        0.5,
    )
    W_up = upsampling_matrix(D, WIDTH, 2)
    wf = WeightsFile(weights)
    bounds = [0, *np.cumsum(CLASSES)]
    steps = open_features(features)
    f1 = lambda Y, S: 100 * f1_score(Y, S > threshold, average="macro", zero_division=0)  # noqa: E731
    ap = lambda Y, S: 100 * average_precision_score(Y, S, average="macro")  # noqa: E731
    for k, s in enumerate(steps):
        Ys, Ss, Ms = [], [], []
        for j in range(1, k + 2):
            X, _, m, _ = s.test[j].read_all()
            S = np.maximum(X.astype(np.float64) @ W_up, 0) @ wf.W(s.step)
            Y = s.test[j].targets()
            cols = slice(bounds[j - 1], bounds[j])
            assert got["matrix"][k][j - 1] == pytest.approx(
                f1(Y[:, cols], S[:, cols]), abs=1e-6
            )
            assert got["map"]["matrix"][k][j - 1] == pytest.approx(
                ap(Y[:, cols], S[:, cols]), abs=1e-6
            )
            Ys.append(Y)
            Ss.append(S)
            Ms.append(m)
        Y, S, M = np.vstack(Ys), np.vstack(Ss), np.concatenate(Ms)
        assert got["step_accuracy"][k] == pytest.approx(f1(Y, S), abs=1e-6)
        assert S.min() < 0 and S.max() > 1  # raw ridge scores, no sigmoid
    for code in range(3):
        key = ("complete", "text_missing", "image_missing")[code]
        want = f1(Y[M == code], S[M == code]) if (M == code).any() else None
        assert got["acc_by_missing"][key] == (
            want if want is None else pytest.approx(want, abs=1e-6)
        )
    F = got["matrix"]
    assert got["acc"] == pytest.approx(np.mean(F[-1]), abs=1e-6)
    assert got["fg_diag"] == pytest.approx(F[0][0] - F[1][0], abs=1e-6)
    assert got["last"] == F[-1][-1]
    assert got["aia"] == pytest.approx(np.mean(got["step_accuracy"]), abs=1e-6)
    csv = (out / "f1_matrix.csv").read_text().splitlines()
    assert csv[2] == f"2,{F[1][0]:.4f},{F[1][1]:.4f}"


def test_evaluate_scores_the_bp_head_through_a_sigmoid(tmp_path):
    """Test shards with `bp_logits` (a BP head trained with BCE): metrics.json's
    `bp` holds the same keys, its F1 sklearn's on sigmoid(logits) > threshold
    per task's columns and its mAP sklearn's on the logits; without logits,
    no `bp`."""
    from sklearn.metrics import average_precision_score, f1_score

    plain = make_features(tmp_path / "p", ROWS, CLASSES, feature_dim=D, test_rows=12)
    shards = with_targets(plain, tmp_path / "bp", bp=True)
    p = SolveParams(eta=0.5, width=WIDTH, seed=2, device="cpu")
    (weights,) = solve(shards, tmp_path / "w", p)
    (path,) = evaluate(shards, [weights], tmp_path / "eval", threshold=0.3)
    got = json.loads(path.read_text())
    bp = got["bp"]
    assert sorted(bp) == sorted(k for k in got if k not in ("bp", "width", "eta"))
    assert (bp["measure"], bp["threshold"]) == ("macro_f1", 0.3)
    bounds = [0, *np.cumsum(CLASSES)]
    steps = open_features(shards)
    for k, s in enumerate(steps):
        for j in range(1, k + 2):
            _, _, _, logits = s.test[j].read_all(with_bp_logits=True)
            cols = slice(bounds[j - 1], bounds[j])
            Y, L = s.test[j].targets()[:, cols], logits[:, cols]
            assert L.min() < 0  # logits, which a threshold of 0.3 would misread
            P = 1 / (1 + np.exp(-L.astype(np.float64)))
            f1 = f1_score(Y, P > 0.3, average="macro", zero_division=0)
            has = Y.any(axis=0)
            ap = average_precision_score(Y[:, has], L[:, has], average="macro")
            assert bp["matrix"][k][j - 1] == pytest.approx(100 * f1, abs=1e-6)
            assert bp["map"]["matrix"][k][j - 1] == pytest.approx(100 * ap, abs=1e-6)
    assert bp["matrix"] != got["matrix"]
    (plain_path,) = evaluate(
        with_targets(plain, tmp_path / "nobp"), [weights], tmp_path / "e2"
    )
    assert "bp" not in json.loads(plain_path.read_text())


def test_evaluate_refuses_a_single_label_test_shard_beside_multi_label_ones(
    features, tmp_path
):
    mixed = tmp_path / "mixed"
    shutil.copytree(features, mixed)
    test = mixed / "step_02" / "test.h5"
    with h5py.File(test, "r+") as f:
        del f[task_group_name(2)]["targets"]
    (weights,) = solve(
        mixed, tmp_path / "w", SolveParams(eta=1.0, width=WIDTH, device="cpu")
    )
    with pytest.raises(ShardError) as e:
        evaluate(mixed, [weights], tmp_path / "eval")
    assert str(e.value) == (
        f"{test}:{task_group_name(2)}: no targets, "
        "but other test shards are multi-label"
    )
    assert not (tmp_path / "eval").exists()


def bad_block(n: int = 4, C: int = 3, **kw) -> Block:
    y = np.array([0, 1, 2, 0])[:n]
    T = np.eye(C, dtype=np.uint8)[y]
    fields = dict(
        features=np.zeros((n, D), np.float32),
        labels=y,
        missing=np.zeros(n, np.int8),
        sample_ids=[f"s{i}" for i in range(n)],
        targets=T,
    )
    fields.update(kw)
    return Block(**fields)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (np.full((4, 3), 2, np.uint8), "targets must be 0 or 1"),
        (np.eye(3, dtype=np.uint8)[[1, 1, 2, 0]], "targets row 0 lacks its label 0"),
        (np.ones((4, 2), np.uint8), "targets must have shape (4, 3)"),
    ],
)
def test_bad_targets_are_one_line(tmp_path, targets, message):
    path = tmp_path / "train.h5"
    with pytest.raises(ShardError) as e:
        write_train(path, bad_block(targets=targets), ShardAttrs(1, 3, D))
    assert str(e.value) == f"{path}: {message}"
    assert not path.exists()


def test_a_shard_whose_targets_were_damaged_is_refused_when_read(tmp_path):
    folder = tmp_path / "f" / "step_01"
    folder.mkdir(parents=True)
    write_train(folder / "train.h5", bad_block(), ShardAttrs(1, 3, D))
    write_test(folder / "test.h5", {1: bad_block()}, ShardAttrs(1, 3, D))
    with h5py.File(folder / "train.h5", "r+") as f:
        f["targets"][0, 0] = 0  # row 0 loses its label
    with pytest.raises(ShardError) as e:
        open_features(tmp_path / "f")
    assert str(e.value) == f"{folder / 'train.h5'}: targets row 0 lacks its label 0"


def test_task_matrices_score_each_task_on_its_own_columns(features, tmp_path):
    """F1 (scores > 0.5) and mAP of every (step, task) against sklearn on the
    task's label columns, from the weights' own scores max(X W_up, 0) W_k."""
    from sklearn.metrics import average_precision_score, f1_score

    p = SolveParams(eta=0.5, width=WIDTH, seed=2, device="cpu")
    (path,) = solve(features, tmp_path, p)
    steps = open_features(features)
    got = task_matrices(Classifier(path), steps, 0.5)
    W_up = upsampling_matrix(D, WIDTH, 2)
    bounds = [0, *np.cumsum(CLASSES)]
    wf = WeightsFile(path)
    for k, s in enumerate(steps):
        assert len(got["f1"][k]) == len(got["map"][k]) == k + 1
        for j in range(1, k + 2):
            X, _, _, _ = s.test[j].read_all()
            S = np.maximum(X.astype(np.float64) @ W_up, 0) @ wf.W(s.step)
            cols = slice(bounds[j - 1], bounds[j])
            Y, S = s.test[j].targets()[:, cols], S[:, cols]
            f1 = f1_score(Y, S > 0.5, average="macro", zero_division=0)
            assert got["f1"][k][j - 1] == pytest.approx(100 * f1, abs=1e-9)
            has = Y.any(axis=0)  # columns with a positive (mAP's definition)
            ap = average_precision_score(Y[:, has], S[:, has], average="macro")
            assert got["map"][k][j - 1] == pytest.approx(100 * ap, abs=1e-9)
    assert 0 < got["f1"][-1][0] < 100 and 0 < got["map"][-1][-1] <= 100
