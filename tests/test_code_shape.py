"""The package's shape: no function over 120 lines and no file over 700 in kevin_backend/ (a
function counts its nested functions; a file counts every line). Long functions of closures and
files of several ideas are where the code stopped being readable; this keeps them out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kevin_backend

PACKAGE = Path(kevin_backend.__file__).parent
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120


def too_long(package: Path) -> list[str]:
    """Every file and function over the limits, with its length."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(package.parent).as_posix()
        if len(text.splitlines()) > MAX_FILE_LINES:
            found.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_file_or_function_is_over_the_limits() -> None:
    assert too_long(PACKAGE) == []


def test_the_check_sees_a_long_function_and_a_long_file(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long_function.py").write_text(f"def outer():\n    def inner():\n        pass\n{body}")
    (package / "long_file.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (package / "fine.py").write_text("def f():\n    return 1\n")
    assert too_long(package) == [f"pkg/long_file.py: {MAX_FILE_LINES + 1} lines",
                                 f"pkg/long_function.py:1 outer: {MAX_FUNCTION_LINES + 3} lines"]


def test_module_file_names_are_unique() -> None:
    """Two modules of one name in different folders (three runner.py once) make a reader open the
    wrong one: each name says one thing."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(path.relative_to(PACKAGE).as_posix())
    assert {name: places for name, places in seen.items() if len(places) > 1} == {}


def test_every_package_folder_is_shipped() -> None:
    """pyproject.toml lists the packages a wheel holds: a new folder left off the list works in a
    checkout and is missing from an install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert folders - listed == set()
