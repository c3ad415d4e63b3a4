import numpy as np
import pytest

from solver import heads

E, D, C = 12, 6, 4
NO_DSAL = tuple(h for h in heads.HEADS if h != "dsal")


def _data(seed=0, n=200, classes=range(C)):
    r = np.random.default_rng(seed)
    y = r.choice(list(classes), n)
    X = r.normal(size=(n, D)) + y[:, None] * 0.5
    H = np.maximum(X @ r.normal(size=(D, E)), 0) + 0.1
    return H, X, y, np.arange(n)


def _stats(H, X, y, ids, bs=37):
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    s.begin_task(y)
    for i in range(0, len(y), bs):
        s.add(H[i : i + bs], X[i : i + bs], y[i : i + bs], ids[i : i + bs])
    s.end_task()
    return s


def _train(H, X, y, ids):
    """Every head is fitted on every row (the fold only scores eta)."""
    return H, X, y, np.ones(len(y), bool)


def test_ridge_matches_direct_solve():
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    Ht, _, yt, _ = _train(H, X, y, ids)
    Y = np.eye(C)[yt]
    ref = np.linalg.solve(Ht.T @ Ht + 0.5 * np.eye(E), Ht.T @ Y)
    assert np.abs(heads.ridge(s, 0.5) - ref).max() < 1e-9


def test_air_matches_per_class_formula():
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    Ht, _, yt, _ = _train(H, X, y, ids)
    n = np.bincount(yt, minlength=C).astype(float)
    pi = (1 / n) * C / (1 / n).sum()
    A = sum(pi[c] * Ht[yt == c].T @ Ht[yt == c] for c in range(C))
    Qc = (Ht.T @ np.eye(C)[yt]) * pi
    ref = np.linalg.inv(A + 0.5 * np.eye(E)) @ Qc
    assert np.abs(heads.air(s, 0.5) - ref).max() < 1e-9
    # the check can fail: weights 1/n_y not rescaled to mean 1 are another W
    wrong = sum((1 / n[c]) * Ht[yt == c].T @ Ht[yt == c] for c in range(C))
    off = np.linalg.inv(wrong + 0.5 * np.eye(E)) @ ((Ht.T @ np.eye(C)[yt]) / n)
    assert np.abs(heads.air(s, 0.5) - off).max() > 1e-3


