"""A module's code: the project files it imports, transitively.

`code_closure(module)` is a stage's code: its module and every project module
it imports, followed transitively (imports inside functions too) with the
package `__init__` files Python runs on the way. It is what a resume signature
hashes (`pipeline.stages.resume`), what an output contract covers
(`pipeline.contract_code`) and what `dvc.yaml` must list as the stage's code
deps (tests/test_dvc_deps.py). Standard library only: the `contracts` stage
reads it before any torch is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the folder holding the packages
PACKAGES = ("palcore", "pipeline", "solver")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of project module `name` (a package: its __init__.py)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path, name: str, root: Path = ROOT) -> set[str]:
    """Project modules that module `name` (source at `path`) imports anywhere."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            found.add(base)
            # `from pipeline.fakes import demo_data` imports a module, not a name
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if module_file(m, root) is not None}


def code_closure(module: str, root: Path = ROOT) -> list[Path]:
    """The files of `module` and of every project module it imports,
    transitively, with the `__init__.py` of each package on the way; sorted."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_file(name, root)
        if path is None:
            raise ValueError(f"{name}: not a module of {', '.join(PACKAGES)}")
        seen[name] = path
        parents = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]
        todo.extend(parents)
        todo.extend(imported_modules(path, name, root) - set(seen))
    return sorted(set(seen.values()))
