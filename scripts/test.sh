#!/usr/bin/env bash
# The whole test suite: fetches the test models, the server tests' Python client, tmux and
# graphviz if missing (idempotent), then runs every test in release mode. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/fetch_models.sh all
# tests/cli_chat.rs drives `minfer chat` in a real terminal through tmux.
if ! command -v tmux >/dev/null; then
  echo "test.sh: installing tmux (Debian package) for the terminal test of minfer chat" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq tmux >/dev/null
fi
# tests/graph_export.rs renders the DOT export with Graphviz's dot.
if ! command -v dot >/dev/null; then
  echo "test.sh: installing graphviz (Debian package) for the DOT export test" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq graphviz >/dev/null
fi
# The server tests drive `minfer serve` with the official openai client, from this venv.
MINFER_TEST_PYTHON="$(scripts/python_env.sh)"
export MINFER_TEST_PYTHON
cargo test --release "$@"
