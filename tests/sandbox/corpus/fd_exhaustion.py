# Opens files, pipes and sockets until refused.
import os
import socket
held = []
try:
  while True:
    held.append(os.open(os.devnull, os.O_RDONLY))
    held.extend(os.pipe())
    held.append(socket.socket())
except OSError as e:
  print("refused after", len(held), e.__class__.__name__)
