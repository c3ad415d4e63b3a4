"""A killed `dvc repro` leaves nothing half-written that a later stage accepts.

In three scratch copies of the project (tiny params, real `dvc`):

1. `dvc repro` runs uninterrupted: the reference `results/metrics.json`;
2. `dvc repro` is killed (SIGKILL to its whole process group) while `extract`
   runs, then `dvc repro` is run again;
3. the same, killed while `solve` runs.

It prints whether the rerun of 2 and 3 gives `metrics.json` byte-identical to 1
(which also checks determinism: each copy starts from scratch).

    .venv/bin/python bench/kill_resume.py            # about 3-5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from scratch_project import BIN, TINY, make_scratch_project  # noqa: E402

# wide enough that solving takes a few seconds, so the kill lands inside it
PARAMS = {
    **TINY,
    "extract": {"batch_size": 4, "device": "cpu"},
    "solve": {"eta": 1.0, "width": 6144, "seed": 0, "method": "gram", "device": "cpu"},
}

DELAY = {"extract": 3.0, "solve": 2.5}  # seconds after the stage starts


def repro(path: Path, env: dict[str, str], kill_in: str | None = None) -> str:
    """Run `dvc repro`; with `kill_in`, SIGKILL it once that stage is running."""
    log = path / f"repro-{kill_in or 'full'}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "dvc"), "repro"],
            cwd=path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if kill_in is not None:
            marker = f"Running stage '{kill_in}'"
            while proc.poll() is None and marker not in log.read_text():
                time.sleep(0.05)
            time.sleep(DELAY[kill_in])  # inside the stage: imports done, work under way
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "killed"
            return "finished before the kill"
        proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"dvc repro failed in {path}:\n{log.read_text()}")
    return "ok"


def digest(path: Path) -> str:
    return hashlib.sha256((path / "results" / "metrics.json").read_bytes()).hexdigest()


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    with tempfile.TemporaryDirectory(prefix="pal-kill-") as tmp:
        results = {}
        for case in ("full", "extract", "solve"):
            path = Path(tmp) / case
            path.mkdir()
            run_env = make_scratch_project(path, PARAMS)
            t0 = time.perf_counter()
            if case == "full":
                repro(path, run_env)
                status = "uninterrupted"
            else:
                status = repro(path, run_env, kill_in=case)
                leftovers = sorted(
                    str(p.relative_to(path)) for p in path.rglob("*.tmp*")
                )
                repro(path, run_env)
                status += (
                    f", rerun ok; temp files left by the kill: {leftovers or 'none'}"
                )
            results[case] = digest(path)
            same = results[case] == results["full"]
            print(
                f"{case:8s} {time.perf_counter() - t0:6.1f} s  metrics.json sha256 "
                f"{results[case][:16]}  {'identical' if same else 'DIFFERENT'}  "
                f"({status})",
                flush=True,
            )
        ok = len(set(results.values())) == 1
        print(
            "holds: killed runs resume to byte-identical metrics.json"
            if ok
            else "FAILS: metrics.json differs after a killed run"
        )
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
