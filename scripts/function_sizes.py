"""Function sizes: how many functions are longer than some line counts, and the longest ones.

    .venv/bin/python scripts/function_sizes.py [PATH ...] [--over 50 60 100] [--list 60]

A function's size is its lines from ``def`` to its last line (docstring, comments and blank lines
included; decorators not), as ``ast`` sees them; a nested function counts on its own and inside the
function that holds it. PATHs (files or folders; default: ``ale_iac agents``) are read recursively.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATHS = ("ale_iac", "agents")
DEFAULT_LIMITS = (50, 60, 100)


@dataclass(frozen=True)
class FunctionSize:
    path: str
    qualname: str
    lineno: int
    lines: int


def sizes_in(source: str, path: str) -> Iterator[FunctionSize]:
    """Every function and method of one module, with its qualified name (``Class.method``, ``outer.inner``)."""

    def visit(node: ast.AST, prefix: str) -> Iterator[FunctionSize]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                yield FunctionSize(path, name, child.lineno, end - child.lineno + 1)
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(source, path), "")


def python_files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts))
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"function_sizes: no such file or folder: {given}")
    return found


def measure(paths: list[str]) -> list[FunctionSize]:
    sizes: list[FunctionSize] = []
    for path in python_files(paths):
        sizes.extend(sizes_in(path.read_text(encoding="utf-8"), str(path)))
    return sorted(sizes, key=lambda s: (-s.lines, s.path, s.lineno))


def report(sizes: list[FunctionSize], limits: list[int], listed: int) -> str:
    lines = [f"{len(sizes)} functions"]
    lines += [f"over {limit} lines: {sum(1 for s in sizes if s.lines > limit)}" for limit in limits]
    longest = [s for s in sizes if s.lines > listed]
    if longest:
        lines.append(f"longer than {listed} lines:")
        lines += [f"  {s.lines:4d}  {s.path}:{s.lineno} {s.qualname}" for s in longest]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS))
    parser.add_argument("--over", type=int, nargs="+", default=list(DEFAULT_LIMITS), help="line counts to count above")
    parser.add_argument("--list", type=int, default=60, dest="listed", help="list the functions longer than this")
    args = parser.parse_args(argv)
    print(report(measure(args.paths), args.over, args.listed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
