# Sleeps far past any timeout without using CPU.
import time
time.sleep(3600)
