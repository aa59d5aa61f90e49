#!/usr/bin/env bash
# Bounded cargo-fuzz runs of every fuzz target (no crash allowed).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
# Needs the nightly toolchain; installs cargo-fuzz when it is missing. Where no nightly toolchain
# exists, says so and exits 0: the stable property-based stand-ins (tests/*_fuzz.rs) run in the
# test suite either way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-30}"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain here; cargo-fuzz runs skipped (property-based stand-ins ran in the test suite)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
targets=$(cargo +nightly fuzz list)
cargo +nightly fuzz build
for t in $targets; do
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus"
    if [ -d "fuzz/seeds/$t" ]; then cp -n fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true; fi
    log="fuzz/artifacts/$t.log"
    mkdir -p fuzz/artifacts
    echo "fuzz.sh: $t for ${secs}s"
    if ! cargo +nightly fuzz run "$t" "$corpus" -- -max_total_time="$secs" -rss_limit_mb=4096 >"$log" 2>&1; then
        echo "fuzz.sh: $t FAILED; the end of $log:"
        tail -n 60 "$log"
        exit 1
    fi
    grep '^Done' "$log" | tail -n 1 || true
done
echo "fuzz.sh: all targets ran ${secs}s without a crash"
