# Tries to leave files outside its directory: argv[1] is a host path the test watches.
import os
import sys
targets = [sys.argv[1], "/pwned", "/usr/pwned", "/opt/pwned", "/root/pwned",
           "/tmp/pwned", "/dev/shm/pwned", "/proc/pwned", os.path.expanduser("~/../pwned"),
           os.path.join(os.getcwd(), "..", "pwned")]
for path in targets:
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write("pwned")
    print("wrote", path)
  except OSError as e:
    print("refused", path, e.__class__.__name__)
