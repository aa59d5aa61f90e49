#!/bin/sh
# Regenerates ../q8-oracle.jsonl by running ggml's own C code (not part of the Rust build).
#
# Usage: sh build.sh /path/to/llama.cpp/ggml > ../q8-oracle.jsonl
# (the llama.cpp bundled with llama-cpp-python 0.3.36, the one the reference data came from).
#
# ggml is compiled twice: with GCC's defaults as llama.cpp's CMake build uses them
# (-std=gnu11 -O3 -march=native, hence -ffp-contract=fast: GCC fuses a*b+c into FMAs), and with
# -ffp-contract=off (strict C semantics). The driver runs the activation quantizers, the generic
# and SIMD vec_dot kernels and the dequantizers on deterministic inputs; merge.py keeps
#   *_fast fields from the first build (what llama.cpp computes on x86) and
#   *_off fields from the second (what the C source means).
# The host must have AVX2, F16C and FMA (AVX-512 for the exact reference configuration).
set -e
G=${1:?path to llama.cpp/ggml}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
INC="-I$G/include -I$G/src -I$G/src/ggml-cpu"
for tag in fast off; do
    fl=""; [ $tag = off ] && fl=-ffp-contract=off
    mkdir -p $W/$tag
    for f in src/ggml-quants.c src/ggml-cpu/quants.c src/ggml-cpu/arch/x86/quants.c; do
        # GCC 12 with AVX-512 miscompiles the vectorized ggml_vec_dot_q5_0_q8_0_generic (gives
        # a wrong sum at -O2/-O3; right with -fno-tree-vectorize or without AVX-512). llama.cpp
        # never runs the generic kernels on x86, so build them unvectorized: what the C means.
        nv=""; [ $f = src/ggml-cpu/quants.c ] && nv=-fno-tree-vectorize
        gcc -O3 -DNDEBUG -std=gnu11 -march=native -D_GNU_SOURCE $fl $nv $INC -c $G/$f \
            -o $W/$tag/$(basename $(dirname $f))_$(basename $f).o
    done
    g++ -O3 -DNDEBUG -std=gnu++17 -march=native $fl $INC -c $G/src/ggml-cpu/vec.cpp -o $W/$tag/vec.o
    gcc -O3 -std=gnu11 -march=native $fl $INC -c $HERE/driver.c -o $W/$tag/driver.o
    gcc -O2 -march=native -c $HERE/stubs.c -o $W/$tag/stubs.o
    g++ -o $W/$tag/driver $W/$tag/*.o -lm
    $W/$tag/driver _$tag > $W/$tag.jsonl
done
python3 $HERE/merge.py $W/fast.jsonl $W/off.jsonl
rm -rf $W
