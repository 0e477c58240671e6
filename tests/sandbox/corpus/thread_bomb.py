# Thread bomb: start sleeping non-daemon threads until refused, then keep the process
# alive through them (the interpreter waits for non-daemon threads at exit).
import threading
import time
threads = []
while True:
  try:
    t = threading.Thread(target=time.sleep, args=(3600,))
    t.start()
    threads.append(t)
  except (RuntimeError, MemoryError):
    break
print("threads", len(threads), flush=True)
