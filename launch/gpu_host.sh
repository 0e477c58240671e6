#!/usr/bin/env bash
# Train on one GPU host (one process, all its GPUs): install jax[cuda] at the jax version
# pinned in setup.py into a virtual environment, then run the main command with a mesh
# preset.
#
#   launch/gpu_host.sh --gin_file=gin/math.gin --gin_file=gin/model/qwen3-0.6b.gin \
#     --gin_bindings="policy.hf_dir = '/path/to/Qwen3-0.6B'"
#
# See launch/README.md.
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: launch/gpu_host.sh --gin_file=FILE [--gin_file=...] [--gin_bindings=...] [--workdir=DIR]

Runs `python -m evotrainer.launch FLAGS --gin_file=$MESH_GIN [--workdir=$WORKDIR]`.

environment:
  MESH_GIN        mesh preset (default gin/mesh/fsdp.gin: parameters, optimizer state
                  and batch split over all GPUs; it also works with one GPU)
  WORKDIR         run directory when --workdir is not given (default runs/<date-time>)
  VENV            virtual environment (default .venv-gpu); created on first use
  CUDA            jax extra: cuda12 or cuda13 (default cuda12)
  SKIP_INSTALL=1  use VENV as it is
  CUDA_VISIBLE_DEVICES  restrict the GPUs JAX sees (with gin/mesh/single.gin: one)
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

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
MESH_GIN=${MESH_GIN:-gin/mesh/fsdp.gin}
VENV=${VENV:-.venv-gpu}
CUDA=${CUDA:-cuda12}
[[ -f "$MESH_GIN" ]] || { echo "MESH_GIN=$MESH_GIN does not exist (see gin/mesh/)" >&2; exit 2; }
case "$CUDA" in cuda12|cuda13) ;; *) echo "CUDA=$CUDA; expected cuda12 or cuda13" >&2; usage ;; esac
JAX_VERSION=$(sed -n 's/.*"jax==\([0-9.]*\)".*/\1/p' setup.py)
[[ -n "$JAX_VERSION" ]] || { echo "no jax==X pin found in setup.py" >&2; exit 1; }

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  [[ -d "$VENV" ]] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # One resolve for both, so the CUDA plugin matches the jax/jaxlib pin exactly.
  "$VENV/bin/pip" install -q -e . "jax[$CUDA]==$JAX_VERSION"
fi

FLAGS=("$@" --gin_file="$MESH_GIN")  # the preset after the caller's gin files wins
[[ $HAS_WORKDIR == 1 ]] || FLAGS+=(--workdir="${WORKDIR:-runs/$(date +%Y%m%d-%H%M%S)}")
echo "+ python -m evotrainer.launch ${FLAGS[*]}" >&2
exec "$VENV/bin/python" -m evotrainer.launch "${FLAGS[@]}"
