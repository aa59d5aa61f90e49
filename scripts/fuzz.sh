#!/usr/bin/env bash
# Bounded cargo-fuzz runs of every fuzz target (no crash allowed).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Each target first replays every file in fuzz/regressions/<target>/ (crash inputs kept as
# tests once fixed), then fuzzes from its seeds (fuzz/seeds/<target>/) for the given time.
# Needs the nightly toolchain; installs cargo-fuzz when it is missing. Where no nightly toolchain
# exists, says so and exits 0: the stable property-based stand-ins (tests/*_fuzz.rs) run in the
# test suite either way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-60}"
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
mkdir -p fuzz/artifacts
for t in $targets; do
    regressions="fuzz/regressions/$t"
    if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
        log="fuzz/artifacts/$t.regressions.log"
        echo "fuzz.sh: $t: replaying $(ls -A "$regressions" | wc -l) regression inputs"
        # -runs=0: run every input of the corpus once, mutate nothing.
        if ! cargo +nightly fuzz run "$t" "$regressions" -- -runs=0 -rss_limit_mb=4096 >"$log" 2>&1; then
            echo "fuzz.sh: $t FAILED on a regression input; the end of $log:"
            tail -n 60 "$log"
            exit 1
        fi
    fi
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus"
    if [ -d "fuzz/seeds/$t" ]; then cp -n fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true; fi
    log="fuzz/artifacts/$t.log"
    echo "fuzz.sh: $t for ${secs}s"
    if ! cargo +nightly fuzz run "$t" "$corpus" -- -max_total_time="$secs" -rss_limit_mb=4096 >"$log" 2>&1; then
        echo "fuzz.sh: $t FAILED; the end of $log:"
        tail -n 60 "$log"
        exit 1
    fi
    grep '^Done' "$log" | tail -n 1 || true
done
echo "fuzz.sh: all targets ran ${secs}s without a crash"
