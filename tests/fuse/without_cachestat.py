"""Run a command as on a kernel before 6.5, which has no ``cachestat``: a seccomp filter makes that
one system call fail with ENOSYS, in the command and everything it starts (the mount's daemon).

Usage: ``python without_cachestat.py COMMAND [ARG...]`` (x86-64 and arm64 share the call's number).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

from dlfs.core.libc import SYS_CACHESTAT

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000
#: Classic BPF: load the call's number; cachestat fails with ENOSYS, every other call is allowed.
_FILTER = [
    (0x20, 0, 0, 0),  # BPF_LD | BPF_W | BPF_ABS: seccomp_data.nr
    (0x15, 0, 1, SYS_CACHESTAT),  # BPF_JMP | BPF_JEQ | BPF_K
    (0x06, 0, 0, _SECCOMP_RET_ERRNO | errno.ENOSYS),  # BPF_RET | BPF_K
    (0x06, 0, 0, _SECCOMP_RET_ALLOW),
]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _FILTER))
    program = _Program(len(_FILTER), ctypes.addressof(code))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(
        _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0
    ):
        sys.exit(f"without_cachestat: seccomp refused: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
