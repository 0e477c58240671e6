#!/usr/bin/env bash
# Try multi-host on one machine: N local CPU processes, each with D fake devices, join
# one JAX run through a localhost coordinator (gloo collectives) and run the same
# command, exactly as the workers of a TPU pod would.
#
#   NUM_PROCESSES=2 DEVICES_PER_PROCESS=4 launch/multihost_local.sh --gin_file=gin/math_train.gin
#
# See launch/README.md.
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: launch/multihost_local.sh --gin_file=FILE [--gin_file=...] [--gin_bindings=...] [--workdir=DIR]

Starts NUM_PROCESSES copies of
  python -m evotrainer.launch FLAGS --gin_file=$MESH_GIN [--workdir=$WORKDIR]
with EVO_COORDINATOR=localhost:$PORT, EVO_NUM_PROCESSES, EVO_PROCESS_ID=0..N-1 and
XLA_FLAGS=--xla_force_host_platform_device_count=$DEVICES_PER_PROCESS. Process 0 prints to
the terminal, the others to $LOG_DIR/process_<i>.log. If one process fails, the others
are stopped.

environment:
  NUM_PROCESSES         processes (default 2)
  DEVICES_PER_PROCESS   fake CPU devices per process (default 4)
  PORT                  coordinator port (default: a free one)
  MESH_GIN              mesh preset (default gin/mesh/fsdp.gin)
  WORKDIR               run directory when --workdir is not given (default runs/<date-time>)
  LOG_DIR               logs of processes 1..N-1 (default: a new temporary directory)
  PYTHON                interpreter (default: python3 on PATH, e.g. from .venv)
USAGE
  exit 2
}

[[ $# -ge 1 ]] || usage
HAS_GIN=0
HAS_WORKDIR=0
for f in "$@"; do
  case "$f" in
    -h|--help) usage ;;
    --gin_file=*|--gin_file) HAS_GIN=1 ;;
    --workdir=*|--workdir) HAS_WORKDIR=1 ;;
  esac
done
[[ $HAS_GIN == 1 ]] || { echo "pass at least one --gin_file=..." >&2; usage; }

NUM_PROCESSES=${NUM_PROCESSES:-2}
DEVICES_PER_PROCESS=${DEVICES_PER_PROCESS:-4}
for v in NUM_PROCESSES DEVICES_PER_PROCESS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$v=${!v}; expected a positive integer" >&2; usage; }
done
PYTHON=${PYTHON:-python3}
MESH_GIN=${MESH_GIN:-gin/mesh/fsdp.gin}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
[[ -f "$MESH_GIN" ]] || { echo "MESH_GIN=$MESH_GIN does not exist (see gin/mesh/)" >&2; exit 2; }
PORT=${PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
LOG_DIR=${LOG_DIR:-$(mktemp -d -t evotrainer-multihost-XXXXXX)}
mkdir -p "$LOG_DIR"

FLAGS=("$@" --gin_file="$MESH_GIN")  # the preset after the caller's gin files wins
# Every process must get the same workdir, so it is fixed here, not per process.
[[ $HAS_WORKDIR == 1 ]] || FLAGS+=(--workdir="${WORKDIR:-runs/$(date +%Y%m%d-%H%M%S)}")

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "+ $NUM_PROCESSES x python -m evotrainer.launch ${FLAGS[*]}" \
  "(coordinator localhost:$PORT, logs of processes 1.. in $LOG_DIR)" >&2
# Process $1; always run in the background (`start i &`), where `exec` makes the
# recorded pid the Python process itself, so that cleanup stops it.
start() {
  exec env XLA_FLAGS="--xla_force_host_platform_device_count=$DEVICES_PER_PROCESS" \
    JAX_PLATFORMS=cpu EVO_COORDINATOR="localhost:$PORT" \
    EVO_NUM_PROCESSES="$NUM_PROCESSES" EVO_PROCESS_ID="$1" \
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m evotrainer.launch "${FLAGS[@]}"
}
for ((i = 0; i < NUM_PROCESSES; i++)); do
  if ((i == 0)); then
    start "$i" &
  else
    start "$i" > "$LOG_DIR/process_$i.log" 2>&1 &
  fi
  PIDS+=($!)
done

# Poll (portable to older bash than `wait -n -p`); a failure stops the rest.
while ((${#PIDS[@]} > 0)); do
  for idx in "${!PIDS[@]}"; do
    pid=${PIDS[$idx]}
    kill -0 "$pid" 2>/dev/null && continue
    rc=0
    wait "$pid" || rc=$?
    unset "PIDS[$idx]"
    if ((rc != 0)); then
      echo "process $idx exited with status $rc; stopping the others (logs: $LOG_DIR)" >&2
      exit "$rc"
    fi
  done
  sleep 1
done
