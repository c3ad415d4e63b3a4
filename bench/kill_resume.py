"""A killed `dvc repro` resumes after its last finished step, to the same bytes.

In scratch copies of the project (tiny params with 5 tasks, real `dvc`):

1. `dvc repro` runs uninterrupted: the reference outputs;
2. `dvc repro` is killed (SIGKILL to its whole process group) in `tune` once
   step 2 of 5 is finished, then `dvc repro` is run again: its log must say
   that steps 1-2 were reused;
3. the same in `extract`, once step 2's shards are written;
4. killed a few seconds into `solve` (which has no steps to resume).

It prints whether each rerun gives `results/demo/metrics.json` and the dvc.lock
hashes of every output byte-identical to 1 (which also checks determinism:
each copy starts from scratch).

    .venv/bin/python bench/kill_resume.py            # about 5 minutes on 2 cores
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from scratch_project import BIN, TINY, make_scratch_project  # noqa: E402

# 5 tasks of 2 classes; wide enough that solving takes a few seconds, so the
# kill lands inside it
PARAMS = {
    **TINY,
    "demo": {**TINY["demo"], "n_classes": 10},
    "data": {**TINY["data"], "tasks": 5},
    "prompt": {**TINY["prompt"], "pool_size": 5},
    "extract": {"batch_size": 4, "device": "cpu"},
    "solve": {"eta": 1.0, "width": 6144, "seed": 0, "method": "gram", "device": "cpu"},
    "protocol": {"runs": [0]},  # one run: the kills land in run 0 of PAL
}

# when to kill: a file that appears once step 2 is finished, or seconds after
# the stage starts
KILL_AT = {
    "tune": "data/tune/pal/0.partial/step_02.pt",
    "extract": "data/extract/pal/0.partial/step_02/test.h5",
    "solve": 2.5,
}
RESUMED = {"tune": "reusing steps 1-2 ", "extract": "reused steps 1,2 "}


def repro(path: Path, env: dict[str, str], kill_in: str | None = None) -> str:
    """Run `dvc repro`; with `kill_in`, SIGKILL it at `KILL_AT[kill_in]`."""
    log = path / f"repro-{'killed' if kill_in else 'run'}.log"
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
            at = KILL_AT[kill_in]
            marker = f"Running stage '{kill_in}@pal-0'"
            while proc.poll() is None and marker not in log.read_text():
                time.sleep(0.05)
            if isinstance(at, str):
                while proc.poll() is None and not (path / at).exists():
                    time.sleep(0.05)
            else:
                time.sleep(at)  # inside the stage: imports done, work under way
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "killed"
            return "finished before the kill"
        proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"dvc repro failed in {path}:\n{log.read_text()}")
    return "ok"


def lock_outs(path: Path) -> dict[str, str]:
    """Every output's hash in dvc.lock."""
    stages = yaml.safe_load((path / "dvc.lock").read_text())["stages"]
    return {
        out["path"]: out["md5"] for s in stages.values() for out in s.get("outs", [])
    }


def digest(path: Path) -> str:
    metrics = path / "results" / "demo" / "metrics.json"
    return hashlib.sha256(metrics.read_bytes()).hexdigest()


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    with tempfile.TemporaryDirectory(prefix="pal-kill-") as tmp:
        results, reference = {}, {}
        for case in ("full", "tune", "extract", "solve"):
            path = Path(tmp) / case
            path.mkdir()
            run_env = make_scratch_project(path, PARAMS)
            t0 = time.perf_counter()
            if case == "full":
                repro(path, run_env)
                status = "uninterrupted"
                reference = lock_outs(path)
            else:
                status = repro(path, run_env, kill_in=case)
                leftovers = sorted(
                    str(p.relative_to(path)) for p in path.rglob("*.tmp*")
                )
                repro(path, run_env)
                rerun = (path / "repro-run.log").read_text()
                if case in RESUMED:
                    found = RESUMED[case] in rerun
                    status += f", rerun {'reused steps 1-2' if found else 'RESTARTED'}"
                    results[f"{case} resumed"] = "yes" if found else "no"
                status += f"; temp files left by the kill: {leftovers or 'none'}"
                same_lock = lock_outs(path) == reference
                status += f"; dvc.lock outputs {'identical' if same_lock else 'DIFFER'}"
                results[f"{case} lock"] = "yes" if same_lock else "no"
            results[case] = digest(path)
            same = results[case] == results["full"]
            print(
                f"{case:8s} {time.perf_counter() - t0:6.1f} s  metrics.json sha256 "
                f"{results[case][:16]}  {'identical' if same else 'DIFFERENT'}  "
                f"({status})",
                flush=True,
            )
        ok = (
            len({results[c] for c in ("full", "tune", "extract", "solve")}) == 1
            and "no" not in results.values()
        )
        print(
            "holds: killed runs resume after their last finished step to "
            "byte-identical outputs"
            if ok
            else "FAILS: a killed run restarted or its outputs differ"
        )
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
