# Tries to leave the cell's namespaces or gain privileges: setuid(0), setns into
# /proc/1's namespaces, a new user namespace (root in it), mount, chroot, ptrace.
import ctypes
import os
libc = ctypes.CDLL(None, use_errno=True)
def report(name, rc):
  print(name, "OK" if rc == 0 else f"refused errno={ctypes.get_errno()}")
for name, fn in (("setuid0", lambda: os.setuid(0)), ("setgid0", lambda: os.setgid(0)),
                 ("chroot", lambda: os.chroot("/"))):
  try:
    fn()
    print(name, "OK")
  except OSError as e:
    print(name, "refused", e.__class__.__name__)
for ns in ("net", "pid", "mnt"):
  try:
    fd = os.open(f"/proc/1/ns/{ns}", os.O_RDONLY)
    report("setns " + ns, libc.setns(fd, 0))
  except OSError as e:
    print("setns", ns, "refused", e.__class__.__name__)
report("unshare user", libc.unshare(0x10000000))  # CLONE_NEWUSER
report("unshare user+mount", libc.unshare(0x10000000 | 0x00020000))
try:
  import subprocess
  print("unshare tool", subprocess.run(["unshare", "-Ur", "id"], capture_output=True,
                                       text=True).stderr.strip() or "OK")
except OSError as e:
  print("unshare tool refused", e.__class__.__name__)
report("sethostname", libc.sethostname(b"x", 1))
report("mount", libc.mount(b"none", b"/usr", b"tmpfs", 0, None))
report("ptrace", libc.ptrace(16, os.getppid(), None, None))  # PTRACE_ATTACH
print("uid", os.getuid(), os.geteuid())
