"""`solve.eta: auto` against fixed η, on a features folder (default: the demo's).

For each solve seed (the up-sampling matrix and the held-out draw): one sweep
over `solve.eta_grid` (one pass, one weights file per η) and one `auto` solve,
each evaluated. Prints Acc and FG as mean ± std over the seeds for η = 1, for
the best fixed η of the grid chosen in hindsight (by each seed's Acc), and for
auto with the η it chose per step; then the solve time of auto against a
fixed-η solve (best of 3, in this process).

    .venv/bin/python bench/eta_auto.py --features data/extract --width 1024
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from solver.api import SolveParams, evaluate
from solver.api import fit as solve


def _metrics(features: Path, weights: Path, out: Path) -> dict:
    (path,) = evaluate(features, [weights], out)
    return json.loads(path.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features", type=Path, default=Path("data/extract"))
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    base = SolveParams(width=a.width, device="cpu")
    grid = base.eta_grid
    rows: dict[str, list[tuple[float, float]]] = {"1": [], "best": [], "auto": []}
    chosen = []
    with tempfile.TemporaryDirectory(prefix="pal-eta-") as tmp:
        work = Path(tmp)
        for seed in map(int, a.seeds.split(",")):
            sweep = solve(
                a.features, work / f"sweep{seed}", replace(base, eta=grid, seed=seed)
            )
            fixed = {
                eta: _metrics(a.features, w, work / f"r{seed}-{eta:g}")
                for eta, w in zip(grid, sweep, strict=True)
            }
            (auto_w,) = solve(
                a.features, work / f"auto{seed}", replace(base, eta="auto", seed=seed)
            )
            auto = _metrics(a.features, auto_w, work / f"ra{seed}")
            best = max(grid, key=lambda e: fixed[e]["acc"])
            rows["1"].append((fixed[1.0]["acc"], fixed[1.0]["fg"]))
            rows["best"].append((fixed[best]["acc"], fixed[best]["fg"]))
            rows["auto"].append((auto["acc"], auto["fg"]))
            chosen.append((seed, best, auto["eta_by_step"]))
        times = {}
        for name, params in (
            ("fixed", replace(base, eta=1.0)),
            ("auto", replace(base, eta="auto")),
        ):
            runs = []
            for i in range(3):
                t0 = time.perf_counter()
                solve(a.features, work / f"t-{name}{i}", params)
                runs.append(time.perf_counter() - t0)
            times[name] = min(runs)

    def cell(values: list[float]) -> str:
        return f"{np.mean(values):.2f} ± {np.std(values):.2f}"

    print(f"# {a.features}, width {a.width}, seeds {a.seeds}, grid {list(grid)}")
    print("| η | Acc | FG |\n|---|---|---|")
    labels = {"1": "η = 1", "best": "best fixed η (hindsight)", "auto": "auto"}
    for key, label in labels.items():
        accs, fgs = zip(*rows[key], strict=True)
        print(f"| {label} | {cell(list(accs))} | {cell(list(fgs))} |")
    for seed, best, per_step in chosen:
        print(f"seed {seed}: best fixed η {best:g}; auto chose {per_step}")
    print(
        f"solve time, best of 3: fixed η {times['fixed']:.2f} s, auto "
        f"{times['auto']:.2f} s ({times['auto'] / times['fixed']:.2f}×)"
    )


if __name__ == "__main__":
    main()
