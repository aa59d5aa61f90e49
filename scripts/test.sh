#!/usr/bin/env bash
# The whole test suite: fetches the test models, the server tests' Python client, NVRTC, tmux,
# graphviz, chromium and playwright-core if missing (idempotent), then runs every test in release mode. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each stage's start, in seconds since this script began (where CI's time goes).
stage() { echo "test.sh: [${SECONDS} s] $*" >&2; }
stage "models"
scripts/fetch_models.sh all
# Debian packages the tests need, installed when COMMAND is missing: apt_need COMMAND PACKAGE WHY
apt_need() {
  command -v "$1" >/dev/null && return 0
  echo "test.sh: installing $2 (Debian package) $3" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$2" >/dev/null
}
apt_need tmux tmux "for the terminal test of minfer chat (tests/cli_chat.rs)"
apt_need dot graphviz "for the DOT export test (tests/graph_export.rs)"
apt_need chromium chromium "for the visualizer's browser test (tests/viz_browser.rs)"
# The browser test drives chromium with playwright-core (never a downloaded browser).
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "test.sh: installing playwright-core (npm) for the visualizer's browser test" >&2
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi
# The server tests drive `minfer serve` with the official openai client, from this venv.
stage "Python, NVRTC"
MINFER_TEST_PYTHON="$(scripts/python_env.sh)"
export MINFER_TEST_PYTHON
# The CUDA kernels' compile test loads NVRTC from the nvidia-cuda-nvrtc-cu12 wheel (no GPU needed).
MINFER_NVRTC="$(scripts/nvrtc_env.sh)"
export MINFER_NVRTC
# The default build (no CUDA) must build too; the suite runs on the cuda-feature build, which on
# a machine without a driver behaves as the default one and adds the CUDA tests.
stage "cargo build --release"
cargo build --release
stage "cargo test --release --features cuda $*"
cargo test --release --features cuda "$@"
# The GPU check's dry run: the device bundle fits its 64 MiB and every step of
# scripts/device_check.sh works, rehearsed on the CPU (the whole suite only, not a filtered run).
if [ $# -eq 0 ]; then
  stage "device check (dry run)"
  scripts/device_check.sh --dry-run
  # The NEON kernels under qemu-aarch64 (cross-built; the whole suite only).
  stage "NEON tests under qemu"
  scripts/test_neon.sh
  # llama.cpp's own server tests against minfer serve, every failure classified (docs/SERVER.md).
  stage "llama.cpp's server tests"
  tests/compat/run.sh --check
fi
stage "done"
