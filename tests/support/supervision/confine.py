"""Run a command on the kind of host leaderd meets in production, then exec it.

Usage: python confine.py [--deny-unshare] [--cgroup PATH] -- COMMAND [ARG...]

--deny-unshare  a seccomp filter fails unshare(2) with EPERM, as a container runtime's
                default profile or systemd's RestrictNamespaces= do: no PID namespace.
--cgroup PATH   move into that cgroup v2 group first, as systemd does for a service.

``delegated_cgroup()`` makes such a group for a test and marks it delegated the way systemd
marks a Delegate=yes group (the trusted.delegate extended attribute); ``remove_cgroup()``
kills what is left in it and removes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import tempfile
import time

# (AUDIT_ARCH_*, __NR_unshare) per machine.
_ARCH = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]  # fmt: skip


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def deny_unshare() -> None:
    arch, nr_unshare = _ARCH[platform.machine()]
    load, jump_eq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    code = [
        (load, 0, 0, 4),  # seccomp_data.arch
        (jump_eq, 0, 3, arch),  # another ABI: allow
        (load, 0, 0, 0),  # seccomp_data.nr
        (jump_eq, 0, 1, nr_unshare),
        (ret, 0, 0, _RET_EPERM),
        (ret, 0, 0, _RET_ALLOW),
    ]
    filters = (_Filter * len(code))(*[_Filter(*op) for op in code])
    program = _Program(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    seccomp = (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(program), 0, 0)
    for args in ((_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), seccomp):
        if libc.prctl(*args) != 0:
            raise OSError(ctypes.get_errno(), "prctl")


def cgroup_root() -> str | None:
    """Where the cgroup v2 hierarchy is mounted, if it is, and writable."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2" and fields[3] == "/":
                mount = fields[4]
                return mount if os.access(f"{mount}/cgroup.procs", os.W_OK) else None
    return None


def delegated_cgroup() -> str:
    """A new group below the root, marked delegated as systemd marks Delegate=yes."""
    root = cgroup_root()
    assert root is not None
    path = tempfile.mkdtemp(prefix="leaderd-test-", dir=root)
    os.setxattr(path, "trusted.delegate", b"1")
    return path


def remove_cgroup(path: str, timeout: float = 10.0) -> None:
    """Kill what is left in ``path`` and below, and remove the groups once they are empty."""
    give_up = time.monotonic() + timeout
    for sub, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError), open(f"{sub}/cgroup.kill", "w") as f:
            f.write("1")
        while True:
            try:
                os.rmdir(sub)
                break
            except FileNotFoundError:
                break
            except OSError:  # busy until its last process has exited
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.01)


def main(argv: list[str]) -> None:
    at = argv.index("--")
    options, command = argv[:at], argv[at + 1 :]
    if "--cgroup" in options:
        with open(f"{options[options.index('--cgroup') + 1]}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    if "--deny-unshare" in options:
        deny_unshare()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
