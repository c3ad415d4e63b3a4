"""The feature-shard contract (DESIGN §3): writing, validation, streaming."""

import shutil

import h5py
import numpy as np
import pytest

from palcore.errors import ShardError
from solver.shard_readers import open_features, open_step
from solver.shards import Block, ShardAttrs, write_test, write_train
from solver.synthetic import make_features

D = 8


def block(n, classes=3, seed=0, bp=False, dtype=np.float32, dim=D):
    rng = np.random.default_rng(seed)
    return Block(
        features=rng.standard_normal((n, dim)).astype(dtype),
        labels=rng.integers(0, classes, size=n).astype(np.int64),
        missing=rng.integers(0, 3, size=n).astype(np.int8),
        sample_ids=[f"id{seed}-{i}" for i in range(n)],
        bp_logits=rng.standard_normal((n, classes)).astype(np.float32) if bp else None,
    )


def write_step(root, step, n=20, classes=3, dim=D, bp=False, parts=None):
    """One step folder: train.h5 (or train parts of sizes `parts`) and test.h5."""
    folder = root / f"step_{step:02d}"
    attrs = ShardAttrs(step, classes, dim, {"source": "test"})
    if parts:
        for i, size in enumerate(parts):
            write_train(folder / f"train-{i:05d}.h5", block(size, classes, i), attrs)
    else:
        write_train(folder / "train.h5", block(n, classes, step, dim=dim), attrs)
    tasks = {t: block(5, classes, 100 + t, bp, dim=dim) for t in range(1, step + 1)}
    write_test(folder / "test.h5", tasks, attrs)
    return folder


@pytest.fixture
def features(tmp_path):
    root = tmp_path / "extract"
    for step in (1, 2, 3):
        write_step(root, step, n=10 + step, classes=2 * step)
    return root


def test_round_trip_and_chunks(features):
    steps = open_features(features)
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.classes_seen for s in steps] == [2, 4, 6]
    assert [s.train.n_rows for s in steps] == [11, 12, 13]
    assert sorted(steps[2].test) == [1, 2, 3]
    want = block(13, 6, 3)
    chunks = list(steps[2].train.iter_chunks(5))
    assert [len(c[1]) for c in chunks] == [5, 5, 3]
    X = np.concatenate([c[0] for c in chunks])
    np.testing.assert_array_equal(X, want.features)
    assert X.dtype == np.float32
    x, y, m, bp = steps[2].train.read_all()
    np.testing.assert_array_equal(y, want.labels)
    np.testing.assert_array_equal(m, want.missing)
    assert bp is None
    assert steps[2].train.sample_ids() == list(want.sample_ids)


def test_identical_content_gives_identical_bytes(tmp_path):
    attrs = ShardAttrs(1, 3, D, {"params": '{"a": 1}'})
    a = write_train(tmp_path / "a" / "train.h5", block(7), attrs)
    b = write_train(tmp_path / "b" / "train.h5", block(7), attrs)
    assert a.read_bytes() == b.read_bytes()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["train.h5"]


def test_float16_features_and_bp_logits(tmp_path):
    root = tmp_path / "x"
    folder = root / "step_01"
    attrs = ShardAttrs(1, 3, D)
    write_train(folder / "train.h5", block(4, dtype=np.float16), attrs)
    write_test(folder / "test.h5", {1: block(6, bp=True)}, attrs)
    (s,) = open_features(root)
    assert s.test[1].has_bp_logits
    x, _, _, bp = s.test[1].read_all(with_bp_logits=True)
    np.testing.assert_array_equal(bp, block(6, bp=True).bp_logits)
    assert next(s.train.iter_chunks(10))[0].dtype == np.float16


def test_parts_are_read_in_name_order_as_one_shard(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1, parts=[4, 3, 5])
    (s,) = open_features(root)
    assert s.train.n_rows == 12
    y = np.concatenate([c[1] for c in s.train.iter_chunks(5)])
    want = np.concatenate([block(k, 3, i).labels for i, k in enumerate([4, 3, 5])])
    np.testing.assert_array_equal(y, want)
    assert s.train.sample_ids()[4] == "id1-0"


