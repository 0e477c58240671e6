# Tries to reach a listener on the host's loopback (port in argv[1]) over TCP and UDP,
# and to reach the outside world.
import socket
import sys
port = int(sys.argv[1])
for host in ("127.0.0.1", "localhost", "10.0.2.2", "8.8.8.8"):
  try:
    s = socket.create_connection((host, port), timeout=1)
    s.sendall(b"LEAK")
    print("connected", host)
  except OSError as e:
    print("refused", host, e.__class__.__name__)
try:
  u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  u.sendto(b"LEAK", ("127.0.0.1", port))
  print("udp sent (to the cell's own loopback)")
except OSError as e:
  print("udp refused", e.__class__.__name__)
