#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-python==0.3.36 source package (the same
# sources scripts/bench_vs_llama.sh builds llama-bench from), for the compatibility harness's
# side-by-side figures. Prints the binary's path. Cached in $MINFER_LLAMA_CACHE (default
# ~/.cache/minfer-llama): the source once, the build once per CPU flag set. Not run by CI (a
# 2-core build takes about 15 minutes); tests/compat/run.sh --llama-server uses it.
set -euo pipefail
cache="${MINFER_LLAMA_CACHE:-$HOME/.cache/minfer-llama}"
src="$("$(dirname "${BASH_SOURCE[0]}")/../../scripts/llama_src.sh")"
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
avx512="$(has avx512f)" vnni512="$(has avx512_vnni)" vbmi="$(has avx512vbmi)" bf16="$(has avx512_bf16)"
vnni="$(has avx_vnni)"
build="$cache/build-server-avx512$avx512-vnni$vnni512-vbmi$vbmi-bf16$bf16-avxvnni$vnni"
bin="$build/bin/llama-server"
if [ ! -x "$bin" ]; then
    echo "build_llama_server.sh: building llama-server in $build" >&2
    "$cache/venv/bin/cmake" -S "$src" -B "$build" -G Ninja -DCMAKE_MAKE_PROGRAM="$cache/venv/bin/ninja" \
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512="$avx512" -DGGML_AVX512_VNNI="$vnni512" \
        -DGGML_AVX512_VBMI="$vbmi" -DGGML_AVX512_BF16="$bf16" -DGGML_AVX_VNNI="$vnni" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >"$build.cmake.log" 2>&1
    "$cache/venv/bin/ninja" -C "$build" llama-server >"$build.make.log" 2>&1
fi
echo "$bin"
