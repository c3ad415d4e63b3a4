"""`solve.heads` through the solve and evaluate stages: heads.h5 from the
one pass that writes weights.h5, each head's arrays equal to the heads of
`solver.heads` on the same rows, scored into heads.json and heads.md."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from palcore.errors import ParamsError
from solver import heads as hd
from solver.backend import get_backend
from solver.evaluate import evaluate
from solver.head_eval import evaluate_heads, heads_report, heads_table, read_heads
from solver.metrics import metrics_json
from solver.params import SolveParams
from solver.rls import upsampling_matrix
from solver.shard_readers import open_features
from solver.show import cli as show_cli
from solver.solve import solve
from solver.synthetic import make_features
from solver.weights import WeightsFile

D, WIDTH = 16, 48
ALL = ("ridge", "ridge_all", "air", "dsal", "ncm", "lda")


@pytest.fixture(scope="module")
def feats(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return make_features(root / "x", [90, 60, 120], [2, 3, 2], feature_dim=D, seed=5)


def _solve(feats, out, **kw):
    params = SolveParams(width=WIDTH, eta=0.5, heads=ALL, **kw)
    solve(feats, out, params, backend=get_backend("cpu"))
    return read_heads(Path(out) / "heads.h5")


def _reference(feats, eta=0.5):
    """Every step's heads from `solver.heads` on all rows read at once."""
    W_up = upsampling_matrix(D, WIDTH, 0)
    s = hd.HeadStats(WIDTH, D, 7, heads=ALL, dsal_eta=eta)
    out = {}
    for step in open_features(feats):
        X, y, _, _ = step.train.read_all()
        X = X.astype(np.float64)
        Z = X @ W_up
        s.begin_task(y)
        s.add(np.maximum(Z, 0), X, y, np.arange(len(y)), Z=Z)
        s.end_task()
        k = step.classes_seen
        coef, icpt = hd.lda(s, 0.1)
        out[step.step] = {
            "ridge": hd.ridge(s, eta)[:, :k],
            "air": hd.air(s, eta)[:, :k],
            "dsal": hd.dsal(s, eta)[:, :k],
            "ncm": hd.class_means(s)[:k],
            "lda": (coef[:k], icpt[:k]),
            "ridge_all": hd.eta_over_tasks(s, [0.01, 0.1, 1.0, 10.0, 100.0]),
        }
    return out


def test_heads_file_equals_the_heads_on_the_same_rows(feats, tmp_path):
    attrs, solved = _solve(feats, tmp_path / "a", batch_rows=4096)
    ref = _reference(feats)
    weights = WeightsFile(tmp_path / "a" / "weights.h5")
    assert attrs["heads"] == list(ALL) and sorted(solved) == [1, 2, 3]
    for k, r in ref.items():
        got = solved[k]
        assert got["ridge"]["W"].shape == (WIDTH, weights.classes_seen[k - 1])
        assert np.abs(got["ridge"]["W"] - weights.W(k)).max() < 1e-9
        assert np.abs(got["ridge"]["W"] - r["ridge"]).max() < 1e-9
        assert np.abs(got["air"]["W"] - r["air"]).max() < 1e-9
        assert np.abs(got["dsal"]["W_comp"] - r["dsal"]).max() < 1e-9
        assert np.abs(got["ncm"]["means"] - r["ncm"]).max() < 1e-9
        assert np.abs(got["lda"]["coef"] - r["lda"][0]).max() < 1e-9
        assert np.abs(got["lda"]["intercept"] - r["lda"][1]).max() < 1e-9
        chosen, sse = r["ridge_all"]
        assert got["ridge_all"]["eta"] == chosen
        assert np.allclose(got["ridge_all"]["sse"], sse, rtol=1e-9, atol=0)
    # the heads' own sums: Gv, Gair, Gc (E x E); Qv, Qair, Qc, Hsum (E x C);
    # n (C); Xsum (C x D); Sw (D x D). G and Q are the solve's, lent.
    assert attrs["state_bytes"] == 8 * (
        3 * WIDTH**2 + 4 * WIDTH * 7 + 7 + 7 * D + D * D
    )


def test_heads_sum_their_own_gram_beside_woodbury(feats, tmp_path):
    """With solve.method woodbury (no G to lend) the heads sum G and Q
    themselves: the same heads as beside gram."""
    attrs, own = _solve(feats, tmp_path / "w", method="woodbury")
    _, lent = _solve(feats, tmp_path / "g")
    assert attrs["state_bytes"] == 8 * (
        4 * WIDTH**2 + 5 * WIDTH * 7 + 7 + 7 * D + D * D
    )
    for k in own:
        for head, key in [("ridge", "W"), ("air", "W"), ("ridge_all", "W"),
                          ("dsal", "W_comp"), ("lda", "coef")]:  # fmt: skip
            assert np.abs(own[k][head][key] - lent[k][head][key]).max() < 1e-8


