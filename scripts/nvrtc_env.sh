#!/usr/bin/env bash
# NVRTC for the CUDA kernel compile test: the nvidia-cuda-nvrtc-cu12 wheel (PyPI) installed with
# pip into .nvrtc/ (or $MINFER_NVRTC_DIR). Idempotent. Prints the path of libnvrtc.so.12 on
# stdout, for MINFER_NVRTC. Needs no GPU and no CUDA toolkit: NVRTC compiles CUDA C to PTX and
# cubins on any x86-64 Linux machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
PKG="nvidia-cuda-nvrtc-cu12==12.9.86"
DIR="${MINFER_NVRTC_DIR:-$PWD/.nvrtc}"
LIB="$DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
if [[ ! -f "$LIB" || ! -f "$DIR/.pkg" || "$(cat "$DIR/.pkg")" != "$PKG" ]]; then
  echo "nvrtc_env.sh: installing $PKG into $DIR" >&2
  rm -rf -- "$DIR"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$DIR" "$PKG" >&2
  echo "$PKG" > "$DIR/.pkg"
fi
[[ -f "$LIB" ]] || { echo "nvrtc_env.sh: $LIB missing after install" >&2; exit 1; }
echo "$LIB"
