#!/usr/bin/env bash
# The llama.cpp sources minfer compares against: the llama-cpp-python==0.3.36 source package
# (PyPI) unpacked once in $MINFER_LLAMA_CACHE (default ~/.cache/minfer-llama), with a venv of the
# build tools (cmake, ninja, scikit-build-core) beside it. Prints the path of its llama.cpp tree
# (vendor/llama.cpp). Idempotent. Used by scripts/bench_vs_llama.sh (llama-bench) and
# tests/compat/ (the llama-server test suite, llama-server itself).
set -euo pipefail
cache="${MINFER_LLAMA_CACHE:-$HOME/.cache/minfer-llama}"
pkg=llama_cpp_python-0.3.36
src="$cache/src/$pkg/vendor/llama.cpp"
venv="$cache/venv"
mkdir -p "$cache"
if [ ! -x "$venv/bin/cmake" ]; then
    echo "llama_src.sh: creating $venv (cmake, ninja, scikit-build-core)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet cmake==4.4.5 ninja==1.13.2 scikit-build-core >&2
fi
if [ ! -d "$src" ]; then
    echo "llama_src.sh: fetching the $pkg source package" >&2
    tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation \
        -d "$tmp" llama-cpp-python==0.3.36 >&2
    mkdir -p "$cache/src"
    tar -xzf "$tmp/$pkg.tar.gz" -C "$cache/src"
fi
[ -d "$src/tools/server/tests" ] || { echo "llama_src.sh: $src has no tools/server/tests" >&2; exit 1; }
echo "$src"
