"""The project's structure in numbers: import arrows between rooms, circles,
long functions and modules, and `# fmt: skip` lines.

    python3 .ci/structure.py [FOLDER …] [--limit 60] [--module-limit 400]

A room is a subpackage of `pipeline` (`pipeline.data`, `pipeline.model`, …),
a module directly in `pipeline/` (`pipeline.params`, `pipeline.cli`, …) or one
of the other top-level packages (`palcore`, `solver`, `palpaper`). Every import
counts, wherever it stands (module level, inside a function, under
`TYPE_CHECKING`): each is a dependency a reader has to follow. Prints

* each arrow `room -> room  N` (N: module-to-module imports behind it),
* each circle: a strongly connected set of rooms, then of modules,
* the imports made inside a function (a loop dodged there is still a loop),
* the functions over `--limit` lines and modules over `--module-limit`
  (as .ci/function_sizes.py counts them),
* the `# fmt: skip` lines,

then one summary line of the counts. Default folders: pipeline palcore solver
palpaper.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from function_sizes import long_functions  # noqa: E402

FOLDERS = ["pipeline", "palcore", "solver", "palpaper"]


def module_name(path: Path) -> str:
    """`pipeline/data/loader.py` -> `pipeline.data.loader` (a package: its name)."""
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room(module: str) -> str:
    """The room of a module: `pipeline.<sub>` (a subpackage, or a module directly
    in `pipeline/`), else its top-level package."""
    parts = module.split(".")
    if parts[0] == "pipeline" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def imports(path: Path, module: str, known: set[str]) -> list[tuple[str, bool]]:
    """(imported project module, inside a function) for each import of `path`.

    `from P import n` is P.n where that is a module, else P; relative imports
    are resolved against `module`.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[str, bool]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in known or alias.name.split(".")[0] in FOLDERS:
                        found.append((_nearest(alias.name, known), local))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                if base.split(".")[0] not in FOLDERS:
                    continue
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.append(
                        (full if full in known else _nearest(base, known), local)
                    )
            visit(child, inner)

    visit(tree, False)
    return [(m, loc) for m, loc in found if m and m != module]


def _nearest(name: str, known: set[str]) -> str:
    """`name`, or its closest parent that is a project module."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def fmt_skips(files: list[Path]) -> list[str]:
    """`path:line` of each line holding `# fmt: skip`."""
    return [
        f"{p}:{i}"
        for p in files
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "# fmt: skip" in line
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", default=FOLDERS)
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--module-limit", type=int, default=400)
    args = ap.parse_args()
    files = sorted(p for f in args.folders for p in Path(f).rglob("*.py"))
    names = {p: module_name(p) for p in files}
    known = set(names.values())

    modules: dict[str, set[str]] = defaultdict(set)
    rooms: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    local_imports = []
    for path in files:
        me = names[path]
        modules[me]
        for target, local in imports(path, me, known):
            modules[me].add(target)
            if local:
                local_imports.append(f"{path}: {target}")
            if room(me) != room(target):
                rooms[room(me)][room(target)] += 1

    print("arrows (room -> room, module imports behind it):")
    n_arrows = 0
    for a in sorted(rooms):
        for b in sorted(rooms[a]):
            print(f"  {a} -> {b}  {rooms[a][b]}")
            n_arrows += 1
    room_graph = {a: set(bs) for a, bs in rooms.items()}
    room_circles = circles(room_graph)
    module_circles = circles(modules)
    print("circles of rooms:")
    for c in room_circles:
        print("  " + " <-> ".join(c))
    print("circles of modules:")
    for c in module_circles:
        print("  " + " <-> ".join(c))
    into_stages = sorted(
        f"{m} -> {t}"
        for m, ts in modules.items()
        for t in ts
        if room(t) == "pipeline.stages" and room(m) != "pipeline.stages"
    )
    print("imports of a stage module from outside pipeline.stages:")
    for line in into_stages:
        print("  " + line)
    print("imports inside a function (project modules):")
    for line in local_imports:
        print("  " + line)

    long = sorted(
        (
            (n, f"{p}:{line}", name)
            for p in files
            for line, name, n in long_functions(p, args.limit)
        ),
        key=lambda r: (-r[0], r[1]),
    )
    print(f"functions over {args.limit} lines:")
    for n, where, name in long:
        print(f"  {where} {name} {n}")
    sizes = ((len(p.read_text(encoding="utf-8").splitlines()), p) for p in files)
    big = sorted(((n, p) for n, p in sizes if n > args.module_limit), reverse=True)
    print(f"modules over {args.module_limit} lines:")
    for n, p in big:
        print(f"  {p} {n}")
    skips = fmt_skips(files)
    print("# fmt: skip lines:")
    for line in skips:
        print("  " + line)
    print(
        f"{n_arrows} arrows, {len(room_circles)} circles of rooms, "
        f"{len(module_circles)} circles of modules, {len(into_stages)} imports of a "
        f"stage from outside, {len(local_imports)} function-local imports, "
        f"{len(long)} functions over {args.limit}, {len(big)} modules over "
        f"{args.module_limit}, {len(skips)} fmt: skip"
    )


if __name__ == "__main__":
    main()
