"""A seccomp filter for the cell (classic BPF, handed to `bwrap --seccomp FD`).

Namespaces and the uid drop already contain a program; the filter takes away what would
let it build a new kernel-privileged context inside the cell: a new user namespace (from
which it could mount an unbounded tmpfs or reach namespaced-root code paths), setns,
mount-API calls, ptrace, keyrings, bpf, io_uring, kernel modules. Denied calls fail
with EPERM (clone3 with ENOSYS, so that libc falls back to clone, whose flags the filter
can read). Any syscall through another ABI (32-bit `int 0x80`, x32) kills the process:
its numbers would bypass the table.

Only x86-64 is covered; elsewhere `program()` returns None and the cell runs without
the filter (`Cell.info['seccomp']` says so).
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000

LD_W_ABS = 0x20   # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35      # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45     # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06      # BPF_RET | BPF_K

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
NR, ARCH, ARG0_LOW = 0, 4, 16

# x86-64 syscall numbers.
CLONE, UNSHARE, CLONE3 = 56, 272, 435
DENIED = {
    "ptrace": 101, "pivot_root": 155, "mount": 165, "umount2": 166, "init_module": 175,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "perf_event_open": 298, "open_by_handle_at": 304, "setns": 308,
    "finit_module": 313, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}


def program() -> bytes | None:
  """The filter as `struct sock_filter[]` bytes, or None off x86-64."""
  if platform.machine() != "x86_64":
    return None
  insns = [(LD_W_ABS, 0, 0, ARCH),
           (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
           (RET_K, 0, 0, RET_KILL_PROCESS),
           (LD_W_ABS, 0, 0, NR),
           (JGE_K, 0, 1, X32_SYSCALL_BIT),
           (RET_K, 0, 0, RET_KILL_PROCESS)]
  for nr in (CLONE, UNSHARE):
    # The flags are the first argument of both; the low 32 bits hold CLONE_NEWUSER.
    insns += [(JEQ_K, 0, 4, nr),
              (LD_W_ABS, 0, 0, ARG0_LOW),
              (JSET_K, 0, 1, CLONE_NEWUSER),
              (RET_K, 0, 0, RET_ERRNO | EPERM),
              (RET_K, 0, 0, RET_ALLOW)]
  insns += [(JEQ_K, 0, 1, CLONE3), (RET_K, 0, 0, RET_ERRNO | ENOSYS)]
  for nr in sorted(DENIED.values()):
    insns += [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, RET_ERRNO | EPERM)]
  insns.append((RET_K, 0, 0, RET_ALLOW))
  return b"".join(struct.pack("<HBBI", *insn) for insn in insns)
