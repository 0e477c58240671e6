# Tries to kill whatever runs it: the parent, the namespace's init, every process.
import os
import signal
for target in {os.getppid(), 1, 2, 3} - {os.getpid()}:
  for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
      os.kill(target, sig)
      print("signalled", target, sig)
    except OSError as e:
      print("refused", target, sig, e.__class__.__name__)
os.kill(-1, signal.SIGKILL)  # every process we may signal (on Linux: not ourselves)
print("alive")
