"""The solver's public face (`solver.api`, DESIGN §9): code outside `solver/`
imports only its public modules, and `solver/` never imports torch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from solver.api import Classifier, SolveParams, evaluate, fit, make_features
from solver.shard_readers import open_features

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"solver", "solver.api", "solver.cli", "solver.shards", "solver.shard_readers"}
# the project's code outside solver/; tests/ may test the inside
OUTSIDE = ("pipeline", "palpaper", "palcore", "palbench", "bench")
NEVER_IN_SOLVER = {"torch", "transformers"}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, inside functions too;
    `from solver import x` counts as `solver.x`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module == "solver":
                out += [(node.lineno, f"solver.{a.name}") for a in node.names]
    return out


def inside_solver(root: Path) -> list[str]:
    """`path:line module` for each import of a non-public solver module by
    a module of the folders OUTSIDE below `root`."""
    bad = []
    for folder in OUTSIDE:
        for path in sorted((root / folder).rglob("*.py")):
            for line, module in imported(path):
                if module.split(".")[0] == "solver" and module not in PUBLIC:
                    bad.append(f"{path.relative_to(root)}:{line} {module}")
    return bad


def test_outside_code_imports_only_the_public_modules():
    assert inside_solver(ROOT) == []


def test_the_check_finds_an_import_of_the_inside(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.py").write_text(
        "import solver.api\nfrom solver import shards, rls\n"
        "def f():\n    from solver.backend import get_backend\n",
        encoding="utf-8",
    )
    assert inside_solver(tmp_path) == [
        "bench/x.py:2 solver.rls",
        "bench/x.py:4 solver.backend",
    ]


def test_solver_never_imports_torch():
    found = [
        f"{path.relative_to(ROOT)}:{line} {module}"
        for path in sorted((ROOT / "solver").rglob("*.py"))
        for line, module in imported(path)
        if module.split(".")[0] in NEVER_IN_SOLVER
    ]
    assert found == []


def test_classifier_logits_are_the_upsampled_features_times_w(tmp_path):
    features = make_features(tmp_path / "f", n_steps=2, feature_dim=8, seed=3)
    params = SolveParams(width=16, seed=5, device="cpu")
    (path,) = fit(features, tmp_path / "s", params)
    clf = Classifier(path)
    X = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    rng = np.random.default_rng(5)  # solve.seed: W_up as DESIGN §4 makes it
    W_up = rng.uniform(-1 / np.sqrt(8), 1 / np.sqrt(8), size=(8, 16))
    H = np.maximum(X.astype(np.float64) @ W_up, 0)
    logits = clf.logits(X, 2)
    assert logits.shape == (6, clf.classes_seen[1]) == (6, 8)
    np.testing.assert_allclose(logits, H @ clf.W(2), rtol=1e-12, atol=1e-12)
    assert clf.info.width == 16 and clf.info.seed == 5 and clf.n_steps == 2


def test_classifier_accuracy_is_what_evaluate_reports(tmp_path):
    """argmax of the classifier's logits over step k's test rows counts the
    hits `evaluate` reports for that step."""
    features = make_features(tmp_path / "f", n_steps=2, feature_dim=8, seed=3)
    (path,) = fit(features, tmp_path / "s", SolveParams(width=16, device="cpu"))
    (metrics,) = evaluate(features, [path], tmp_path / "e")
    reported = json.loads(metrics.read_text(encoding="utf-8"))["step_accuracy"]
    clf = Classifier(path)
    steps = open_features(features)
    for k, shards in enumerate(steps, start=1):
        hits = total = 0
        for task in range(1, k + 1):
            X, y, *_ = shards.test[task].read_all()
            hits += int((clf.logits(X, k).argmax(axis=1) == y).sum())
            total += len(y)
        assert reported[k - 1] == pytest.approx(100.0 * hits / total, abs=1e-4)
