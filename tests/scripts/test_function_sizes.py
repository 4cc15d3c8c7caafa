"""scripts/function_sizes.py: the function-length counts behind the size limits (pyproject's ruff section)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "function_sizes.py"

SOURCE = '''\
def short():
    return 1


class Box:
    def method(self):
        """Three lines."""
        return 2

    async def outer(self):
        def inner():
            return 3

        return inner()
'''


@pytest.fixture(scope="module")
def sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("function_sizes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["function_sizes"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_each_function_is_counted_from_def_to_its_last_line_nested_ones_on_their_own(sizes: ModuleType) -> None:
    found = {(s.qualname, s.lineno, s.lines) for s in sizes.sizes_in(SOURCE, "m.py")}
    assert found == {("short", 1, 2), ("Box.method", 6, 3), ("Box.outer", 10, 5), ("Box.outer.inner", 11, 2)}


def test_the_report_counts_over_each_limit_and_lists_the_longest(sizes: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(SOURCE)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "m.py").write_text("def ignored():\n    pass\n")
    measured = sizes.measure([str(tmp_path / "pkg")])
    assert [s.qualname for s in measured] == ["Box.outer", "Box.method", "short", "Box.outer.inner"]
    report = sizes.report(measured, [2, 4], listed=2)
    assert report.splitlines() == [
        "4 functions",
        "over 2 lines: 2",
        "over 4 lines: 1",
        "longer than 2 lines:",
        f"     5  {tmp_path / 'pkg' / 'm.py'}:10 Box.outer",
        f"     3  {tmp_path / 'pkg' / 'm.py'}:6 Box.method",
    ]


def test_a_path_that_does_not_exist_is_named(sizes: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no such file or folder: .*nowhere"):
        sizes.measure([str(tmp_path / "nowhere")])
