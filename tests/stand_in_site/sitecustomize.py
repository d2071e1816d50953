"""Loaded at the start of every Python process a test starts (conftest.py puts this folder on
PYTHONPATH): the tests' stand-in kernels (conftest.STAND_IN_POLICIES, which run the task's
reference in Python on machines without a GPU) pass the runtime's static check in those
processes too, as in the test process itself. Nothing else is let through, and the package is
not imported here: the check is wrapped when the runtime's registry is first imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

STAND_IN_POLICIES = ("test-reference", "broken")
_REGISTRY = "kevin_backend.runtime.registry"


def _let_stand_ins_through(module) -> None:  # type: ignore[no-untyped-def]
    real = module.entry_violations

    def entry_violations(entry):  # type: ignore[no-untyped-def]
        return [] if entry.policy in STAND_IN_POLICIES else real(entry)

    module.entry_violations = entry_violations


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        _let_stand_ins_through(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != _REGISTRY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
