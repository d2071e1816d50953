"""The judge's side of a candidate's own process: start it (from the fork server, with one spare
started ahead), load the candidate there, and call it on shared inputs. Nothing the candidate's
code can reach decides its verdict: the judge keeps the references, makes the inputs, reads the
outputs back into its own memory and compares them, and keeps the time with its own clock.

    launcher = Launcher(device)                      # the fork server; one per judge worker
    remote = RemoteModel(launcher.take(), device, folder, deadline)
    remote.load({...})                               # raises Verdict on the candidate's failures
    outputs, inputs_after = remote.call(values, audit=True)
    remote.close()                                   # the process is killed and gone

Whose failure an end is: an error the candidate's process reports while loading, building or
running the candidate, its death, its silence past the deadline, or a reply the judge cannot
read are the candidate's. An out-of-memory error is the candidate's unless the judge's own
accounting says the GPU was short: after the process is gone, the device has less free memory
than the candidate was allowed (then RESOURCE). The process's own words never make a RESOURCE.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from kevin_backend.judge.attribution import CUDA_FAULTS, Verdict, error
from kevin_backend.judge.shared_values import Arena, OutputReader, SharedValueError, arena_bytes, place
from kevin_backend.judge.wire import WireClosed, WireError, WireGarbage, WireTimeout, receive, send
from kevin_backend.measure.memory import host_memory, host_oom_kills, host_short

__all__ = ["CandidateProcess", "Launcher", "RemoteModel", "shared_folder"]



def shared_folder() -> Path:
    """A folder of this process's own for the memory it shares on a CPU (files) and outputs read back."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="kevin-judge-", dir=base))


class CandidateProcess:
    """One process forked for one candidate: its conversation socket, pid and stderr."""

    def __init__(self, pid: int, sock: socket.socket, errors_fd: int) -> None:
        self.pid = pid
        self.sock = sock
        self.errors: collections.deque[str] = collections.deque(maxlen=400)
        self.ready = False
        threading.Thread(target=self._read_errors, args=(errors_fd,), daemon=True).start()

    def _read_errors(self, fd: int) -> None:
        with os.fdopen(fd, "r", errors="replace") as stream:
            for line in stream:
                self.errors.append(line.rstrip("\n")[:2000])

    def request(self, message: dict[str, Any], deadline: float) -> dict[str, Any]:
        if not self.ready:
            hello = receive(self.sock, deadline)
            if not hello.get("ready"):
                raise WireGarbage("the process did not start as a candidate's process")
            self.ready = True
        send(self.sock, message)
        return receive(self.sock, deadline)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def stderr(self, lines: int = 12) -> str:
        """The last lines of its stderr, after the fatal signal's name when it died of one."""
        text = list(self.errors)
        fatal = [line for line in text if line.startswith("Fatal Python error")][:1]
        return "\n".join(fatal + text[-lines:])

    def kill(self, wait: float = 10.0) -> None:
        """Killed with everything it started, and waited for: its GPU context is gone on return."""
        for target in (-self.pid, self.pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.sock.close()
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.005)


