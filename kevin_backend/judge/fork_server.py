"""The fork server: one process per judge worker with torch and the candidate's side imported
(CUDA not initialised), forking a fresh process for each candidate in a few milliseconds.

    python -m kevin_backend.judge.fork_server FD        # FD: the control socket (from the judge)

Per request on the control socket (one byte, with two file descriptors: the conversation socket
and the write end of a stderr pipe), it forks; the child becomes a session of its own, takes the
pipe as its stdout and stderr, dies with the fork server (PDEATHSIG), writes no core files, and
serves the judge on the socket (`candidate_worker.serve`); the fork server answers the child's
pid. The fork server never runs candidate code, and neither it nor the judge can be traced by a
child (both are made non-dumpable), so a candidate cannot write into their memory.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
import struct
import sys

__all__ = ["make_undumpable", "main"]

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def make_undumpable() -> None:
    """No process of the same user may ptrace this one or read or write its memory (/proc/PID/mem)."""
    _prctl(_PR_SET_DUMPABLE, 0)


def _child(conversation: int, errors: int, control: socket.socket, device: str, folder: str) -> int:
    control.close()
    os.setsid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(errors, 1)
    os.dup2(errors, 2)
    for fd in (null, errors):
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    import faulthandler

    faulthandler.enable()  # a fatal signal says its name on stderr: the judge's feedback quotes it
    from kevin_backend.judge.candidate_worker import serve

    return serve(socket.socket(fileno=conversation), device, folder)


def _warm() -> None:
    """What every candidate's process needs, imported and first used once here, before any fork
    (the dispatch audit's first use alone imports for about two seconds). No CUDA."""
    import torch

    import kevin_backend.cache.key  # noqa: F401
    import kevin_backend.judge.candidate_worker  # noqa: F401
    import kevin_backend.judge.shared_values  # noqa: F401
    import kevin_backend.measure.compare  # noqa: F401
    import kevin_backend.measure.inputs  # noqa: F401
    import kevin_backend.measure.memory  # noqa: F401
    import kevin_backend.runtime.op  # noqa: F401
    import kevin_backend.toolchain.build  # noqa: F401
    import kevin_backend.types  # noqa: F401
    import torch._dynamo  # noqa: F401
    from kevin_backend.judge.audit import Audit

    with torch.no_grad(), Audit():
        torch.empty(4).fill_(1.0).view(2, 2)


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    make_undumpable()
    import torch  # noqa: F401  (imported once, here, before any fork)

    _warm()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.sendall(b"R")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 2)
        except OSError:
            return 0
        if not message:
            return 0
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        device, _, folder = message.decode().partition("\n")
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(fds[0], fds[1], control, device, folder)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        control.sendall(struct.pack("<i", pid))


if __name__ == "__main__":
    sys.exit(main())
