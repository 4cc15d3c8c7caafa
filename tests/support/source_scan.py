"""What source files import and compare, read with ``ast`` in a process of its own.

CPython 3.11 keeps the AST constructor's recursion depth in state that every thread of an interpreter shares,
so an ``ast.parse`` in a test worker that has other threads running (an in-process Pulumi program's, a
server's) can fail with a spurious "SystemError: AST constructor recursion depth mismatch" (python/cpython
gh-106905). The scan runs here, single-threaded: ``python -m tests.support.source_scan FILE...`` prints JSON.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Compare:
    """A comparison: its line, the attribute names on its sides, the string constants in it."""

    line: int
    attributes: list[str]
    strings: list[str]


@dataclass(frozen=True)
class Source:
    imports: list[str]
    """Every module the file imports, at any depth (lazy imports included): ``m`` of ``import m`` and of
    ``from m import n``."""
    from_names: list[str]
    """``m.n`` of every ``from m import n`` (a submodule or a name of ``m``)."""
    compares: list[Compare]


def _scan_one(path: Path) -> dict[str, object]:
    imports: list[str] = []
    from_names: list[str] = []
    compares: list[dict[str, object]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imports += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imports.append(node.module)
            from_names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            compares.append(
                {
                    "line": node.lineno,
                    "attributes": [s.attr for s in sides if isinstance(s, ast.Attribute)],
                    "strings": [
                        c.value
                        for s in sides
                        for c in ast.walk(s)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    ],
                }
            )
    return {"imports": imports, "from_names": from_names, "compares": compares}


def scan(paths: list[Path]) -> dict[Path, Source]:
    """Each file's imports and comparisons, read by a fresh single-threaded interpreter."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.source_scan", *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    raw = json.loads(done.stdout)
    return {
        Path(name): Source(
            imports=found["imports"],
            from_names=found["from_names"],
            compares=[Compare(**c) for c in found["compares"]],
        )
        for name, found in raw.items()
    }


if __name__ == "__main__":
    print(json.dumps({name: _scan_one(Path(name)) for name in sys.argv[1:]}))
