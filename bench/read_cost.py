"""What the readers' content check costs a Food101-sized solve, as a ratio
measured in one run.

The solver checks every shard it reads against the md5 DVC recorded for it
(`palcore.recorded.check_content`), in a pre-pass before it streams the rows.
Here: synthetic shards of Food101's size (61,127 training rows of D = 768 in
10 steps, 100 classes, each step's test tasks as extract writes them) laid out
as a DVC project lays them out (a lock and the folder's manifest in the
cache), then, in one process and one after the other:

- the check alone over every file of the chain (what the pre-pass adds);
- the whole solve at `--width` (default the paper's 15,000) on the NumPy
  backend, the check inside it.

It prints both times and their ratio (target: ≤ 0.05). The page cache is
warm for both (the shards were just written), as on a machine that extracted
them; a cold cache makes the pre-pass the solve's first read instead.

Run (CPU):  .venv/bin/python bench/read_cost.py                (about 10 min)
            .venv/bin/python bench/read_cost.py --width 2048   (a minute)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from palcore.recorded import cache_object, check_content, md5_of  # noqa: E402
from solver.api import SolveParams, fit, make_features  # noqa: E402

OUT = "data/extract/pal/0"


def project(where: Path, rows: int, test_rows: int) -> Path:
    """Food101-sized shards under a lock and a manifest, as DVC leaves them."""
    (where / ".dvc").mkdir(parents=True)
    make_features(
        where / OUT,
        rows_per_step=rows // 10,
        classes_per_step=10,
        feature_dim=768,
        test_rows=test_rows,
        n_steps=10,
        seed=0,
    )
    files = sorted(p for p in (where / OUT).rglob("*") if p.is_file())
    listing = json.dumps(
        [
            {"md5": md5_of(p), "relpath": p.relative_to(where / OUT).as_posix()}
            for p in files
        ]
    )
    md5 = hashlib.md5(listing.encode()).hexdigest() + ".dir"
    obj = cache_object(where / ".dvc" / "cache", md5)
    obj.parent.mkdir(parents=True)
    obj.write_text(listing)
    lock = {
        "schema": "2.0",
        "stages": {
            "extract@pal-0": {"cmd": "pal extract", "outs": [{"path": OUT, "md5": md5}]}
        },
    }
    (where / "dvc.lock").write_text(yaml.safe_dump(lock))
    return where / OUT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=15000)
    ap.add_argument("--rows", type=int, default=61127)
    ap.add_argument(
        "--test-rows",
        type=int,
        default=12500,
        help="test rows per step (Food101: about 125k over its 10 steps)",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        features = project(Path(tmp) / "project", a.rows, a.test_rows)
        files = sorted(p for p in features.rglob("*.h5"))
        size = sum(p.stat().st_size for p in files)
        start = time.perf_counter()
        for path in files:
            check_content(path)
        check_s = time.perf_counter() - start
        params = SolveParams(width=a.width, eta=1.0, seed=0, device="cpu")
        start = time.perf_counter()
        fit(features, Path(tmp) / "solve", params)
        solve_s = time.perf_counter() - start
    print(f"shards: {len(files)} files, {size / 1e9:.2f} GB; width {a.width}")
    print(f"content check alone: {check_s:.2f} s")
    print(f"solve (check inside): {solve_s:.1f} s")
    print(f"ratio check / solve: {check_s / solve_s:.4f} (target <= 0.05)")


if __name__ == "__main__":
    main()