def test_single_file_and_parts_together_is_an_error(tmp_path):
    folder = write_step(tmp_path / "x", 1, parts=[3])
    shutil.copy(folder / "train-00000.h5", folder / "train.h5")
    with pytest.raises(ShardError, match=r"train\.h5: both train\.h5 and train-XXXXX"):
        open_features(tmp_path / "x")


def test_missing_features_folder(tmp_path):
    with pytest.raises(ShardError, match=r"nope: features folder not found"):
        open_features(tmp_path / "nope")


def test_no_step_folders(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ShardError, match=r"x: no step_XX folders"):
        open_features(tmp_path / "x")


def test_missing_step_folder(features):
    shutil.rmtree(features / "step_02")
    with pytest.raises(ShardError, match=r"step_02: step folder missing \(found steps"):
        open_features(features)


def test_missing_shard_file(features):
    (features / "step_02" / "test.h5").unlink()
    with pytest.raises(ShardError, match=r"step_02/test\.h5: shard missing"):
        open_features(features)


def test_empty_file(features):
    (features / "step_02" / "train.h5").write_bytes(b"")
    with pytest.raises(ShardError, match=r"step_02/train\.h5: empty file"):
        open_features(features)


def test_truncated_file(features):
    path = features / "step_03" / "train.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ShardError, match=r"step_03/train\.h5: truncated or not an HDF5"
    ):
        open_features(features)


def test_nan_and_inf_rows_are_found_when_streaming(features):
    path = features / "step_02" / "train.h5"
    with h5py.File(path, "r+") as f:
        f["features"][7, 3] = np.nan
    steps = open_features(features)
    with pytest.raises(ShardError, match=r"step_02/train\.h5: features row 7 is NaN"):
        list(steps[1].train.iter_chunks(4))
    with h5py.File(path, "r+") as f:
        f["features"][7, 3] = 0
        f["features"][11, 0] = -np.inf
    with pytest.raises(ShardError, match=r"features row 11 is NaN or Inf"):
        list(open_features(features)[1].train.iter_chunks(4))


def test_feature_dim_differs_between_steps(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1, dim=D)
    write_step(root, 2, dim=D + 1)
    with pytest.raises(ShardError, match=r"step_02/train\.h5: feature_dim 9 differs"):
        open_features(root)


def test_classes_seen_must_not_decrease(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1, classes=4)
    write_step(root, 2, classes=3)
    with pytest.raises(ShardError, match=r"classes_seen 3 is below step 1's 4"):
        open_features(root)