def test_both_eta_rules_read_one_path_per_step(feats, tmp_path, monkeypatch):
    """`eta: auto` beside head ridge_all: one Cholesky per η of the grid and
    step serves both rules (the heads fit no path of their own), and
    ridge_all's choice still equals the heads' own rule on the same rows."""
    from solver.rls import GramRLS

    calls = {"without": 0, "own path": 0}
    without, own_path = GramRLS.weights_without, hd.eta_path

    def count_without(*args, **kwargs):
        calls["without"] += 1
        return without(*args, **kwargs)

    def count_own(*args, **kwargs):
        calls["own path"] += 1
        return own_path(*args, **kwargs)

    monkeypatch.setattr(GramRLS, "weights_without", count_without)
    monkeypatch.setattr(hd, "eta_path", count_own)
    params = SolveParams(width=WIDTH, eta="auto", heads=("ridge", "ridge_all"))
    solve(feats, tmp_path / "auto", params, backend=get_backend("cpu"))
    assert calls == {"without": 3 * len(params.eta_grid), "own path": 0}
    monkeypatch.undo()
    _, solved = read_heads(tmp_path / "auto" / "heads.h5")
    ref = _reference(feats)
    for k in solved:
        chosen, sse = ref[k]["ridge_all"]
        assert solved[k]["ridge_all"]["eta"] == chosen
        assert np.allclose(solved[k]["ridge_all"]["sse"], sse, rtol=1e-9, atol=0)


def test_dsal_keeps_its_own_eta_under_eta_auto(feats, tmp_path):
    """DS-AL's residuals are taken batch by batch before a step's η is
    chosen: both its streams stay at η 1 under `eta: auto`, recorded as its
    η, while the ridge takes the chosen one."""
    params = SolveParams(width=WIDTH, eta="auto", heads=("ridge", "dsal"))
    solve(feats, tmp_path / "auto", params, backend=get_backend("cpu"))
    _, solved = read_heads(tmp_path / "auto" / "heads.h5")
    ref = _reference(feats, eta=1.0)
    W_up = upsampling_matrix(D, WIDTH, 0)
    s = hd.HeadStats(WIDTH, D, 7, heads=("dsal",), dsal_eta=1.0)
    assert {solved[k]["eta"] for k in solved} != {1.0}  # auto moved the ridge's
    for k, step in zip(solved, open_features(feats), strict=True):
        X, y, _, _ = step.train.read_all()
        Z = X.astype(np.float64) @ W_up
        s.begin_task(y)
        s.add(np.maximum(Z, 0), X, y, np.arange(len(y)), Z=Z)
        s.end_task()
        main = hd.ridge(s, 1.0)[:, : step.classes_seen]
        assert solved[k]["dsal"]["eta"] == 1.0
        assert np.abs(solved[k]["dsal"]["W_main"] - main).max() < 1e-9
        assert np.abs(solved[k]["dsal"]["W_comp"] - ref[k]["dsal"]).max() < 1e-9


def test_heads_do_not_depend_on_the_chunks_but_dsal(feats, tmp_path):
    _, one = _solve(feats, tmp_path / "one", batch_rows=4096)
    _, many = _solve(feats, tmp_path / "many", batch_rows=17)
    for k in one:
        for head, key in [("ridge", "W"), ("air", "W"), ("ridge_all", "W"),
                          ("ncm", "means"), ("lda", "coef")]:  # fmt: skip
            assert np.abs(one[k][head][key] - many[k][head][key]).max() < 1e-9
    # DS-AL's residuals follow the chunks: its stream is another
    diff = max(
        np.abs(one[k]["dsal"]["W_comp"] - many[k]["dsal"]["W_comp"]).max() for k in one
    )
    assert diff > 1e-6


