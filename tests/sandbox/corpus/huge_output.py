# Floods stdout and stderr.
import sys
line = "x" * 4096 + "\n"
while True:
  sys.stdout.write(line)
  sys.stderr.write(line)
