# Ignores every signal it can, then spins.
import signal
for sig in range(1, signal.NSIG):
  try:
    signal.signal(sig, signal.SIG_IGN)
  except (OSError, ValueError, RuntimeError):
    pass
while True:
  pass
