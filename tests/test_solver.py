"""RLS solver: both methods equal the joint ridge solution after every step."""

import dataclasses
import shutil

import h5py
import numpy as np
import pytest
from sklearn.linear_model import Ridge

from palcore.errors import PalError
from solver.backend import Backend, get_backend
from solver.params import SolveParams
from solver.rls import Expander, make_rls, one_hot, upsampling_matrix
from solver.shard_readers import open_features
from solver.solve import solve
from solver.synthetic import make_features
from solver.weights import WeightsFile, eta_label, weights_name

D, WIDTH = 24, 192
ROWS = [150, 97, 131]  # uneven rows per step
CLASSES = [3, 2, 4]  # classes grow per step: C_k = 3, 5, 9


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    return make_features(root, ROWS, CLASSES, feature_dim=D, test_rows=20, seed=1)


def params(**kw):
    base = dict(eta=1.0, width=WIDTH, seed=3, method="gram", device="cpu")
    base.update(kw)
    return SolveParams(**base)


def joint_reference(features, eta, width, seed):
    """Per step: closed-form joint ridge over all rows so far, and sklearn's Ridge."""
    W_up = upsampling_matrix(D, width, seed)
    Hs, ys, out = [], [], []
    for s in open_features(features):
        X, y, _, _ = s.train.read_all()
        Hs.append(np.maximum(X.astype(np.float64) @ W_up, 0))
        ys.append(y)
        H, Y = np.vstack(Hs), np.eye(s.classes_seen)[np.concatenate(ys)]
        closed = np.linalg.solve(H.T @ H + eta * np.eye(width), H.T @ Y)
        sk = Ridge(alpha=eta, fit_intercept=False, solver="cholesky").fit(H, Y)
        out.append((closed, sk.coef_.T))
    return out


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def read_weights(path):
    wf = WeightsFile(path)
    return [wf.W(k) for k in range(1, wf.n_steps + 1)]


def test_upsampling_matrix_is_the_contract():
    W = upsampling_matrix(768, 5, seed=7)
    want = np.random.default_rng(7).uniform(
        -1 / np.sqrt(768), 1 / np.sqrt(768), (768, 5)
    )
    assert W.dtype == np.float64 and W.shape == (768, 5)
    np.testing.assert_array_equal(W, want)
    assert np.abs(W).max() <= 1 / np.sqrt(768)


def test_expander_is_relu_of_x_times_w_up():
    X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    W_up = upsampling_matrix(4, 6, 0)
    H = Expander(Backend(), W_up, np.float64)(X)
    np.testing.assert_array_equal(H, np.maximum(X.astype(np.float64) @ W_up, 0))
    assert H.dtype == np.float64 and (H == 0).any()


@pytest.mark.parametrize("method", ["gram", "woodbury"])
@pytest.mark.parametrize("eta", [0.1, 1.0])
def test_equals_joint_ridge_after_every_step(features, tmp_path, method, eta):
    (path,) = solve(features, tmp_path, params(method=method, eta=eta, batch_rows=41))
    assert path == tmp_path / "weights.h5"
    Ws = read_weights(path)
    ref = joint_reference(features, eta, WIDTH, 3)
    assert [W.shape for W in Ws] == [(WIDTH, 3), (WIDTH, 5), (WIDTH, 9)]
    for W, (closed, sk) in zip(Ws, ref, strict=True):
        assert rel(W, closed) <= 1e-9
        assert rel(W, sk) <= 1e-9


def test_new_classes_start_as_zero_columns():
    # one step, then a step whose rows carry only the new classes: before their
    # rows arrive, the solver's extra columns must be exactly zero
    b = Backend()
    rls = make_rls("woodbury", b, 16, (1.0,), max_classes=4)
    H = np.abs(np.random.default_rng(0).standard_normal((10, 16)))
    rls.partial_fit(H, np.array([0, 1] * 5), classes_seen=2)
    assert np.all(rls.W_[0][:, 2:] == 0)
    assert rls.weights(2)[0].shape == (16, 2)