class Launcher:
    """The fork server of one judge worker, and the next candidate's process started ahead."""

    def __init__(self, device: torch.device, folder: Path) -> None:
        self.device = device
        self.folder = folder
        self.spare: CandidateProcess | None = None
        self.lock = threading.Lock()
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        from kevin_backend.judge.sandbox import worker_env

        self.server = subprocess.Popen([sys.executable, "-m", "kevin_backend.judge.fork_server", str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=worker_env(),
                                       start_new_session=True)
        theirs.close()
        self.control = ours
        ready = ours.recv(1)
        if ready != b"R":
            raise RuntimeError("the judge's fork server did not start")

    def _spawn(self) -> CandidateProcess:
        mine, theirs = socket.socketpair()
        read_end, write_end = os.pipe()
        request = f"{self.device}\n{self.folder}".encode()
        socket.send_fds(self.control, [request], [theirs.fileno(), write_end])
        theirs.close()
        os.close(write_end)
        (pid,) = struct.unpack("<i", self._exactly(4))
        return CandidateProcess(pid, mine, read_end)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.control.recv(n - len(data))
            if not chunk:
                raise RuntimeError("the judge's fork server ended")
            data += chunk
        return data

    def take(self) -> CandidateProcess:
        """A fresh process (the spare, already starting CUDA), and the next spare started."""
        with self.lock:
            if self.server.poll() is not None:  # a candidate killed it (its parent): a new one, no spare of the old
                self.restarts += 1
                self.control.close()
                self.spare = None
                self._start()
            process = self.spare if self.spare is not None and self.spare.alive() else self._spawn()
            self.spare = self._spawn()
            return process

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill(wait=0)
            self.spare = None
        self.control.close()
        try:
            self.server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.server.kill()


def _killed_for_host_memory(kills_before: int | None, what: str) -> dict[str, Any] | None:
    """A process that died while the kernel's out-of-memory killer killed (candidates' processes
    are its first pick, `confine.py`): the host's memory, read now that the process is gone,
    decides whose failure it was. Still short: something else holds it (RESOURCE, no verdict);
    plenty: the process itself took it (OUT_OF_MEMORY). None when no kill was counted."""
    kills = host_oom_kills()
    if kills_before is None or kills is None or kills <= kills_before:
        return None
    memory = host_memory()
    if memory is None:
        return None
    available, total = memory
    text = (f"the kernel's out-of-memory killer ended the process in {what}; the host now has "
            f"{available / 2**30:.1f} of {total / 2**30:.1f} GiB available")
    if host_short(available, total):
        return error("RESOURCE", "run", text + ": the host is short of memory without it")
    return error("OUT_OF_MEMORY", "run", text + ": the process had taken it")


class RemoteModel:
    """A model that lives in another process: the candidate's (untrusted) or the references' (the
    judge's own, never entered by a candidate). Called like a model, on the judge's values."""

    def __init__(self, process: CandidateProcess, device: torch.device, folder: Path, deadline: float,
                 trusted: bool = False, ledger: Any = None) -> None:
        self.process = process
        self.device = device
        self.folder = folder
        self.deadline = deadline
        self.trusted = trusted  # the references' process: a failure there is the judge's
        self.reader = OutputReader(device, folder)
        self.arenas: list[Arena] = []
        self.scratch: Arena | None = None
        self.ledger = ledger  # the judge's memory ledger: the bound the candidate is held to
        self.closed = False
        self.oom_kills = host_oom_kills()  # the kernel's count when this candidate began

    # -- the conversation ------------------------------------------------------------------
    def request(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            reply = self.process.request(message, self.deadline)
        except WireTimeout:
            self.process.kill()
            raise Verdict(self._ended("HANG", f"{what} did not finish in time")) from None
        except WireClosed:
            raise Verdict(self._died(what)) from None
        except WireGarbage as exc:
            raise Verdict(self._ended("RUNTIME_ERROR", f"the candidate's process answered {what} with garbage ({exc})")) from None
        if "error" in reply:
            raise Verdict(self._failure(reply["error"], what))
        if not reply.get("ok"):
            raise Verdict(self._ended("RUNTIME_ERROR", f"the candidate's process did not answer {what}"))
        return reply

    def _ended(self, reason: str, text: str) -> dict[str, Any]:
        if self.trusted:
            return error("INFRA", "run", f"the judge's reference process: {text}")
        return error(reason, "run", text)

    def _died(self, what: str) -> dict[str, Any]:
        time.sleep(0.05)  # its last words on stderr
        err = self.process.stderr()
        if any(f in err.lower() for f in CUDA_FAULTS):
            return self._ended("ILLEGAL_ADDRESS", f"the process died in {what}: {err}")
        killed = _killed_for_host_memory(self.oom_kills, what)
        if killed is not None:
            return killed if killed["reason"] == "RESOURCE" else self._ended(killed["reason"], killed["feedback"])
        if "out of memory" in err.lower():
            return self._memory(f"the process died out of memory in {what}: {err}")
        return self._ended("CRASH", f"the process died in {what}: {err}")

    def _failure(self, e: Any, what: str) -> dict[str, Any]:
        if not isinstance(e, dict):
            return self._ended("RUNTIME_ERROR", f"{what} failed")
        text = str(e.get("text", ""))[:4000]
        where = e.get("where")
        if where == "confine":
            return error("INFRA", "run", f"the candidate's process could not be confined: {text}")
        if where == "task" or self.trusted:
            return error("INFRA", "run", f"the judge's task failed in the candidate's process: {text}")
        if e.get("type") == "NO_MODELNEW":
            return error("NO_MODELNEW", "run", text)
        if where == "load":
            return error("RUNTIME_ERROR", "run", f"loading the candidate failed: {text}")
        if e.get("fault") is True or any(f in text.lower() for f in CUDA_FAULTS):
            return error("ILLEGAL_ADDRESS", "run", f"{what} raised {text}")
        if e.get("oom") is True or "out of memory" in text.lower():
            return self._memory(f"{what} raised {text}")
        return error("RUNTIME_ERROR", "run", f"{'ModelNew(...)' if where == 'init' else what} raised {text}")

    def _memory(self, text: str) -> dict[str, Any]:
        """The judge's own accounting decides: the process is killed and gone, then the device's
        free memory is read. Short of what the candidate was allowed: the GPU was short (RESOURCE)."""
        self.process.kill()
        bound = self.memory_bound()
        if self.device.type == "cuda" and bound:
            free, _ = torch.cuda.mem_get_info(self.device)
            if free < bound:
                return error("RESOURCE", "run", f"the GPU had {free / 2**30:.2f} GiB free, less than the "
                             f"{bound / 2**30:.2f} GiB the candidate may use: {text}")
        return error("OUT_OF_MEMORY", "run", f"{text}")

    def memory_bound(self) -> int:
        """What the candidate may use: the judge's bound for the task (factor x its inputs and
        outputs), its fixed part, and a GiB for the process's own context and parameters."""
        if self.ledger is None:
            return 0
        return int(self.ledger.factor * self.ledger.task_bytes) + self.ledger.fixed + (1 << 30)

    def give_back_cache(self) -> bool:
        """Before the candidate runs: when the GPU has less free than the candidate may use, the
        blocks this (the judge's) process's allocator keeps cached but unused are handed back to
        the device (the temporaries of making inputs and references), so the candidate is not
        short of memory the judge holds for nothing. True when it released any."""
        bound = self.memory_bound()
        if not bound or torch.cuda.memory_reserved(self.device) <= torch.cuda.memory_allocated(self.device):
            return False
        free, _ = torch.cuda.mem_get_info(self.device)
        if free >= bound:
            return False
        torch.cuda.empty_cache()
        return True

    # -- what the judge asks -----------------------------------------------------------------
    def load(self, message: dict[str, Any]) -> dict[str, Any]:
        """The program loaded in the process; the reply says how the process is confined."""
        return self.request({"op": "load", **message}, "loading the program")

    def share(self, arena: Arena) -> None:
        self.arenas.append(arena)
        self.request({"op": "arena", "desc": arena.desc}, "opening the judge's memory")

    def read(self, descs: Any, what: str) -> list[Any]:
        try:
            return self.reader.read(descs)
        except torch.OutOfMemoryError as exc:  # the judge's own copy of the outputs did not fit
            claimed = self.reader.claimed_bytes(descs)
            if self.ledger is not None and claimed <= self.ledger.task_bytes:
                raise Verdict(error("RESOURCE", "run", f"{what}: the judge's copy of the outputs ({claimed / 2**30:.2f} GiB) "
                                    f"did not fit on the GPU: {str(exc).splitlines()[0][:300]}")) from None
            raise Verdict(self._ended("OUT_OF_MEMORY", f"{what}: its process reported {claimed / 2**30:.2f} GiB of outputs, "
                                      "more than the task's inputs and outputs together")) from None
        except (SharedValueError, RuntimeError, KeyError, TypeError) as exc:
            raise Verdict(self._ended("RUNTIME_ERROR", f"{what}: its process reported outputs the judge cannot "
                                      f"read ({type(exc).__name__}: {exc})")) from None

    def call(self, values: Sequence[Any], audit: bool = False, poison: Sequence[int] = (),
             entry: str = "model") -> tuple[list[Any], list[Any], list[str]]:
        """(outputs, the inputs as they are after the call, the PyTorch compute ops the audit saw)."""
        needed = arena_bytes(values)
        if self.scratch is None or self.scratch.nbytes < needed:
            self.scratch = Arena(max(needed, 1 << 20), self.device, self.folder)
            self.share(self.scratch)
        descs, views = place(values, self.scratch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.give_back_cache()
        reply = self.request({"op": "call", "inputs": descs, "audit": audit, "poison": list(poison), "entry": entry},
                             "the forward")
        outputs = self.read(reply.get("outputs"), "the forward")
        computed = [str(c) for c in reply.get("computed", [])][:20] if isinstance(reply.get("computed"), list) else []
        return outputs, views, computed

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            send(self.process.sock, {"op": "exit"})
        except WireError:
            pass
        self.process.kill()
        self.reader.close()
        for arena in self.arenas:
            arena.close()
        self.arenas.clear()
