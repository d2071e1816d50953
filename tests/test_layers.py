"""The layer rule: each folder of kevin_backend is one level, and a module imports only modules of
its own folder and of the levels below it (docs/ARCHITECTURE.md, *Layers*).

    foundation   config, types, locks, lifeline, placement, version, example_models
    toolchain    building C++/CUDA              measure   timing, inputs, comparison, roofline
    cache        keys and the on-disk store     (these three are peers: none imports another)
    runtime      the op, loading a kept kernel, counters
    judge        verdicts
    generate     policies, prompts, the search, the writers
    backend      partitions, tasks, the pass, the graph check, the report
    bench, rl    benchmarks and training (peers)
    prewarm      filling the cache offline
    cli          the `kevin` command
    package      kevin_backend/__init__.py and __main__.py: the public surface

Every import counts, at the top of a module or inside a function (the graph is `test_imports`'s,
read from the source). A package's `__init__` imports only its own package's modules, so that
importing a low module never runs a high one."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_imports import PACKAGE, import_graph, module_files

# (level, folders or top-level modules); a higher level may import any lower one
LAYERS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (0, ("config", "types", "locks", "lifeline", "placement", "version", "example_models")),
    (1, ("toolchain",)),
    (1, ("measure",)),
    (1, ("cache",)),
    (2, ("runtime",)),
    (3, ("judge",)),
    (4, ("generate",)),
    (5, ("backend",)),
    (6, ("bench",)),
    (6, ("rl",)),
    (7, ("prewarm",)),
    (8, ("cli",)),
    (9, ("", "__main__")),  # the package's own __init__ ("") and `python -m kevin_backend`
)


FOUNDATION = LAYERS[0][1]


def unit_of(module: str, root: str = "kevin_backend") -> str:
    """The folder (or top-level module) a dotted module name belongs to: "" for the package,
    "foundation" for the foundation's modules (one unit: they may import each other)."""
    parts = module.split(".")
    assert parts[0] == root, module
    unit = parts[1] if len(parts) > 1 else ""
    return "foundation" if unit in FOUNDATION else unit


def level_of(unit: str) -> int:
    if unit == "foundation":
        return 0
    for level, units in LAYERS:
        if unit in units:
            return level
    raise AssertionError(f"{unit!r} is in no layer: add it to LAYERS (and to docs/ARCHITECTURE.md)")


def violations(graph: dict[str, set[str]], root: str = "kevin_backend") -> list[str]:
    """Every import against the layer order: into a higher level, or into a peer of the same level."""
    bad = []
    for module, imported in sorted(graph.items()):
        here = unit_of(module, root)
        for other in sorted(imported):
            there = unit_of(other, root)
            if there == here:
                continue
            if level_of(there) >= level_of(here):
                bad.append(f"{module} (level {level_of(here)}, {here or 'package'}) imports {other} "
                           f"(level {level_of(there)}, {there or 'package'})")
    return bad


def init_violations(package: Path) -> list[str]:
    """Imports in a sub-package's `__init__` of anything outside that sub-package."""
    graph = import_graph(package)
    bad = []
    for module, (path, is_package) in module_files(package).items():
        if not is_package or module.count(".") == 0:
            continue
        bad += [f"{module}.__init__ imports {other}" for other in sorted(graph[module])
                if not (other == module or other.startswith(module + "."))]
    return bad


def test_every_folder_has_a_level() -> None:
    units = {unit_of(m) for m in module_files(PACKAGE)}
    assert {"toolchain", "measure", "runtime", "judge", "generate", "backend", "cache", "cli"} <= units
    for unit in units:
        level_of(unit)


def test_no_import_runs_against_the_layer_order() -> None:
    graph = import_graph(PACKAGE)
    assert "kevin_backend.measure.timer" in graph["kevin_backend.measure.interleave"]  # the walk reads imports
    assert violations(graph) == []


def test_package_inits_import_only_their_own_modules() -> None:
    assert init_violations(PACKAGE) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kevin_backend"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        if not (folder / "__init__.py").exists():
            (folder / "__init__.py").write_text("")
    return root


@pytest.mark.parametrize("low, high", [("measure/timer.py", "judge/judge.py"), ("toolchain/build.py", "measure/timer.py"),
                                       ("runtime/op.py", "backend/report.py"), ("generate/engine.py", "cli/main.py")])
def test_the_checker_sees_an_import_upward_or_across(tmp_path: Path, low: str, high: str) -> None:
    """A lower module importing a higher one, or a peer (toolchain -> measure), is reported, from
    a function body too; the same import downward is not."""
    high_module = "kevin_backend." + high.removesuffix(".py").replace("/", ".")
    low_module = "kevin_backend." + low.removesuffix(".py").replace("/", ".")
    root = _package(tmp_path, {low: f"def f():\n    from {high_module} import x\n", high: "x = 1\n"})
    assert violations(import_graph(root)) == [
        f"{low_module} (level {level_of(unit_of(low_module))}, {unit_of(low_module)}) imports {high_module} "
        f"(level {level_of(unit_of(high_module))}, {unit_of(high_module)})"]
    root = _package(tmp_path / "down", {high: f"from {low_module} import x\n", low: "x = 1\n"})
    assert violations(import_graph(root)) == ([] if level_of(unit_of(low_module)) < level_of(unit_of(high_module)) else
                                              [f"{high_module} (level {level_of(unit_of(high_module))}, "
                                               f"{unit_of(high_module)}) imports {low_module} (level "
                                               f"{level_of(unit_of(low_module))}, {unit_of(low_module)})"])


def test_the_checker_sees_an_init_reaching_outside_its_package(tmp_path: Path) -> None:
    root = _package(tmp_path, {"judge/__init__.py": "from kevin_backend.measure.timer import make_timer\n",
                               "measure/timer.py": "make_timer = None\n", "cache/__init__.py": "from kevin_backend.cache import key\n",
                               "cache/key.py": ""})
    assert init_violations(root) == ["kevin_backend.judge.__init__ imports kevin_backend.measure.timer"]
