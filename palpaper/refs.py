"""Finished cells as git refs: the experiments on a baseline commit.

Every cell is an experiment on the commit the grid runs from (the baseline),
named `<baseline short hash>-<cell name>` (`overrides.Cell.name`).
A finished experiment is a git ref `refs/exps/<baseline[:2]>/<baseline[2:]>/
<name>` (how DVC stores them); its `results/<dataset>/metrics.json` is read
from that commit with `git show`, so collecting needs neither the workspace
nor the cache.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from palpaper.overrides import Cell, GridError, get
from palpaper.tools import ExperimentError, run_tool


class ExperimentRefs:
    """The project's git repository at a baseline commit, and the experiments
    finished on it."""

    def __init__(self, root: Path, baseline: str | None = None) -> None:
        self.root = root
        self.git = "git"
        try:
            self.baseline = run_tool(
                [self.git, "rev-parse", "--verify", f"{baseline or 'HEAD'}^{{commit}}"],
                root,
            ).strip()
        except ExperimentError:
            raise ExperimentError(
                f"{root}: no git commit '{baseline or 'HEAD'}' (a grid's cells "
                "are experiments on a commit)"
            ) from None

    @property
    def short(self) -> str:
        return self.baseline[:7]

    def exp_name(self, cell: Cell) -> str:
        """The cell's experiment name: the baseline's short hash, then the
        cell's name (DVC's queue lists tasks of every baseline by name)."""
        return f"{self.short}-{cell.name}"

    def dirty(self) -> list[str]:
        """Tracked files changed since the baseline commit."""
        out = run_tool(
            [self.git, "status", "--porcelain", "--untracked-files=no"], self.root
        )
        return [line[3:] for line in out.splitlines() if line.strip()]

    def finished(self, cells: Sequence[Cell] | None = None) -> dict[str, str]:
        """Experiment name -> commit, for the experiments on the baseline;
        with `cells`, only those whose commit holds the cell's params (a ref
        is trusted by its content, never its name alone: `holds`)."""
        done = self._refs()
        if cells is None:
            return done
        named = {self.exp_name(c): c for c in cells}
        return {
            n: sha
            for n, sha in done.items()
            if n not in named or self.holds(sha, named[n])
        }

    def holds(self, commit: str, cell: Cell) -> bool:
        """Whether `commit`'s params.yaml sets each of the cell's overrides."""
        import yaml

        def plain(value: Any) -> Any:
            return [plain(v) for v in value] if isinstance(value, tuple) else value

        text = self.show(commit, "params.yaml")
        try:
            params = yaml.safe_load(text or "") or {}
            return all(get(params, k) == plain(v) for k, v in cell.overrides)
        except (yaml.YAMLError, GridError, TypeError):
            return False

    def _refs(self) -> dict[str, str]:
        b = self.baseline
        out = run_tool(
            [
                self.git,
                "for-each-ref",
                "--format=%(objectname) %(refname)",
                f"refs/exps/{b[:2]}/{b[2:]}/",
            ],
            self.root,
        )
        done = {}
        for line in out.splitlines():
            sha, ref = line.split(" ", 1)
            done[ref.rsplit("/", 1)[-1]] = sha
        return done

    def other_baselines(self, cell_names: Sequence[str]) -> dict[str, int]:
        """Commit -> how many of `cell_names` finished on it, for the commits
        other than the baseline (a grid run before HEAD moved)."""
        out = run_tool(
            [self.git, "for-each-ref", "--format=%(refname)", "refs/exps/"], self.root
        )
        wanted = set(cell_names)
        counts: dict[str, int] = {}
        for ref in out.splitlines():
            parts = ref.split("/")
            if len(parts) != 5:
                continue
            base, name = parts[2] + parts[3], parts[4]
            if base == self.baseline or name[:8] != f"{base[:7]}-":
                continue
            if name[8:] in wanted:
                counts[base] = counts.get(base, 0) + 1
        return counts

    def show(self, commit: str, path: str) -> str | None:
        """The text of `path` at `commit`, or None when it has no such file."""
        proc = subprocess.run(
            [self.git, "show", f"{commit}:{path}"],
            cwd=self.root,
            capture_output=True,
            text=True,
        )
        return proc.stdout if proc.returncode == 0 else None

    def report(self, commit: str, dataset: str) -> dict[str, bytes]:
        """The files evaluate wrote to `results/<dataset>/` in the experiment
        `commit` (that folder's own files, not its subfolders'): name -> bytes."""
        where = f"{commit}:results/{dataset}"
        listing = run_tool([self.git, "ls-tree", "-z", where], self.root)
        files = {}
        for entry in filter(None, listing.split("\0")):
            meta, name = entry.split("\t", 1)
            _, kind, sha = meta.split()
            if kind == "blob":
                files[name] = subprocess.run(
                    [self.git, "cat-file", "blob", sha],
                    cwd=self.root,
                    capture_output=True,
                    check=True,
                ).stdout
        return files

    def metrics(self, commit: str, dataset: str) -> dict[str, Any] | None:
        text = self.show(commit, f"results/{dataset}/metrics.json")
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None
