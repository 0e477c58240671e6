# A double-forked, setsid daemon that closes its output and outlives the program, then
# writes a marker (argv[1]) and spins; the program itself exits 0 at once.
import os
import sys
import time
if os.fork() == 0:
  os.setsid()
  if os.fork() == 0:
    fd = os.open(os.devnull, os.O_RDWR)
    for i in range(3):
      os.dup2(fd, i)
    time.sleep(1.5)
    try:
      with open(sys.argv[1], "w") as f:
        f.write("daemon survived")
    except OSError:
      pass
    while True:
      time.sleep(0.1)
  os._exit(0)
print("parent done")
