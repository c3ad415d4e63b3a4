"""Functions longer than the house's limit, and modules over theirs.

    python3 .ci/function_sizes.py [FOLDER …] [--limit 60] [--module-limit 400]

Lists, for every `.py` file below the folders (default: solver), each function
or method whose definition spans more than `--limit` lines (decorators to last
line, as `ast` sees it), then each module over `--module-limit` lines. Prints
`path:line name lines`, longest first, and the counts.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def long_functions(path: Path, limit: int) -> list[tuple[int, str, int]]:
    """(line, qualified name, lines) of each function of `path` over `limit`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = getattr(child, "name", "")
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                n = child.end_lineno - first + 1
                if n > limit:
                    found.append((first, prefix + name, n))
                visit(child, f"{prefix}{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{name}.")

    visit(tree, "")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", default=["solver"])
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--module-limit", type=int, default=400)
    args = ap.parse_args()
    files = sorted(p for f in args.folders for p in Path(f).rglob("*.py"))
    rows = [
        (n, f"{path}:{line}", name)
        for path in files
        for line, name, n in long_functions(path, args.limit)
    ]
    for n, where, name in sorted(rows, key=lambda r: (-r[0], r[1])):
        print(f"{where} {name} {n}")
    print(f"{len(rows)} functions over {args.limit} lines in {', '.join(args.folders)}")
    big = [(len(p.read_text(encoding="utf-8").splitlines()), p) for p in files]
    big = sorted(((n, p) for n, p in big if n > args.module_limit), reverse=True)
    for n, p in big:
        print(f"{p} {n} lines")
    print(f"{len(big)} modules over {args.module_limit} lines")


if __name__ == "__main__":
    main()
