"""CuPy backend against the NumPy one (skipped without a working GPU).

Also runnable without pytest on a GPU machine:
`PYTHONPATH=. python3 tests/test_solver_gpu.py` prints one line per check.
"""

import json
import tempfile
from pathlib import Path

import numpy as np

try:
    import pytest
except ImportError:  # plain-script mode on a machine without pytest
    pytest = None

from solver.backend import Backend, CupyBackend, _cupy_or_reason, get_backend
from solver.params import SolveParams
from solver.rls import make_rls
from solver.solve import solve
from solver.synthetic import make_features

CP, WHY = _cupy_or_reason()
if pytest is not None:
    pytestmark = [
        pytest.mark.gpu,
        pytest.mark.skipif(CP is None, reason=f"no working CuPy: {WHY}"),
    ]

D, WIDTH = 24, 256


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def features(root):
    return make_features(
        Path(root) / "extract", [150, 97, 131], [3, 2, 4], feature_dim=D, seed=1
    )


def read(path):
    from solver.weights import WeightsFile

    wf = WeightsFile(path)
    return [wf.W(k) for k in range(1, wf.n_steps + 1)]


def test_kernels_match_numpy():
    rng = np.random.default_rng(0)
    H = np.abs(rng.standard_normal((50, 32)))
    g, n = CupyBackend(CP), Backend()
    for kernel in ("syrk", "gemm"):
        g.gram_kernel = kernel
        Gg, Gn = g.sym_empty(32, np.float64), n.sym_empty(32, np.float64)
        g.syrk_(Gg, g.asarray(H).T)
        n.syrk_(Gn, H.T)
        low = np.tril_indices(32)
        assert rel(g.to_host(Gg)[low], Gn[low]) < 1e-13, kernel
    g.add_diag_(Gg, 1.0)
    n.add_diag_(Gn, 1.0)
    B = rng.standard_normal((32, 5))
    # symm reads the lower triangle; check it before cholesky_ overwrites G
    S = g.to_host(g.symm(Gg, g.asarray(B)))
    assert rel(S, n.symm(Gn, B)) < 1e-12
    Lg, Ln = g.cholesky_(Gg), n.cholesky_(Gn)
    assert rel(g.to_host(g.cho_solve(Lg, g.asarray(B))), n.cho_solve(Ln, B)) < 1e-11
    for trans in (True, False):
        P = rng.standard_normal((7, 32))
        want = n.trsm_right_(Ln, np.asfortranarray(P), trans)
        got = g.to_host(g.trsm_right_(Lg, g.asarray(P), trans))
        assert rel(got, want) < 1e-11, trans


def test_solve_on_cupy_matches_numpy():
    with tempfile.TemporaryDirectory() as tmp:
        f = features(tmp)
        p = SolveParams(eta=(0.1, 1.0), width=WIDTH, batch_rows=50)
        for method in ("gram", "woodbury"):
            pm = SolveParams(**{**p.__dict__, "method": method})
            cpu = solve(f, Path(tmp) / f"c{method}", pm, backend=Backend())
            for kernel in ("syrk", "gemm"):
                g = CupyBackend(CP)
                g.gram_kernel = kernel
                gpu = solve(f, Path(tmp) / f"g{method}{kernel}", pm, backend=g)
                for a, b in zip(cpu, gpu, strict=True):
                    for Wa, Wb in zip(read(a), read(b), strict=True):
                        assert rel(Wb, Wa) < 1e-9, (method, kernel)


def test_dual_form_on_cupy_matches_numpy():
    with tempfile.TemporaryDirectory() as tmp:
        f = make_features(
            Path(tmp) / "x", [100, 60, 300], [2, 3, 2], feature_dim=D, seed=5
        )
        p = SolveParams(eta=(0.1, 1.0), width=512, batch_rows=45)
        cpu = solve(f, Path(tmp) / "c", p, backend=Backend())
        gpu = solve(f, Path(tmp) / "g", p, backend=CupyBackend(CP))
        for a, b in zip(cpu, gpu, strict=True):
            for Wa, Wb in zip(read(a), read(b), strict=True):
                assert rel(Wb, Wa) < 1e-9


def test_auto_picks_cupy_and_evaluate_agrees():
    from solver.evaluate import evaluate

    assert get_backend("auto").name == "cupy"
    with tempfile.TemporaryDirectory() as tmp:
        f = features(tmp)
        (w,) = solve(f, Path(tmp) / "s", SolveParams(width=WIDTH, device="cpu"))
        (a,) = evaluate(f, [w], Path(tmp) / "a", backend=Backend())
        (b,) = evaluate(f, [w], Path(tmp) / "b", backend=get_backend("cuda"))
        ma, mb = json.loads(a.read_text()), json.loads(b.read_text())
        assert ma["matrix"] == mb["matrix"] and ma["acc"] == mb["acc"]


def test_woodbury_state_on_cupy_keeps_zero_columns():
    g = CupyBackend(CP)
    rls = make_rls("woodbury", g, 16, (1.0,), max_classes=4)
    H = g.asarray(np.abs(np.random.default_rng(0).standard_normal((10, 16))))
    rls.partial_fit(H, g.asarray(np.array([0, 1] * 5)), classes_seen=2)
    assert float(abs(rls.W_[0][:, 2:]).max()) == 0.0


if __name__ == "__main__":
    if CP is None:
        raise SystemExit(f"skipped: no working GPU ({WHY})")
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"ok {name}")
