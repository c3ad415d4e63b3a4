"""palpaper's data files, read from the installed package: the paper's
numbers (published.yaml) and the measured rates of the cost model
(costs.yaml)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def package_yaml(name: str) -> dict[str, Any]:
    """One of palpaper's data files (published.yaml, costs.yaml)."""
    return yaml.safe_load(resources.files("palpaper").joinpath(name).read_text("utf-8"))


def published() -> dict[str, Any]:
    """The paper's numbers of each result and dataset, and its protocol."""
    return package_yaml("published.yaml")
