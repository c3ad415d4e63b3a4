"""Time of each head from one HeadStats state, as ratios to one joint-ridge solve.

Run: python bench/solver --heads --widths E --rows N (synthetic data, float64,
numpy; the solver benchmark's mode).
Accumulation (E^2 n FLOPs) is shared by all heads and printed apart.
"""

import sys
import time

import numpy as np

from solver.api import heads


def main(E: int = 1000, n: int = 10000) -> None:
    """Accumulate n synthetic rows at width E, then time each head."""
    D, C = 64, 20
    r = np.random.default_rng(0)
    X = r.normal(size=(n, D))
    y = np.sort(r.integers(0, C, n))
    Z = X @ r.normal(size=(D, E))
    H = np.maximum(Z, 0)

    def accumulate(dsal_eta: float | None) -> tuple[heads.HeadStats, float]:
        s = heads.HeadStats(E, D, C, dsal_eta=dsal_eta)
        t = time.perf_counter()
        s.begin_task(y, np.arange(n))
        for i in range(0, n, 4096):
            b = slice(i, min(i + 4096, n))
            s.add(H[b], X[b], y[b], np.arange(n)[b], Z=Z[b])
        s.end_task()
        return s, time.perf_counter() - t

    s, acc = accumulate(None)
    with_dsal, acc_dsal = accumulate(1.0)
    rows = {}
    for name, f in [
        ("ridge", lambda: heads.ridge(s, 1.0)),
        ("air", lambda: heads.air(s, 1.0)),
        ("ncm", lambda: heads.ncm(s, H[:1000])),
        ("lda", lambda: heads.lda(s, 0.1)),
        ("eta_path x9", lambda: heads.eta_path(s, [10.0**k for k in range(-4, 5)])),
        ("dsal", lambda: heads.dsal(with_dsal, 1.0)),
    ]:
        t = time.perf_counter()
        f()
        rows[name] = time.perf_counter() - t
    state = sum(
        getattr(s, k).nbytes
        for k in ("G", "Q", "Gv", "Qv", "Gair", "Qair", "Hsum", "Xsum", "Sxx")
    )
    print(f"E={E} rows={n} accumulate {acc:.2f}s state {state / 2**20:.1f} MiB")
    print(
        f"with DS-AL's stream (a solve per batch, a second E x E): accumulate "
        f"{acc_dsal:.2f}s, {acc_dsal / acc:.2f}x"
    )
    for name, sec in rows.items():
        print(f"{name:12s} {sec:8.3f}s  {sec / rows['ridge']:6.2f}x ridge")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:3]))
