#!/usr/bin/env bash
# The whole test suite: fetches the test models and the server tests' Python client if missing
# (idempotent), then runs every test in release mode. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch_models.sh all
# The server tests drive `minfer serve` with the official openai client, from this venv.
MINFER_TEST_PYTHON="$(scripts/python_env.sh)"
export MINFER_TEST_PYTHON
cargo test --release "$@"
