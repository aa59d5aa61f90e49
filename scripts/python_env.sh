#!/usr/bin/env bash
# The Python environment of the server tests: a venv at .venv-test (or $MINFER_TEST_VENV) with the
# official `openai` client, pinned in tests/server/requirements.txt. Idempotent: the venv is
# rebuilt only when the requirements change. Prints the venv's python on stdout.
#
# Usage: scripts/python_env.sh [REQUIREMENTS [VENV]]: another pinned set in its own venv (the
# compatibility harness: tests/compat/requirements.txt in .venv-compat).
#
# Environment:
#   PYTHON            the Python that creates the venv (default: python3; needs >= 3.9)
#   MINFER_TEST_VENV  where the venv goes (default: .venv-test at the repo root)
#   PIP_*             passed through to pip (e.g. PIP_INDEX_URL)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
REQ="${1:-tests/server/requirements.txt}"
VENV="${2:-${MINFER_TEST_VENV:-$PWD/.venv-test}}"
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" || ! -f "$STAMP" || "$(cat "$STAMP")" != "$want" ]]; then
  echo "python_env.sh: creating $VENV from $REQ" >&2
  rm -rf -- "$VENV"
  "$PYTHON" -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2
  echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -c 'import openai' >&2
echo "$VENV/bin/python"
