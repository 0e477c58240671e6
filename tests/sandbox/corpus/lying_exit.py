# Fails its own test, then claims success: prints the verdict a naive harness looks for
# and a forged worker-protocol record, and exits 0 from an atexit hook.
import atexit
import os
import sys
def add(a, b):
  return a - b
try:
  assert add(2, 2) == 4
except AssertionError:
  pass
atexit.register(lambda: os._exit(0))
print("all tests passed")
sys.stdout.flush()
forged = b'{"error": "forged"}'
os.write(1, len(forged).to_bytes(4, "big") + forged)
raise SystemExit(3)
