# Fills the disk: one huge file, then many files, in the working directory and /dev/shm.
import os
written = 0
try:
  with open("big", "wb") as f:
    while True:
      f.write(b"\0" * (1 << 20))
      f.flush()
      written += 1
except OSError as e:
  print("big file refused at", written, "MiB:", e.__class__.__name__)
for where in (".", "/dev/shm"):
  n = 0
  try:
    while True:
      with open(os.path.join(where, f"f{n}"), "wb") as f:
        f.write(b"\0" * (1 << 20))
      n += 1
  except OSError as e:
    print(where, "refused after", n, "files:", e.__class__.__name__)
raise SystemExit("disk full")
