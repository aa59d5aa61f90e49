#!/usr/bin/env bash
# The whole test suite: fetches the test models if missing (idempotent), then runs every test in
# release mode. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch_models.sh all
cargo test --release "$@"