def test_chunk_size_does_not_change_the_result(features, tmp_path):
    for method in ("gram", "woodbury"):
        runs = []
        for rows in (7, 64, 1000):
            out = tmp_path / f"{method}-{rows}"
            (path,) = solve(features, out, params(method=method, batch_rows=rows))
            runs.append(read_weights(path))
        for other in runs[1:]:
            for a, b in zip(runs[0], other, strict=True):
                assert rel(b, a) <= 1e-11


def test_gram_and_woodbury_agree(features, tmp_path):
    (g,) = solve(features, tmp_path / "g", params(method="gram", batch_rows=50))
    (w,) = solve(features, tmp_path / "w", params(method="woodbury", batch_rows=50))
    for a, b in zip(read_weights(g), read_weights(w), strict=True):
        assert rel(b, a) <= 1e-10


@pytest.mark.parametrize("method", ["gram", "woodbury"])
def test_eta_sweep_equals_separate_solves(features, tmp_path, method):
    etas = (0.1, 1.0, 10.0)
    paths = solve(features, tmp_path / "sweep", params(method=method, eta=etas))
    assert [p.name for p in paths] == [
        "weights-eta0.1.h5",
        "weights-eta1.h5",
        "weights-eta10.h5",
    ]
    assert not (tmp_path / "sweep" / "weights.h5").exists()
    for eta, path in zip(etas, paths, strict=True):
        (single,) = solve(
            features, tmp_path / f"one{eta}", params(method=method, eta=eta)
        )
        assert WeightsFile(path).info.eta == eta
        for a, b in zip(read_weights(single), read_weights(path), strict=True):
            # the same operations on the same data: equal to the last bit
            np.testing.assert_array_equal(a, b)


def test_weights_file_layout_and_deterministic_bytes(features, tmp_path):
    p = params(method="woodbury", eta=0.5, batch_rows=60)
    (a,) = solve(features, tmp_path / "a", p)
    (b,) = solve(features, tmp_path / "b", p)
    assert a.read_bytes() == b.read_bytes()
    with h5py.File(a, "r") as f:
        attrs = dict(f.attrs)
        assert sorted(f) == ["step_01", "step_02", "step_03"]
        assert f["step_02/W"].shape == (WIDTH, 5)
        assert f["step_02/W"].dtype == np.float64
        assert f["step_02"].attrs["classes_seen"] == 5
    assert attrs["eta"] == 0.5 and attrs["width"] == WIDTH and attrs["seed"] == 3
    assert attrs["feature_dim"] == D and attrs["method"] == "woodbury"
    assert attrs["dtype"] == "float64" and attrs["n_steps"] == 3
    assert sorted(x.name for x in (tmp_path / "a").iterdir()) == ["weights.h5"]


def test_parts_give_the_same_weights_as_one_file(features, tmp_path):
    split = tmp_path / "parts"
    shutil.copytree(features, split)
    s = open_features(split)[1]
    X, y, m, _ = s.train.read_all()
    ids = s.train.sample_ids()
    from solver.shards import Block, ShardAttrs, write_train

    (split / "step_02" / "train.h5").unlink()
    attrs = ShardAttrs(2, s.classes_seen, D)
    for i, (lo, hi) in enumerate([(0, 40), (40, 41), (41, len(y))]):
        write_train(
            split / "step_02" / f"train-{i:05d}.h5",
            Block(X[lo:hi], y[lo:hi], m[lo:hi], ids[lo:hi]),
            attrs,
        )
    (a,) = solve(features, tmp_path / "a", params(batch_rows=1000))
    (b,) = solve(split, tmp_path / "b", params(batch_rows=1000))
    for wa, wb in zip(read_weights(a), read_weights(b), strict=True):
        assert rel(wb, wa) <= 1e-12


def test_float32_dtype_is_close(features, tmp_path):
    (a,) = solve(features, tmp_path / "a", params())
    (b,) = solve(features, tmp_path / "b", params(dtype="float32"))
    Wa, Wb = read_weights(a)[-1], read_weights(b)[-1]
    assert Wb.dtype == np.float32
    assert rel(Wb.astype(np.float64), Wa) <= 1e-3


