"""DVC's queue workers pinned to GPUs: one worker per listed card.

`dvc queue start -j N` starts N workers that all see every GPU, so their cells
share the first card. Here each worker is DVC's own (`dvc exp queue-worker
NAME`, what `dvc queue start` runs) started with `CUDA_VISIBLE_DEVICES` set to
its card: a worker runs one cell at a time, every stage of that cell in its
own processes, so each cell runs on exactly one card. The workers take their
cells from the one queue and share the project's DVC cache; a card listed
twice gets two workers (two cells at once on it).

Without --gpus (and PAL_PAPER_GPUS), `pal-paper run` fills every card torch
sees (`fill`): J workers a card, J the most tunings at once that the card's
`packing` (palpaper/costs.yaml) has a figure for and 90 % of its memory
holds. They are processes, not threads or streams of one: a cell's bytes stay
independent of its neighbours', as DVC's run-cache needs (it keys a cell by
its params alone, not by what ran beside it).

A worker exits by itself once the queue is empty. Its pid is kept in DVC's
queue folder (`.dvc/tmp/exps/celery/pal-gpu-<i>.pid`), so a rerun starts only
the workers that are gone, and `stop` ends them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from palcore.errors import PalError

log = logging.getLogger(__name__)

ENV = "PAL_PAPER_GPUS"  # the default of `pal-paper run --gpus`


class GpuListError(PalError):
    """A --gpus list that names no card or a malformed one."""


def parse_gpus(text: str | None) -> list[str] | None:
    """`0,1,3` → ['0', '1', '3']: the CUDA device ids, one worker each; None
    or an empty text: no pinning."""
    if text is None or not text.strip():
        return None
    ids = [part.strip() for part in text.split(",")]
    bad = [i for i in ids if not i.isdigit()]
    if bad:
        raise GpuListError(
            f"--gpus: CUDA device ids separated by commas such as 0,1,2, got "
            f"'{text}' ('{bad[0]}' is not one)"
        )
    return ids


def fill(slots: Callable[[float], int]) -> tuple[list[str], dict[str, int]]:
    """Workers that fill every card torch sees: (the card of each worker, the
    cards round-robin so the first cells spread; card -> J), J = `slots(GiB
    of the card's memory)` (`palpaper.cards.Card.slots`). The cards are
    CUDA_VISIBLE_DEVICES' ids where it is set, else 0..device_count - 1;
    none: ([], {})."""
    import torch

    n = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x.strip() for x in visible.split(",") if x.strip()][:n]
    else:
        ids = [str(i) for i in range(n)]
    per_card = {
        gpu: slots(torch.cuda.get_device_properties(index).total_memory / 2**30)
        for index, gpu in enumerate(ids)
    }
    rounds = max(per_card.values(), default=0)
    gpus = [g for r in range(rounds) for g in ids if per_card[g] > r]
    return gpus, per_card


def fill_line(
    per_card: Mapping[str, int], factors: Mapping[int, float], where: str
) -> str:
    """The line that says how `fill` filled the cards."""
    n = sum(per_card.values())
    if len(set(per_card.values())) == 1:
        j = next(iter(per_card.values()))
        cards = f"card{'s' * (len(per_card) != 1)} {','.join(per_card)} x {j}"
        each = " each" if len(per_card) > 1 else ""
        return (
            f"{n} worker{'s' * (n != 1)}: {cards} tuning{'s' * (j != 1)}{each} "
            f"(packing {factors[j]:g}x, {where})"
        )
    cards = ", ".join(f"{g} x {j}" for g, j in per_card.items())
    return f"{n} workers: cards {cards} tunings (packing by card's memory, {where})"


def _folder(root: Path) -> Path:
    return root / ".dvc" / "tmp" / "exps" / "celery"


def _pid_file(root: Path, index: int) -> Path:
    return _folder(root) / f"pal-gpu-{index}.pid"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def running(root: Path, index: int) -> int | None:
    """The pid of pinned worker `index` when it still runs, else None."""
    pid = _read_pid(_pid_file(root, index))
    return pid if pid is not None and alive(pid) else None


def node_name(root: Path, index: int, gpu: str) -> str:
    """The worker's celery node name: unique per project and worker slot."""
    import hashlib

    tag = hashlib.sha256(str(_folder(root)).encode()).hexdigest()[:6]
    return f"dvc-exp-{tag}-gpu{gpu}-{index}@localhost"


def start(root: Path, gpus: Sequence[str], dvc: str, env: dict[str, str]) -> list[int]:
    """Start the pinned workers of `gpus` that are not running; their slots."""
    folder = _folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    started = []
    for index, gpu in enumerate(gpus):
        if running(root, index) is not None:
            continue
        args = [dvc, "exp", "queue-worker", node_name(root, index, gpu)]
        if index == 0:
            args.append("--clean")  # as DVC's first worker: clean the broker
        with (folder / f"pal-gpu-{index}.out").open("a") as out:
            proc = subprocess.Popen(
                args,
                cwd=root,
                env={**env, "CUDA_VISIBLE_DEVICES": gpu},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the shell reaches pal-paper only
            )
        tmp = _pid_file(root, index).with_suffix(".tmp")
        tmp.write_text(f"{proc.pid} {gpu}\n")
        tmp.replace(_pid_file(root, index))
        log.info("worker %d started on GPU %s (pid %d)", index + 1, gpu, proc.pid)
        started.append(index)
    return started


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies do not: they
    wait for their parent to reap them)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop(root: Path, grace: float = 15.0) -> int:
    """End every pinned worker of the project and whatever its session still
    runs: SIGTERM (celery's warm shutdown), then SIGKILL after `grace`
    seconds; the number of workers that were running."""
    groups = []
    for path in sorted(_folder(root).glob("pal-gpu-*.pid")):
        pid = _read_pid(path)
        if pid is not None and group_alive(pid):
            groups.append(pid)
            os.killpg(pid, signal.SIGTERM)
        path.unlink(missing_ok=True)
    deadline = time.monotonic() + grace
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in groups:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        try:  # a worker this process started: reap it
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return len(groups)


def wall_hours(cell_hours: Sequence[float], cards: int) -> float:
    """The grid's wall time on `cards` cards: cells longest first, each to the
    card that frees first (a worker runs one cell at a time)."""
    loads = [0.0] * max(cards, 1)
    for hours in sorted(cell_hours, reverse=True):
        loads[loads.index(min(loads))] += hours
    return max(loads)