def test_air_over_two_tasks_holds_one_gram_and_merges():
    """Tasks of classes {0, 1} then {2, 3}: AIR's sums are one E x E each;
    two states that each saw half of every task's rows merge into the one
    that saw them all."""
    H, X, y, ids = _data(n=300)
    tasks = [np.isin(y, [0, 1]), np.isin(y, [2, 3])]
    whole = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    halves = [
        heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL) for _ in range(2)
    ]
    for task in tasks:
        Ht, Xt, yt, it = H[task], X[task], y[task], ids[task]
        whole.begin_task(yt)
        whole.add(Ht, Xt, yt, it)
        whole.end_task()
        for k, half in enumerate(halves):
            half.begin_task(yt)  # every shard's labels counted
            part = slice(k * len(yt) // 2, (k + 1) * len(yt) // 2)
            half.add(Ht[part], Xt[part], yt[part], it[part])
    merged = halves[0].merge(halves[1])
    merged.end_task()
    # AIR holds one E x E and one E x C, whatever the classes
    assert (whole.Gair.nbytes, whole.Qair.nbytes) == (8 * E * E, 8 * E * C)
    for head in (heads.ridge, heads.air):
        assert np.abs(head(merged, 0.5) - head(whole, 0.5)).max() < 1e-9
    s = _stats(H, X, y, ids)  # the same rows as one task: the same AIR W
    assert np.abs(heads.air(s, 0.5) - heads.air(whole, 0.5)).max() < 1e-9


def test_ncm_matches_class_means():
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    Ht, _, yt, _ = _train(H, X, y, ids)
    mu = np.stack([Ht[yt == c].mean(0) for c in range(C)])
    ref = (H / np.linalg.norm(H, axis=1)[:, None]) @ (
        mu / np.linalg.norm(mu, axis=1)[:, None]
    ).T
    assert np.abs(heads.ncm(s, H) - ref).max() < 1e-9


def test_lda_matches_sklearn():
    lda_cls = pytest.importorskip("sklearn.discriminant_analysis")
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    _, Xt, yt, _ = _train(H, X, y, ids)
    m = lda_cls.LinearDiscriminantAnalysis(
        solver="lsqr", shrinkage=0.1, priors=np.full(C, 1 / C)
    ).fit(Xt, yt)
    coef, icpt = heads.lda(s, 0.1)
    assert np.abs(X @ coef.T + icpt - m.decision_function(X)).max() < 1e-9


def test_val_sse_matches_fold_residual():
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    v = heads.held_out(ids, 3, 0.2)
    W = np.random.default_rng(1).normal(size=(E, C))
    ref = ((np.eye(C)[y[v]] - H[v] @ W) ** 2).sum()
    assert abs(heads.val_sse(s, W) - ref) < 1e-9 * max(1.0, ref)


def test_eta_path_matches_direct():
    H, X, y, ids = _data()
    s = _stats(H, X, y, ids)
    etas = [0.01, 1.0, 100.0]
    v = heads.held_out(ids, 3, 0.2)
    Hf, Y = H[~v], np.eye(C)[y[~v]]  # the rows outside the fold
    for W, e in zip(heads.eta_path(s, etas), etas, strict=True):
        ref = np.linalg.solve(Hf.T @ Hf + e * np.eye(E), Hf.T @ Y)
        assert np.abs(W - ref).max() < 1e-9
    # the path is fitted without the fold: not the ridge on every row
    assert np.abs(heads.eta_path(s, [1.0])[0] - heads.ridge(s, 1.0)).max() > 1e-3


def test_merge_equals_all_rows():
    H, X, y, ids = _data()
    a = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    b = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    a.begin_task(y)
    b.begin_task(y)
    a.add(H[:90], X[:90], y[:90], ids[:90])
    b.add(H[90:], X[90:], y[90:], ids[90:])
    m = a.merge(b)
    m.end_task()
    s = _stats(H, X, y, ids)
    assert np.abs(heads.ridge(m, 0.5) - heads.ridge(s, 0.5)).max() < 1e-9
    assert np.abs(heads.air(m, 0.5) - heads.air(s, 0.5)).max() < 1e-9


def test_recurring_class_refused():
    H, X, y, ids = _data(classes=[0, 1])
    s = _stats(H, X, y, ids)
    with pytest.raises(ValueError, match=r"^class 0 recurs after its task ended$"):
        s.begin_task(np.zeros(5, int))
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    with pytest.raises(ValueError, match=r"^add: begin_task first"):
        s.add(H[:5], X[:5], y[:5], ids[:5])
    s.begin_task(y[:100])
    s.add(H[:50], X[:50], y[:50], ids[:50])  # half the rows counted
    with pytest.raises(
        ValueError, match=r"^class \d: \d+ rows added, \d+ counted by begin_task$"
    ):
        s.end_task()


def _dsal_reference(batches, gamma_main, gamma_comp):
    """DS-AL's batch code (analytic/DSAL.py): both streams by the recursive
    update, batch by batch; the residual of the main stream after its update,
    with every column but the batch's task's new classes (`new`) zeroed."""
    R = [np.eye(E) / gamma_main, np.eye(E) / gamma_comp]
    W = [np.zeros((E, C)), np.zeros((E, C))]

    def rls(i, F, Y):
        K = np.linalg.inv(np.eye(len(F)) + F @ R[i] @ F.T)
        R[i] = R[i] - R[i] @ F.T @ K @ F @ R[i]
        W[i] = W[i] + R[i] @ F.T @ (Y - F @ W[i])

    for Hb, Zb, Yb, new in batches:
        rls(0, Hb, Yb)
        Yc = Yb - Hb @ W[0]
        Yc[:, ~new] = 0.0
        rls(1, np.tanh(Zb), Yc)
    return W


def test_dsal_matches_its_batch_code_and_depends_on_the_order():
    r = np.random.default_rng(4)
    n = 160
    X = r.normal(size=(n, D))
    y = r.choice([0, 1, 2, 3], n)
    Z = X @ r.normal(size=(D, E))
    H = np.maximum(Z, 0)
    ids = np.arange(n)
    every = np.ones(C, bool)
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, dsal_eta=0.5)
    s.begin_task(y)
    batches = []
    for i in range(0, n, 40):
        b = np.arange(i, i + 40)
        s.add(H[b], X[b], y[b], ids[b], Z=Z[b])
        batches.append((H[b], Z[b], np.eye(C)[y[b]], every))
    main, comp = _dsal_reference(batches, 0.5, 0.2)
    assert np.abs(heads.ridge(s, 0.5) - main).max() < 1e-9
    assert np.abs(heads.dsal(s, 0.2) - comp).max() < 1e-9
    out = heads.dsal_scores(H, Z, main, comp, 0.6)
    assert np.abs(out - (H @ main + 0.6 * np.tanh(Z) @ comp)).max() < 1e-12
    # the residuals follow the batches' order: reversed, another stream
    _, other = _dsal_reference(batches[::-1], 0.5, 0.2)
    assert np.abs(other - comp).max() > 1e-6
    # a second task zeroes the first task's classes' residual columns
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, dsal_eta=0.5)
    batches = []
    for classes in ([0, 1], [2, 3]):
        task = np.flatnonzero(np.isin(y, classes))
        s.begin_task(y[task])
        s.add(H[task], X[task], y[task], ids[task], Z=Z[task])
        new = np.isin(range(C), classes)
        batches.append((H[task], Z[task], np.eye(C)[y[task]], new))
    _, comp = _dsal_reference(batches, 0.5, 0.2)
    assert np.abs(heads.dsal(s, 0.2) - comp).max() < 1e-9
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, dsal_eta=0.5)
    s.begin_task(y)
    with pytest.raises(ValueError, match=r"^add: DS-AL's stream needs Z"):
        s.add(H[:4], X[:4], y[:4], ids[:4])


