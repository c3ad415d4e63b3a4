"""`pal-paper submit` speaks sbatch (the scripts, without a cluster; the real
one-node SLURM test in test_paper_slurm.py submits them)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from palpaper import slurm


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90),
        ("4:00:00", 240),
        ("0:00:50", 1),
        ("90:30", 91),
        ("1-12", 2160),
        ("1-0:30", 1470),
        ("2-00:00:01", 2881),
    ],
)
def test_time_takes_every_sbatch_format(text: str, minutes: int) -> None:
    assert slurm.parse_time(text) == minutes


@pytest.mark.parametrize("text", ["4h", "1:2:3:4", "0", "-5", ""])
def test_a_time_sbatch_would_refuse_is_one_line(text: str) -> None:
    with pytest.raises(click.BadParameter) as err:
        slurm.parse_time(text)
    assert str(err.value).startswith(f"'{text}' is ")


def test_the_scripts_carry_each_option_and_the_pass_through(tmp_path: Path) -> None:
    opts = slurm.Options(
        partition="gpu",
        account="lab",
        qos="long",
        mem="32G",
        constraint="h100",
        gpu_type="h100",
        extra=("--exclusive", "--comment=pal"),
        gpus=2,
        cpus=8,
    )
    task, collect = slurm.scripts(tmp_path, tmp_path / "c-1", 5, ["missing"], opts, 240)
    sbatch = [line for line in task.splitlines() if line.startswith("#SBATCH")]
    assert sbatch[3:] == [
        "#SBATCH --time=240",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=lab",
        "#SBATCH --qos=long",
        f"#SBATCH --signal=B:USR1@{slurm.signal_s(240)}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={tmp_path / 'c-1'}/task-%a.out",
        "#SBATCH --gres=gpu:h100:2",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=32G",
        "#SBATCH --constraint=h100",
        "#SBATCH --exclusive",
        "#SBATCH --comment=pal",
    ]
    # the tables' job: where and whose, not the tasks' resources
    assert "#SBATCH --partition=gpu" in collect and "--mem" not in collect
    assert "--exclusive" not in collect


def test_a_size_or_an_option_sbatch_would_refuse_is_one_line() -> None:
    with pytest.raises(slurm.SlurmError) as err:
        slurm.Options(mem="32 GB")
    assert str(err.value) == "--mem: '32 GB' is no size sbatch takes (32G, 500M)"
    with pytest.raises(slurm.SlurmError) as err:
        slurm.Options(extra=("exclusive",))
    assert (
        str(err.value) == "--sbatch-arg: 'exclusive' is no sbatch option (--exclusive)"
    )
