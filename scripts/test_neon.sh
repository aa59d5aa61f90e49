#!/usr/bin/env bash
# The ARM NEON kernels, run on this x86-64 machine under qemu-user: cross-builds the tests for
# aarch64-unknown-linux-gnu (Debian's gcc-aarch64-linux-gnu links; .cargo/config.toml names it
# and the qemu runner) and runs the quant-block tests, the SIMD-vs-scalar twins (NEON dots bit
# for bit against the scalar reference, the element-wise kernels against their twins) and the
# Qwen3-tiny teacher-forced parity test on a CPU with dotprod (qemu's `max`), then the kernel
# tests again on a plain ARMv8.0 core (cortex-a53: the NEON kernels without sdot).
# Installs what is missing (qemu-user, the cross gcc, the Rust target). Usage: scripts/test_neon.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
apt_need() {
  command -v "$1" >/dev/null && return 0
  echo "test_neon.sh: installing $2 (Debian package)" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$2" >/dev/null
}
apt_need qemu-aarch64 qemu-user
apt_need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
target=aarch64-unknown-linux-gnu
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
scripts/fetch_models.sh qwen3-tiny
# Tests that start the test binary again (the ISA levers) need the emulator named: no binfmt.
export MINFER_TEST_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
tests=(--lib --test quants_dot --test quants_reference --test quants_q8 --test ops_simd
       --test matmul_dots --test matmul_matmul --test matmul_tiles)
for cpu in max cortex-a53; do
  echo "test_neon.sh: qemu-aarch64 -cpu $cpu" >&2
  QEMU_CPU=$cpu cargo test --release --target "$target" "${tests[@]}"
done
QEMU_CPU=max cargo test --release --target "$target" --test parity qwen3_tiny