def test_eta_over_tasks_scores_every_tasks_fold_without_its_rows():
    """Two tasks: the error of each eta is the squared error, on both tasks'
    held-out rows, of the ridge fitted on the other rows; the rule picks
    the least."""
    H, X, y, ids = _data(n=300)
    s = heads.HeadStats(E, D, C, seed=3, holdout=0.2, heads=NO_DSAL)
    for classes in ([0, 1], [2, 3]):
        task = np.isin(y, classes)
        s.begin_task(y[task])
        s.add(H[task], X[task], y[task], ids[task])
    s.end_task()
    v = heads.held_out(ids, 3, 0.2)
    Y = np.eye(C)[y]
    etas = [1e-3, 1e-1, 1e1, 1e3]
    ref = []
    for eta in etas:
        W = np.linalg.solve(H[~v].T @ H[~v] + eta * np.eye(E), H[~v].T @ Y[~v])
        ref.append(((Y[v] - H[v] @ W) ** 2).sum())
    chosen, errors = heads.eta_over_tasks(s, etas)
    assert np.allclose(errors, ref, rtol=1e-9, atol=0)
    assert chosen == etas[int(np.argmin(ref))]
    # a fold of the first task only would score another error
    first = v & np.isin(y, [0, 1])
    W = np.linalg.solve(H[~v].T @ H[~v] + etas[0] * np.eye(E), H[~v].T @ Y[~v])
    assert abs(((Y[first] - H[first] @ W) ** 2).sum() - ref[0]) > 1e-6


def test_flop_model_moves_the_eta_path_into_an_auto_solve():
    """solve_flops: the η path (the fold's SYRK, a factorisation per η and
    step) is ridge_all's beside a fixed η and the solve's own with `auto`."""
    E, n, D, C, steps, chunk = 100, 1000, 10, 4, 2, 400
    chol = E**3 / 3 + 2 * E * E * C
    path = 0.2 * n * E * E + steps * 5 * chol
    fixed = heads.solve_flops(E, n, D, C, steps, chunk)
    auto = heads.solve_flops(E, n, D, C, steps, chunk, auto=True)
    assert fixed["solve"] == 2 * n * D * E + n * E * E + 2 * n * E * C + steps * chol
    assert auto["solve"] == fixed["solve"] + path
    assert fixed["ridge_all"] == steps * chol + path
    assert auto["ridge_all"] == steps * chol
    # DS-AL: 2 chunks in each step's 500 rows (400 + 100), not 1000 / 400 -> 3
    assert fixed["dsal"] == auto["dsal"] == n * E * E + 4 * chol + steps * chol
    assert fixed["ncm"] == 2 * n * E * C and fixed["ridge"] == 0.0