def test_one_hot():
    Y = one_hot(np.array([2, 0, 2]), 4, np, np.float64)
    np.testing.assert_array_equal(Y, [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]])


def test_eta_labels_are_exact_and_short():
    assert [eta_label(e) for e in (0.1, 1.0, 10.0, 1e-5, 0.1234567)] == [
        "0.1",
        "1",
        "10",
        "1e-05",
        "0.1234567",
    ]
    assert weights_name(1.0, sweep=False) == "weights.h5"
    assert weights_name(1.0, sweep=True) == "weights-eta1.h5"


def test_solve_params_eta_list_and_errors():
    assert params(eta=(0.1, 1.0)).etas == (0.1, 1.0)
    assert params(eta=2.0).etas == (2.0,) and not params(eta=2.0).is_sweep
    with pytest.raises(
        PalError, match=r"solve\.eta\[1\] must be > 0 and finite, got -1\.0$"
    ):
        params(eta=(0.1, -1.0))
    with pytest.raises(PalError, match=r"solve\.eta must be > 0 and finite, got inf$"):
        params(eta=float("inf"))
    with pytest.raises(PalError, match=r"solve\.eta lists 1\.0 twice"):
        params(eta=(1.0, 1.0))
    with pytest.raises(PalError, match=r"solve\.eta must not be an empty list"):
        params(eta=())


def test_unknown_method_and_device():
    with pytest.raises(
        PalError, match=r"method must be one of gram, woodbury, got 'cg'"
    ):
        make_rls("cg", Backend(), 4, (1.0,), 2)
    with pytest.raises(PalError, match=r"device must be one of auto, cpu, cuda"):
        get_backend("tpu")


def test_auto_backend_without_gpu_falls_back_with_a_log_line(caplog):
    try:
        import cupy  # noqa: F401

        pytest.skip("cupy installed: fallback path not reachable here")
    except ImportError:
        pass
    with caplog.at_level("INFO", logger="solver.backend"):
        b = get_backend("auto")
    assert b.name == "numpy"
    assert "backend: NumPy (no GPU: cupy not importable" in caplog.text
    with pytest.raises(PalError, match=r"solve\.device is 'cuda' but no GPU works: "):
        get_backend("cuda")


def test_solver_params_replace_revalidates():
    with pytest.raises(PalError, match=r"solve\.width must be > 0, got 0"):
        dataclasses.replace(params(), width=0)


@pytest.mark.parametrize("etas", [(1.0,), (0.1, 1.0, 10.0)])
def test_dual_form_on_early_steps_equals_joint_ridge(tmp_path, etas):
    # few rows per step against a wide layer: steps 1-2 (100, 160 rows <= d/2)
    # are solved as W = Hᵀ(H Hᵀ + ηI)⁻¹Y, step 3 (460 rows) in the primal form
    width = 512
    f = make_features(tmp_path / "x", [100, 60, 300], [2, 3, 2], feature_dim=D, seed=5)
    W_up = upsampling_matrix(D, width, 0)
    b = Backend()
    expand = Expander(b, W_up, np.float64)
    dual = make_rls("gram", b, width, etas, 7, expand=expand)
    primal = make_rls("gram", b, width, etas, 7)
    Hs, ys = [], []
    for s in open_features(f):
        for X, y, _, _ in s.train.iter_chunks(45):
            dual.partial_fit(expand(X), y, s.classes_seen, X=X)
            primal.partial_fit(expand(X), y, s.classes_seen, X=X)
            Hs.append(expand(X))
            ys.append(y)
        H, Y = np.vstack(Hs), np.eye(s.classes_seen)[np.concatenate(ys)]
        for eta, Wd, Wp in zip(
            etas,
            dual.weights(s.classes_seen),
            primal.weights(s.classes_seen),
            strict=True,
        ):
            closed = np.linalg.solve(H.T @ H + eta * np.eye(width), H.T @ Y)
            assert rel(Wd, closed) <= 1e-9
            assert rel(Wd, Wp) <= 1e-10
    assert dual.dual_steps_ == 2 and primal.dual_steps_ == 0