def test_attr_step_must_match_folder(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    write_step(root, 2)
    with h5py.File(root / "step_02" / "train.h5", "r+") as f:
        f.attrs["step"] = 5
    with pytest.raises(ShardError, match=r"attr step is 5, but the folder is step_02"):
        open_features(root)


def test_attr_missing_or_not_an_integer(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    with h5py.File(root / "step_01" / "train.h5", "r+") as f:
        f.attrs["feature_dim"] = "eight"
    with pytest.raises(ShardError, match=r"attr 'feature_dim' must be an integer"):
        open_features(root)
    with h5py.File(root / "step_01" / "train.h5", "r+") as f:
        del f.attrs["feature_dim"]
    with pytest.raises(ShardError, match=r"train\.h5: attr 'feature_dim' missing"):
        open_features(root)


def test_wrong_dtypes_on_disk(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    path = root / "step_01" / "train.h5"
    with h5py.File(path, "r+") as f:
        labels = f["labels"][()]
        del f["labels"]
        f["labels"] = labels.astype(np.int32)
    with pytest.raises(ShardError, match=r"labels must be \(20,\) int64, got .* int32"):
        open_features(root)
    with h5py.File(path, "r+") as f:
        del f["labels"]
        f["labels"] = labels
        x = f["features"][()]
        del f["features"]
        f["features"] = x.astype(np.float64)
    with pytest.raises(ShardError, match=r"features must be \(n, D\) float32/float16"):
        open_features(root)


def test_labels_out_of_range_on_disk(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1, classes=3)
    with h5py.File(root / "step_01" / "train.h5", "r+") as f:
        f["labels"][0] = 3
    with pytest.raises(ShardError, match=r"labels must lie in \[0, 3\).*got \[0, 3\]"):
        open_features(root)


def test_missing_code_out_of_range_on_disk(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    with h5py.File(root / "step_01" / "test.h5", "r+") as f:
        f["task_01/missing"][2] = 7
    with pytest.raises(ShardError, match=r"test\.h5:task_01: missing codes .* got 7"):
        open_features(root)


def test_test_shard_task_groups(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    write_step(root, 2)
    with h5py.File(root / "step_02" / "test.h5", "r+") as f:
        f.move("task_02", "task_07")
    with pytest.raises(ShardError, match=r"test\.h5: group 'task_02' missing"):
        open_features(root)


def test_bp_logits_shape_on_disk(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1, bp=True)
    with h5py.File(root / "step_01" / "test.h5", "r+") as f:
        del f["task_01/bp_logits"]
        f["task_01/bp_logits"] = np.zeros((5, 2), np.float32)
    with pytest.raises(ShardError, match=r"bp_logits must be \(5, 3\) float32"):
        open_features(root)


def test_writer_refuses_bad_blocks_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "step_01" / "train.h5"
    attrs = ShardAttrs(1, 3, D)
    write_train(path, block(5), attrs)
    before = path.read_bytes()
    bad = block(5)
    cases = [
        (
            Block(bad.features[:, :3], bad.labels, bad.missing, bad.sample_ids),
            r"features have 3 columns, but feature_dim is 8",
        ),
        (
            Block(
                bad.features.astype(np.float64), bad.labels, bad.missing, bad.sample_ids
            ),
            r"features must be \(n, D\) float32/float16",
        ),
        (
            Block(
                np.where(np.eye(5, D) > 0, np.nan, bad.features).astype(np.float32),
                bad.labels,
                bad.missing,
                bad.sample_ids,
            ),
            r"features contain NaN",
        ),
        (
            Block(bad.features, bad.labels + 3, bad.missing, bad.sample_ids),
            r"labels must lie in \[0, 3\)",
        ),
        (
            Block(bad.features, bad.labels.astype(float), bad.missing, bad.sample_ids),
            r"labels must be integers",
        ),
        (
            Block(bad.features, bad.labels, bad.missing + 3, bad.sample_ids),
            r"missing codes must be 0, 1 or 2",
        ),
        (
            Block(bad.features, bad.labels, bad.missing, bad.sample_ids[:4]),
            r"sample_ids must have 5 entries",
        ),
    ]
    for b, match in cases:
        with pytest.raises(ShardError, match=match):
            write_train(path, b, attrs)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["train.h5"]


def test_write_test_needs_every_seen_task(tmp_path):
    with pytest.raises(ShardError, match=r"needs tasks \[1, 2\], got \[1\]"):
        write_test(tmp_path / "test.h5", {1: block(3)}, ShardAttrs(2, 3, D))


def test_duplicate_step_numbers(tmp_path):
    root = tmp_path / "x"
    write_step(root, 1)
    shutil.copytree(root / "step_01", root / "step_001")
    with pytest.raises(ShardError, match=r"step 1 also in step_0"):
        open_features(root)


def test_open_step_directly_and_synthetic_layout(tmp_path):
    root = make_features(
        tmp_path / "s",
        rows_per_step=[30, 20],
        classes_per_step=[2, 3],
        feature_dim=6,
        test_rows=7,
    )
    s = open_step(root / "step_02", 2)
    assert (s.classes_seen, s.feature_dim, s.train.n_rows) == (5, 6, 20)
    y = s.train.read_all()[1]
    assert y.min() >= 2 and y.max() <= 4  # task 2 owns classes 2..4
    assert s.test[1].n_rows == 7 and s.test[2].has_bp_logits
