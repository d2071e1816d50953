"""A candidate's own process: the only place its code runs. Started by the fork server
(`fork_server.py`) for one candidate and discarded after it; the judge (`candidate_process.py`)
talks to it over a socket (`wire.py`) and never trusts what it says: every output it reports is
read back and checked by the judge, and every time is the judge's own clock.

The conversation, one reply per message:

    -> (on start, after CUDA is up)         <- {"ready": true, "pid": ...}
    -> {"op": "load", mode, programs, seed, ...}
                                             <- {"ok": true} | {"error": {...}}
    -> {"op": "arena", "desc": ...}          <- {"ok": true}             (memory the judge shares)
    -> {"op": "call", "inputs": [...], "audit": bool, "poison": [...], "release": bool}
                                             <- {"ok": true, "outputs": [...], "computed": [...]}
    -> {"op": "batch", "calls": [[...], ...], "audit": [index, ...]}
                                             <- {"ok": true, "outputs": [[...], ...], "computed": [...]}
    -> {"op": "release"}                     <- {"ok": true}   (the allocator's cache given back)
    -> {"op": "exit"}

Modes: "candidate" (a candidate's `ModelNew`, as the judge runs it), "launch" (a kept kernel
through `kevin::launch`, as a compiled model calls it: the decision's re-timing), "reference"
(the task's own `Model`, eager and compiled by Inductor: a process the judge starts for the
references' times, so that both sides of every comparison are called the same way). A batch
keeps every call's outputs until the next message, so the judge can read any one of them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from kevin_backend.judge.attribution import CUDA_FAULTS
from kevin_backend.judge.shared_values import export_outputs, open_arena, wrap
from kevin_backend.judge.wire import WireError, receive, send

__all__ = ["serve"]



def _error(where: str, exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}"
    return {"error": {"where": where, "type": type(exc).__name__, "text": text[:4000],
                      "oom": isinstance(exc, torch.OutOfMemoryError),
                      "fault": any(f in text.lower() for f in CUDA_FAULTS)}}


class _Worker:
    def __init__(self, device: torch.device, folder: Path) -> None:
        self.device = device
        self.folder = folder
        self.arenas: dict[int, torch.Tensor] = {}
        self.entries: dict[str, Callable[..., Any]] = {}
        self.kept: list[Any] = []
        self.copies: list[Any] = []  # copies of outputs in memory it did not allocate, kept like `kept`
        self.handles: dict[int, tuple[bytes, int]] = {}
        self.calls = 0
        self.stack = contextlib.ExitStack()
        self.launch: dict[str, Any] = {}
        self.slot_values: dict[str, list[Any]] = {}
        self.filtered = False  # the syscall filter installed (`syscall_filter.py`)

    # -- messages --------------------------------------------------------------------------
    def load(self, m: dict[str, Any]) -> dict[str, Any]:
        from kevin_backend.cache.key import apply_numerics
        from kevin_backend.measure.inputs import to_device
        from kevin_backend.types import load_program

        marks = [("start", time.perf_counter())]  # where a load's time goes (information only)
        if m.get("numerics"):
            apply_numerics(dict(m["numerics"]))
        marks.append(("numerics", time.perf_counter()))
        if m.get("memory_bytes") and self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, float(m["memory_bytes"]) / total), self.device)
        if m.get("build_root"):
            from kevin_backend.toolchain.build import Builder, answering_load_inline

            self.stack.enter_context(answering_load_inline(Builder(Path(m["build_root"]), jobs=1), m.get("arch")))
        marks.append(("builder", time.perf_counter()))
        try:
            task = load_program(m["task"], "kevin_task")
            init = [to_device(v, self.device) for v in task.get_init_inputs()]
        except Exception as exc:  # noqa: BLE001 - the task is the judge's: its failure
            return _error("task", exc)
        marks.append(("task", time.perf_counter()))
        mode = m["mode"]
        confinement = ""
        if mode != "reference":  # (the references' process compiles with Inductor: it starts compilers)
            from kevin_backend.judge.confine import confine
            from kevin_backend.judge.syscall_filter import forbid_escapes

            try:
                confinement = confine(writable=self.folder).describe()
                self.filtered = forbid_escapes()
            except OSError as exc:  # the judge's machinery failed, before any candidate code ran
                return _error("confine", exc)
            marks.append(("confine", time.perf_counter()))
        if mode == "reference":
            torch.manual_seed(int(m["seed"]))
            reference = task.Model(*init).to(self.device).eval()
            self.entries["eager"] = reference
            self.launch = {"reference": reference, "backend": m.get("compile_backend", "inductor")}
            return {"ok": True}
        try:
            program = load_program(m["candidate"], "kevin_candidate")
        except Exception as exc:  # noqa: BLE001
            return _error("load", exc)
        marks.append(("program", time.perf_counter()))
        if not hasattr(program, "ModelNew"):
            return {"error": {"where": "load", "type": "NO_MODELNEW", "text": "the program defines no ModelNew"}}
        try:
            torch.manual_seed(int(m["seed"]))
            model = program.ModelNew(*init).to(self.device).eval()
        except Exception as exc:  # noqa: BLE001
            return _error("init", exc)
        marks.append(("model", time.perf_counter()))
        self.entries["model"] = model
        if mode == "launch":
            torch.manual_seed(int(m["seed"]))
            self.launch = {"reference": task.Model(*init).to(self.device).eval(), "kernel": m["candidate"], "model": model}
        seconds = {name: round(t - marks[k][1], 4) for k, (name, t) in enumerate(marks[1:])}
        return {"ok": True, "confinement": confinement, "seconds": seconds}

    def arena(self, m: dict[str, Any]) -> dict[str, Any]:
        desc = m["desc"]
        self.arenas[int(desc["id"])] = open_arena(desc, self.device, self.folder)
        return {"ok": True}

    def _entry(self, name: str, values: list[Any]) -> Callable[..., Any]:
        if name in self.entries:
            return self.entries[name]
        if name == "inductor":
            from kevin_backend.measure.inductor import inductor_function

            function, how = inductor_function(self.launch["reference"], values, self.launch["backend"])
            self.entries["inductor"] = function
            self.launch["how"] = how
            return function
        if name == "launch":
            self.entries["launch"] = _launcher(self.launch, values)
            return self.entries["launch"]
        raise KeyError(f"no entry {name!r}")

    def call(self, m: dict[str, Any]) -> dict[str, Any]:
        from kevin_backend.judge.audit import Audit
        from kevin_backend.measure.compare import output_list
        from kevin_backend.measure.memory import poison

        self.kept, self.copies = [], []
        values = wrap(m["inputs"], self.arenas)
        if m.get("poison"):
            poison(self.device, [int(b) for b in m["poison"]])
        audit = Audit()
        try:
            fn = self._entry(m.get("entry", "model"), values)
            with torch.no_grad(), (audit if m.get("audit") else contextlib.nullcontext()):
                outputs = output_list(fn(*values))
            self._sync()
        except Exception as exc:  # noqa: BLE001 - the program's failure
            return _error("forward", exc)
        self.kept = [outputs]
        described = self._export(outputs)
        if m.get("release"):  # the GPU is short: the forward's cached temporaries go back to it
            self.release({})
        return {"ok": True, "outputs": described, "computed": audit.computed, **self._notes()}

    def release(self, m: dict[str, Any]) -> dict[str, Any]:
        """The allocator's cached blocks given back to the device (the outputs stay)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"ok": True}

    def batch(self, m: dict[str, Any]) -> dict[str, Any]:
        from kevin_backend.judge.audit import Audit
        from kevin_backend.measure.compare import output_list

        marks = [("start", time.perf_counter())]  # where the time goes, for `profile` (information only)
        self.kept, self.copies = [], []
        calls = [self._wrapped(inputs) for inputs in m["calls"]]
        audited = set(m.get("audit", ()))
        audit = Audit()
        kept: list[list[Any]] = []
        marks.append(("wrap", time.perf_counter()))
        try:
            fn = self._entry(m.get("entry", "model"), calls[0])
            with torch.no_grad():
                for index, values in enumerate(calls):
                    if index in audited:
                        with audit:
                            kept.append(output_list(fn(*values)))
                    else:
                        kept.append(output_list(fn(*values)))
            marks.append(("calls queued", time.perf_counter()))
            self._sync()
            marks.append(("synchronised", time.perf_counter()))
        except Exception as exc:  # noqa: BLE001
            return _error("forward", exc)
        self.kept = kept
        outputs = [self._export(outputs) for outputs in kept]
        marks.append(("outputs described", time.perf_counter()))
        reply = {"ok": True, "outputs": outputs, "computed": audit.computed, **self._notes()}
        if m.get("profile"):
            reply["profile"] = {name: (t - marks[k][1]) * 1e3 for k, (name, t) in enumerate(marks[1:])}
        return reply

    # -- helpers ---------------------------------------------------------------------------
    def _wrapped(self, descs: list[dict[str, Any]]) -> list[Any]:
        """The values of a slot, wrapped once per layout and place (the timing's slots keep theirs
        from round to round; only the values in them change)."""
        key = repr(descs)
        if key not in self.slot_values:
            if len(self.slot_values) > 256:
                self.slot_values.clear()
            self.slot_values[key] = wrap(descs, self.arenas)
        return self.slot_values[key]

    def _notes(self) -> dict[str, Any]:
        loaded = self.launch.get("loaded")
        notes: dict[str, Any] = {}
        if loaded is not None and loaded.disabled is not None:
            notes["disabled"] = loaded.disabled
        if "how" in self.launch:
            notes["how"] = self.launch["how"]
        return notes

    def _export(self, outputs: list[Any]) -> list[dict[str, Any]]:
        self.calls += 1
        return export_outputs(outputs, self.device, self.folder, f"{os.getpid()}-{self.calls}", self.handles, self.copies)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _launcher(launch: dict[str, Any], values: list[Any]) -> Callable[..., Any]:
    """The kernel as the backend calls it: `kevin::launch` with a `LoadedKernel` registered under a
    key of its own (a task whose inputs are not all tensors calls `ModelNew` directly)."""
    import hashlib

    from kevin_backend.runtime import op as _op  # noqa: F401  (defines kevin::launch)
    from kevin_backend.runtime import registry as runtime
    from kevin_backend.types import TensorSpec

    model, reference = launch["model"], launch["reference"]
    if not all(isinstance(v, torch.Tensor) for v in values):
        return model
    key = "retime-" + hashlib.sha256(launch["kernel"].encode()).hexdigest()[:32]
    loaded = runtime.LoadedKernel(key, tuple(TensorSpec.of(v) for v in values), model.forward, reference.forward,
                                  launch["kernel"])
    if not loaded.accepts(values) or any(v.data_ptr() % 16 for v in values):
        raise RuntimeError("the runtime would run the reference, not the kernel, on the task's inputs "
                           "(an input does not start 16-byte aligned)")
    runtime.register(loaded)
    launch["loaded"] = loaded
    call = torch.ops.kevin.launch.default

    def through_runtime(*args: Any) -> Any:
        return call(key, list(args), False)

    return through_runtime


def serve(sock: socket.socket, device_name: str, folder: str) -> int:
    """Answer the judge until it says exit or goes away."""
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # the context, before the judge waits on it
    worker = _Worker(device, Path(folder))
    handlers = {"load": worker.load, "arena": worker.arena, "call": worker.call, "batch": worker.batch,
                "release": worker.release}
    try:
        send(sock, {"ready": True, "pid": os.getpid()})
        while True:
            message = receive(sock)
            op = message.get("op")
            if op == "exit":
                return 0
            handler = handlers.get(op)  # type: ignore[arg-type]
            try:
                reply = handler(message) if handler else {"error": {"where": "wire", "type": "", "text": f"no op {op!r}"}}
            except Exception as exc:  # noqa: BLE001 - reported; the judge decides whose it is
                reply = _error(op or "wire", exc)
            send(sock, reply)
    except WireError:
        return 0


if __name__ == "__main__":  # (started by the fork server, not by hand)
    sys.exit(2)
