"""A one-node SLURM cluster for the tests: munged, slurmctld and slurmd from
Debian's packages (slurm-wlm, munge), each with its own key, config, state
and spool in one folder, started and stopped by the test.

No systemd and no cgroups: `proctrack/pgid` tracks a job by its process
group, `task/none` binds nothing. `AuthInfo=cred_expire=10` lets a requeued
task start again after 10 s (SLURM's default holds it 121 s). The folder is
open to every user (0755): a second account submits there too.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")


def missing() -> list[str]:
    """The daemons and commands this machine lacks."""
    return [d for d in DAEMONS if shutil.which(d) is None and not _sbin(d)]


def _sbin(name: str) -> str | None:
    path = Path("/usr/sbin") / name
    return str(path) if path.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """\
ClusterName=paltest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
KillWait=15
OverTimeLimit=0
InactiveLimit=0
NodeName={host} CPUs={cpus} RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    """The cluster of folder `dir`; `env` holds SLURM_CONF for its clients."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        os.chmod(self.dir / "munge", 0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.dir / "munge"
        subprocess.run(
            [
                _sbin("munged") or "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={m}/munge.socket",
                f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log",
                f"--seed-file={m}/munged.seed",
            ],
            check=True,
        )
        self.conf.write_text(
            CONF.format(
                host=self.host,
                dir=self.dir,
                ctld_port=_free_port(),
                d_port=_free_port(),
                cpus=os.cpu_count() or 1,
            )
        )
        env = {**os.environ, **self.env}
        subprocess.run([_sbin("slurmctld") or "slurmctld", "-c"], env=env, check=True)
        subprocess.run([_sbin("slurmd") or "slurmd"], env=env, check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            )
            if out.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node never came up: {self.log()}")

    def log(self) -> str:
        return (self.dir / "log" / "slurmctld.log").read_text()[-3000:]

    def stop(self) -> None:
        env = {**os.environ, **self.env}
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True)
        for name in ("slurmd", "slurmctld", "munge/munged"):
            pid_file = self.dir / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
