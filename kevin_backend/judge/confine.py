"""A candidate's process confined beyond the syscall filter (`syscall_filter.py`): no privileges,
no writes outside the folder the judge shares with it, first in line for the out-of-memory killer.

    confinement = confine(writable=folder)   # in the candidate's process, before its program loads

1. Capabilities: every one dropped (the bounding set, then the process's own sets). A process of
   the root user keeps its user id but loses what made root more than an owner: reading or
   writing another process's memory through `/proc/<pid>/mem` (the judge's processes are
   undumpable, so that needs CAP_SYS_PTRACE), files it does not own, devices' settings.
2. Landlock (Linux 5.13+): the file system is read-only outside `writable` and the GPU's device
   files (no file written, made, removed or truncated anywhere else: not the build cache, not
   the kernel cache, not the judge's code), nothing executed, and from ABI 4 no TCP connection
   or listening port (the model server is out of reach), from ABI 6 no signal or abstract socket
   outside the process.

3. The kernel's out-of-memory killer picks it first (oom_score_adj 1000): a candidate that eats
   the host's memory is the process that dies, not the judge's.

All are irreversible and inherited by every thread. Where the kernel has no Landlock (or the
platform is not Linux) the files stay as the user's permissions leave them and `Confinement`
says so; the judge notes it in the run's report.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Confinement", "confine", "landlock_abi"]

# x86_64 and aarch64 share these numbers (they are new enough to be the same everywhere)
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 24, 38
_CAP_VERSION_3 = 0x20080522

# Landlock's file-system rights (bit, first ABI that has it)
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR, _MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM, _REFER, _TRUNCATE = 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# what is refused (reading stays allowed: Python imports lazily, the driver reads its files)
_REFUSED_V1 = (_EXECUTE | _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK
               | _MAKE_FIFO | _MAKE_BLOCK | _MAKE_SYM)
_SHARED_FOLDER = _WRITE_FILE | _REMOVE_FILE | _MAKE_REG | _TRUNCATE  # the outputs' files on a CPU
_DEVICE_FILE = _WRITE_FILE  # opened read-write by the driver and the C library
# device files a process may open for writing: the GPU's, and the harmless ones
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/nvidia*", "/dev/nvidia-caps/*")


@dataclass(frozen=True)
class Confinement:
    """What `confine` put in place."""

    capabilities_dropped: bool
    landlock_abi: int  # 0: no Landlock (files as the user's permissions leave them)
    network: bool  # TCP refused (Landlock ABI 4+)
    refused: str = ""  # why Landlock was not applied where the kernel has it (the machine refused it)

    def describe(self) -> str:
        files = (f"writes only to the shared folder (Landlock ABI {self.landlock_abi}"
                 + (", no TCP" if self.network else "") + ")") if self.landlock_abi else \
            f"files not confined ({self.refused or 'no Landlock'})"
        return ("capabilities dropped" if self.capabilities_dropped else "capabilities kept") + "; " + files


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    if platform.system() != "Linux":
        return 0
    version = _libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _drop_capabilities() -> bool:
    number = _SYS_CAPSET.get(platform.machine())
    if platform.system() != "Linux" or number is None:
        return False
    libc = _libc()
    for cap in range(64):  # the bounding set first (needs CAP_SETPCAP, which goes next)
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() not in (22, 1):  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
    header = struct.pack("<Ii", _CAP_VERSION_3, 0)
    data = bytes(24)  # two (effective, permitted, inheritable) triples of zeros
    if libc.syscall(number, ctypes.c_char_p(header), ctypes.c_char_p(data)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    return True


def _landlock(abi: int, writable: Path) -> bool:
    """Restrict this process (every thread) to writing beneath `writable` and the device files.
    True when TCP is refused too."""
    libc = _libc()
    fs = _REFUSED_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("<QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        _allow(libc, ruleset, str(writable), _SHARED_FOLDER & fs)
        for pattern in _DEVICES:
            for path in glob.glob(pattern):
                if not os.path.isdir(path):
                    _allow(libc, ruleset, path, _DEVICE_FILE)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            _raise("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return bool(net)


class _Refused(OSError):
    """Landlock refused as a whole (a container's own policy, a kernel built without it): nothing
    of it applied."""


def _raise(step: str) -> None:
    errno = ctypes.get_errno()
    if errno in (1, 38, 95):  # EPERM, ENOSYS, EOPNOTSUPP: the machine's policy, not a failure of ours
        raise _Refused(errno, f"{step} refused ({os.strerror(errno)})")
    raise OSError(errno, f"{step} failed")


def _allow(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # (a device that went away: nothing to allow)
    try:
        rule = struct.pack("<Qi", access, fd)  # struct landlock_path_beneath_attr is packed: 12 bytes
        if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.c_char_p(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
    finally:
        os.close(fd)


def _first_to_die() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:  # (raising it needs no privilege)
            f.write("1000")
    except OSError:
        pass  # not Linux, or no /proc: nothing to prefer


def confine(writable: Path) -> Confinement:
    """Confine this process for good (module docstring): capabilities dropped, then Landlock where
    the kernel has it. Landlock refused as a whole by the machine's policy leaves the files as the
    user's permissions leave them (the report says so); any other failure raises OSError (the
    judge's failure: no verdict)."""
    _first_to_die()
    abi, refused = landlock_abi(), ""
    try:
        network = _landlock(abi, writable) if abi else False
    except _Refused as exc:
        abi, network, refused = 0, False, str(exc)
    dropped = _drop_capabilities()
    return Confinement(dropped, abi, network, refused)
