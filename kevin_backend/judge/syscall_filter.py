"""A seccomp filter for a candidate's process: what its code may not ask the kernel for, whatever
language it asks in (Python, C++, inline assembly).

    forbid_escapes()      # in the candidate's process, before its program is loaded; irreversible

Refused with EPERM: starting programs (execve, execveat), new processes (fork, vfork, clone
without CLONE_THREAD; clone3, whose flags a filter cannot read, answers ENOSYS so the C library
falls back to clone), tracing or reading and writing another process's memory (ptrace,
process_vm_readv, process_vm_writev), and signals to any process but itself (kill and tgkill
with another target, tkill, pidfd_send_signal, pidfd_open). Threads, files, sockets, mmap and
the GPU driver's ioctls stay allowed: torch and CUDA need them. The filter is inherited by any
thread and cannot be lifted (no_new_privs is set first).

Linux on x86_64 only; elsewhere `forbid_escapes` installs nothing and says so (False).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

__all__ = ["FORBIDDEN", "forbid_escapes"]

# x86_64 system call numbers
_NR = {"kill": 62, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "tkill": 200, "tgkill": 234,
       "process_vm_readv": 310, "process_vm_writev": 311, "execveat": 322, "pidfd_send_signal": 424, "pidfd_open": 434,
       "clone3": 435}
FORBIDDEN = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "tkill",
             "pidfd_send_signal", "pidfd_open")

_AUDIT_ARCH_X86_64 = 0xC000003E
_CLONE_THREAD = 0x00010000
_EPERM, _ENOSYS = 1, 38
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_SECCOMP, _SET_MODE_FILTER, _FLAG_TSYNC = 317, 1, 1
# BPF opcodes
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06


def _insn(code: int, jt: int = 0, jf: int = 0, k: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _program(pid: int) -> bytes:
    deny = _insn(_RET_K, k=_RET_ERRNO | _EPERM)
    allow = _insn(_RET_K, k=_RET_ALLOW)
    out = [_insn(_LD_W_ABS, k=4), _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64), allow,  # another ABI: not ours to judge
           _insn(_LD_W_ABS, k=0)]
    for name in FORBIDDEN:
        out += [_insn(_JEQ_K, 0, 1, _NR[name]), deny]
    out += [_insn(_JEQ_K, 0, 1, _NR["clone3"]), _insn(_RET_K, k=_RET_ERRNO | _ENOSYS)]
    # clone: threads only
    out += [_insn(_JEQ_K, 0, 4, _NR["clone"]), _insn(_LD_W_ABS, k=16), _insn(_JSET_K, 1, 0, _CLONE_THREAD), deny, allow]
    # kill(pid, sig) and tgkill(tgid, tid, sig): this process (or, for kill, its own group: 0) only
    out += [_insn(_JEQ_K, 0, 5, _NR["kill"]), _insn(_LD_W_ABS, k=16), _insn(_JEQ_K, 2, 0, pid), _insn(_JEQ_K, 1, 0, 0),
            deny, allow]
    out += [_insn(_JEQ_K, 0, 4, _NR["tgkill"]), _insn(_LD_W_ABS, k=16), _insn(_JEQ_K, 1, 0, pid), deny, allow]
    out.append(allow)
    return b"".join(out)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def forbid_escapes() -> bool:
    """Install the filter on this process (all its threads from now on). True when installed."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    code = _program(os.getpid())
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # seccomp(2), applied to every thread at once (the process has torch's threads already)
    if libc.syscall(_SYS_SECCOMP, _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter failed")
    return True
