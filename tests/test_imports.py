"""No import cycles among kevin_backend's modules, and every module of bench/ and rl/ (where
there were some) imports on its own in a fresh process.

The import graph is read from each module's AST: every `import` and `from ... import`, at the top
and inside functions alike, so a cycle cannot hide behind a function-level import. An edge goes
to the module named (`from kevin_backend.bench import worker` to the submodule `worker`); the
package `__init__` a submodule's import runs first is not counted."""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kevin_backend

PACKAGE = Path(kevin_backend.__file__).parent


def module_files(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    modules = module_files(package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        found.add(f"{source}.{alias.name}")
                    elif source in modules:
                        found.add(source)
        found.discard(name)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle_behind_a_function_level_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from pkg.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("def g():\n    from pkg.sub import a\n")
    (pkg / "d.py").write_text("import pkg.sub.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.sub.a"}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]


def test_no_import_cycles_in_the_package() -> None:
    graph = import_graph(PACKAGE)
    assert {"kevin_backend.bench.runs", "kevin_backend.rl.trainer"} <= set(graph)
    assert "kevin_backend.bench.kernelbench" in graph["kevin_backend.bench.runs"]  # the walk reads imports
    assert cycles(graph) == []


# A fresh interpreter per module pays torch's import (most of the time) each time; here one process
# imports torch, which every module of the package imports first, and no module of the package,
# then forks a child per module that imports it: the module imports before any other of the
# package, as in a fresh interpreter. The child's traceback goes to stderr, its status is the result.
_FORK_EACH = """
import importlib, json, os, sys, traceback
import torch
codes = {}
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
        except BaseException:
            sys.stderr.write(f"--- {module}\\n" + traceback.format_exc())
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    codes[module] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def _imports_alone(modules: list[str]) -> tuple[dict[str, int], str]:
    proc = subprocess.run([sys.executable, "-c", _FORK_EACH, *modules], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_each_bench_and_rl_module_imports_alone_in_a_fresh_process() -> None:
    modules = [m for m in module_files(PACKAGE) if m.startswith(("kevin_backend.bench", "kevin_backend.rl"))]
    assert len(modules) >= 20
    halves = [modules[0::2], modules[1::2]]  # two forking processes at once
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_imports_alone, halves))
    codes = {m: code for got, _ in results for m, code in got.items()}
    assert sorted(codes) == sorted(modules)
    failed = {m: code for m, code in codes.items() if code != 0}
    assert failed == {}, "".join(err for _, err in results)[-4000:]


def test_a_module_that_fails_to_import_alone_is_reported(tmp_path: Path) -> None:
    """The forked import above sees a module that imports only after another module did."""
    (tmp_path / "first.py").write_text("def f():\n    pass\nfrom second import g\n")
    (tmp_path / "second.py").write_text("from first import f\ndef g():\n    pass\n")  # a cycle: fine after first, not alone
    proc = subprocess.run([sys.executable, "-c", _FORK_EACH, "first", "second"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert codes == {"first": 0, "second": 1}, proc.stderr
    assert "--- second" in proc.stderr and "ImportError" in proc.stderr


def test_bench_uses_only_public_names_of_the_judge_and_measure() -> None:
    """`kevin bench` times and compares through `measure/interleave.py` and `measure/compare.py`,
    never through the judge worker's private helpers."""
    seen = set()
    for name, (path, _) in module_files(PACKAGE).items():
        if not name.startswith("kevin_backend.bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("kevin_backend.judge", "kevin_backend.measure")):
                assert node.module not in ("kevin_backend.judge.run_worker", "kevin_backend.judge.sandbox"), (name, node.module)
                for alias in node.names:
                    assert not alias.name.startswith("_"), (name, node.module, alias.name)
                    seen.add(f"{node.module}.{alias.name}")
    assert {"kevin_backend.measure.interleave.interleaved", "kevin_backend.measure.compare.compare_outputs"} <= seen