def test_evaluate_scores_each_head_and_ridge_is_the_weights(feats, tmp_path):
    _solve(feats, tmp_path / "s")
    backend = get_backend("cpu")
    evaluate(feats, [tmp_path / "s"], tmp_path / "e", backend)
    steps = open_features(feats)
    path = evaluate_heads(steps, tmp_path / "s", tmp_path / "e", backend, 25)
    assert path == tmp_path / "e" / "heads.json"
    got = json.loads(path.read_text())
    main = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert sorted(got) == sorted((*ALL, "shared_bytes"))
    assert got["shared_bytes"] == 8 * (WIDTH**2 + WIDTH * 7 + 7)
    assert got["air"]["state_bytes"] == 8 * (WIDTH**2 + WIDTH * 7)
    for key in ("acc", "fg", "last", "aia", "matrix"):
        assert got["ridge"][key] == main[key]
    assert got["ridge"]["eta_by_step"] == [0.5, 0.5, 0.5]
    assert "eta_by_step" not in got["ncm"] and "eta_by_step" not in got["lda"]
    for head in ALL:
        assert [len(row) for row in got[head]["matrix"]] == [1, 2, 3]
    # heads.md: one row per variant x head, mean ± std over the runs
    for run in (1, 2):
        (tmp_path / "ev" / "pal" / str(run)).mkdir(parents=True)
        (tmp_path / "ev" / "pal" / str(run) / "heads.json").write_text(path.read_text())
    report = heads_report([tmp_path / "ev"], ["pal"], [1, 2])
    assert list(report) == sorted(ALL) and list(report["air"]) == ["pal"]
    assert report["ridge"]["pal"]["acc"] == {
        "mean": got["ridge"]["acc"],
        "std": 0.0,
        "runs": [got["ridge"]["acc"]] * 2,
    }
    assert report["ncm"]["pal"]["state_bytes"] == 8 * 7 * WIDTH  # its class sums
    table = heads_table(report, [1, 2])
    rows = [line for line in table.splitlines() if line.startswith("| pal |")]
    assert len(rows) == 6 + 4  # the scores, then the η of the 4 heads with one
    acc = f"{got['ridge']['acc']:.2f} ± 0.00"
    assert f"| pal | ridge | {acc} |" in table
    assert "| pal | ridge | 0.5; 0.5; 0.5 | 0.5; 0.5; 0.5 |" in table
    # pal-solver show --head: the head's rows of the report's heads.json
    folder = tmp_path / "report"
    folder.mkdir()
    runs = {"runs": [1, 2], "vary": ["upsampling"]}
    (folder / "heads.json").write_text(metrics_json(runs | report))
    shown = CliRunner().invoke(show_cli, [str(folder), "--head", "ncm"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == f"{folder / 'heads.json'}: head ncm, accuracy (%)"
    assert lines[2].split()[:4] == ["pal", f"{got['ncm']['acc']:.2f}", "±", "0.00"]
    assert lines[-1] == (  # 8 · 7 classes · 48 = 2,688 bytes: its class sums
        "ncm's own state: 2.6 KiB per chain, beside the G, Q and class counts "
        "every head shares"
    )
    shown = CliRunner().invoke(show_cli, [str(folder), "--head", "svm"])
    assert shown.exit_code == 1
    assert shown.output.splitlines()[-1] == (
        f"Error: {folder / 'heads.json'}: no head 'svm' (heads: air, dsal, lda, "
        "ncm, ridge, ridge_all; add it to solve.heads and rerun solve and evaluate)"
    )
    assert heads_report([tmp_path / "none"], ["pal"], [1]) == {}
    assert heads_table({}, [1]) == "No heads: solve.heads is empty.\n"


def test_an_empty_heads_list_removes_a_stale_heads_file(feats, tmp_path):
    _solve(feats, tmp_path / "s")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "heads.json").write_text("{}")
    solve(feats, tmp_path / "s", SolveParams(width=WIDTH), backend=get_backend("cpu"))
    assert not (tmp_path / "s" / "heads.h5").exists()
    steps = open_features(feats)
    backend = get_backend("cpu")
    assert evaluate_heads(steps, tmp_path / "s", tmp_path / "e", backend, 25) is None
    assert not (tmp_path / "e" / "heads.json").exists()


def test_heads_params_are_checked():
    with pytest.raises(ParamsError, match=r"^solve.heads lists 'air' twice$"):
        SolveParams(heads=("air", "ncm", "air"))
    with pytest.raises(ParamsError, match=r"^solve.lda_shrinkage must lie in"):
        SolveParams(lda_shrinkage=1.5)
    with pytest.raises(ValueError, match=r"^unknown head 'svm': one of ridge, "):
        hd.HeadStats(4, 2, 2, heads=("svm",))


def test_lda_scores_only_the_classes_seen():
    r = np.random.default_rng(0)
    X = r.normal(size=(60, 3))
    y = np.repeat([0, 1, 2], 20)
    s = hd.HeadStats(5, 3, 5, heads=("lda",))
    s.begin_task(y)
    s.add(np.abs(X @ r.normal(size=(3, 5))), X, y, np.arange(60))
    coef, icpt = hd.lda(s, 0.2)
    assert np.isneginf(icpt[3:]).all() and (coef[3:] == 0).all()
    assert np.isfinite(icpt[:3]).all()


def test_the_head_names_are_one_list_everywhere():
    """solve.heads' Literal and pal-paper's heads grid name the heads of
    solver.heads, in its order."""
    import typing

    from palpaper.grids import HEAD_NAMES
    from solver.api import HEADS
    from solver.params import HeadName

    assert HEADS == typing.get_args(HeadName) == HEAD_NAMES == ALL


def test_the_lent_gram_is_made_whole_block_by_block():
    """The solve's G keeps its lower triangle only: the heads read it made
    whole, blocks that do not divide the width included."""
    from solver.head_fit import _symmetrize

    A = np.random.default_rng(3).standard_normal((50, 50))
    whole = A + A.T
    lower = np.asfortranarray(np.tril(whole) + np.triu(np.full((50, 50), 7.0), 1))
    out = np.empty_like(lower)
    _symmetrize(out, lower, np, block=16)
    assert np.array_equal(out, whole)
