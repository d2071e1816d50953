"""docs/ARCHITECTURE.md's stage table names every command of `kevin` and the module it lives in."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import kevin_backend
from kevin_backend.cli.main import COMMAND_MODULES

PACKAGE = Path(kevin_backend.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def _cli_rows() -> dict[str, str]:
    """File -> the rest of the row, for the stage table's `cli` rows."""
    rows = re.findall(r"^\| cli \| `(kevin_backend/cli/[^`]+)` \| (.*)$", ARCHITECTURE.read_text(), re.M)
    return dict(rows)


def test_every_cli_module_has_a_row() -> None:
    modules = {f"kevin_backend/cli/{p.name}" for p in (PACKAGE / "cli").glob("*.py") if p.name != "__init__.py"}
    assert modules - set(_cli_rows()) == set()


def _command_of(module: str) -> str:
    """The command `module` registers."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub, [])
    (command,) = sub.choices
    return command


def test_every_command_is_named_in_its_module_row() -> None:
    rows = _cli_rows()
    commands = {_command_of(m): m for m in COMMAND_MODULES}
    assert set(commands) >= {"generate", "prewarm", "eval", "cache", "train", "bench"}
    for command, module in commands.items():
        row = rows.get(module.replace(".", "/") + ".py", "")
        assert f"`kevin {command}" in row, (command, module)


def test_the_architecture_page_is_a_map_of_every_module() -> None:
    """docs/ARCHITECTURE.md names every module of the package (a newcomer finds each stage from
    it) and stays a map: under 15 KB, history kept in benchmarks/RESULTS.md."""
    text = ARCHITECTURE.read_text()
    missing = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and f"`{p.name}`" not in text
                     and f"{p.parent.name}/{p.name}" not in text)
    assert missing == []
    assert len(text.encode()) < 15 * 1024
