#!/usr/bin/env bash
# Create a Cloud TPU VM pod, put this repository on every worker, and run the same
# training command on all of them (multi-host: each worker is one JAX process;
# `EVO_TPU_POD=1` makes `initialize_distributed` call `jax.distributed.initialize()`,
# which finds the other workers by itself).
#
#   NAME=evo-pod ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 VERSION=tpu-ubuntu2204-base \
#   WORKDIR=/mnt/my-bucket/runs/evo1 \
#   launch/tpu_pod.sh all --gin_file=gin/math_train.gin --gin_file=gin/model/qwen3-0.6b.gin \
#     --gin_bindings="policy.hf_dir = '/path/on/every/worker/Qwen3-0.6B'"
#
# See launch/README.md.
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: launch/tpu_pod.sh COMMAND [evotrainer.launch flags...]

commands:
  create   create the TPU VM pod (skipped if NAME already exists)
  setup    copy this working tree to every worker and install it (jax[tpu] at our pin)
  run      run `python -m evotrainer.launch FLAGS --gin_file=$MESH_GIN --workdir=$WORKDIR`
           on all workers (needs at least one --gin_file)
  all      create, setup, run
  ssh      run the remaining arguments as a shell command on all workers
  delete   delete the pod

environment:
  NAME ZONE             pod name and zone (required)
  ACCELERATOR_TYPE      e.g. v4-32, v5litepod-16 (required by create)
  VERSION               TPU VM runtime, e.g. tpu-ubuntu2204-base (required by create)
  PROJECT               gcloud project (default: gcloud's configured one)
  WORKDIR               run directory every worker sees: a gcsfuse or NFS mount, or a
                        gs://bucket/path URL for run.mode='train' (evolve and sweep on a
                        pod need a mount: every worker writes its part of their branches'
                        checkpoints; docs/multihost.md#remote-workdirs-gs) (required by run unless
                        --workdir is among the flags)
  MESH_GIN              mesh preset (default gin/mesh/fsdp.gin)
  REMOTE_DIR            where the repository goes on the workers (default evotrainer)
  DRY_RUN=1             print the gcloud commands instead of running them
USAGE
  exit 2
}

[[ $# -ge 1 ]] || usage
COMMAND=$1
shift
case "$COMMAND" in
  create|setup|run|all|ssh|delete) ;;
  -h|--help|help) usage ;;
  *) echo "unknown command: $COMMAND" >&2; usage ;;
esac

: "${NAME:?set NAME (the TPU pod name); see --help}"
: "${ZONE:?set ZONE (e.g. us-central2-b); see --help}"
MESH_GIN=${MESH_GIN:-gin/mesh/fsdp.gin}
REMOTE_DIR=${REMOTE_DIR:-evotrainer}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JAX_VERSION=$(sed -n 's/.*"jax==\([0-9.]*\)".*/\1/p' "$REPO/setup.py")
[[ -n "$JAX_VERSION" ]] || { echo "no jax==X pin found in $REPO/setup.py" >&2; exit 1; }

GCLOUD=(gcloud compute tpus tpu-vm)
COMMON=(--zone="$ZONE")
[[ -n "${PROJECT:-}" ]] && COMMON+=(--project="$PROJECT")

run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}

on_all_workers() {  # one shell command string, run on every worker at once
  run "${GCLOUD[@]}" ssh "$NAME" "${COMMON[@]}" --worker=all --command="$1"
}

create() {
  : "${ACCELERATOR_TYPE:?set ACCELERATOR_TYPE (e.g. v4-32)}"
  : "${VERSION:?set VERSION (TPU VM runtime, e.g. tpu-ubuntu2204-base)}"
  if [[ "${DRY_RUN:-0}" != 1 ]] && "${GCLOUD[@]}" describe "$NAME" "${COMMON[@]}" >/dev/null 2>&1; then
    echo "TPU $NAME already exists in $ZONE; not creating it"
    return
  fi
  run "${GCLOUD[@]}" create "$NAME" "${COMMON[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$VERSION"
}

setup() {
  local tarball
  tarball=$(mktemp -t evotrainer-XXXXXX.tgz)
  # The working tree as it is (uncommitted edits included), without local build outputs.
  tar -C "$REPO" -czf "$tarball" --exclude=./.git --exclude=./.venv --exclude='*.pyc' \
    --exclude=./runs --exclude=./workdir --exclude=./.pytest_cache --exclude=__pycache__ .
  run "${GCLOUD[@]}" scp "$tarball" "$NAME:evotrainer.tgz" "${COMMON[@]}" --worker=all
  rm -f "$tarball"
  on_all_workers "set -e; mkdir -p $(printf '%q' "$REMOTE_DIR") && \
tar -xzf evotrainer.tgz -C $(printf '%q' "$REMOTE_DIR") && cd $(printf '%q' "$REMOTE_DIR") && \
python3 -m venv .venv && . .venv/bin/activate && pip install -q --upgrade pip && \
pip install -q -e '.[gcs]' 'jax[tpu]==$JAX_VERSION'"
}

# Flags for evotrainer.launch: the caller's, then the mesh preset (after the caller's gin
# files, so that it wins over their defaults), then the workdir if not given.
launch_flags() {
  local has_gin=0 has_workdir=0 f
  FLAGS=("$@")
  for f in "${FLAGS[@]}"; do
    [[ "$f" == --gin_file=* || "$f" == --gin_file ]] && has_gin=1
    [[ "$f" == --workdir=* || "$f" == --workdir ]] && has_workdir=1
  done
  [[ $has_gin == 1 ]] || { echo "$COMMAND: pass at least one --gin_file=..." >&2; usage; }
  FLAGS+=(--gin_file="$MESH_GIN")
  if [[ $has_workdir == 0 ]]; then
    : "${WORKDIR:?set WORKDIR (a directory every worker sees, e.g. a gcsfuse mount, or a gs:// URL in train mode) or pass --workdir}"
    FLAGS+=(--workdir="$WORKDIR")
  fi
}

launch() {
  on_all_workers "cd $(printf '%q' "$REMOTE_DIR") && . .venv/bin/activate && \
EVO_TPU_POD=1 python -m evotrainer.launch $(printf '%q ' "${FLAGS[@]}")"
}

case "$COMMAND" in
  create) create ;;
  setup) setup ;;
  run) launch_flags "$@"; launch ;;
  all) launch_flags "$@"; create; setup; launch ;;
  ssh) [[ $# -ge 1 ]] || usage; on_all_workers "$*" ;;
  delete) run "${GCLOUD[@]}" delete "$NAME" "${COMMON[@]}" --quiet ;;
esac
