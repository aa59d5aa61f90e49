#!/usr/bin/env bash
# minfer vs llama.cpp's llama-bench on the same model and threads, alternating, with ratios.
#
# Usage: scripts/bench_vs_llama.sh [MODEL] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS] [--rounds K]
#                                  [--minfer BIN]...
#   defaults: models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, 2 threads, pp512, tg128, 3 reps, 2 rounds.
#   --minfer BIN (repeatable) benchmarks those minfer binaries instead of this checkout's build,
#   each in every round after llama-bench (e.g. a build of the previous commit, then HEAD).
#
# llama-bench is built once from the llama-cpp-python==0.3.36 source package (PyPI) with its
# bundled llama.cpp: GGML_NATIVE=OFF, AVX2/AVX-512/VNNI on, every GGML_AMX_* off (a native build
# picks AMX, which faults on these machines); GGML_AVX_VNNI follows the CPU's avx_vnni flag (GCC
# emits VEX vpdpbusd for it, which raises SIGILL on CPUs that have only AVX512-VNNI). Source,
# venv (cmake, scikit-build-core) and build are cached in $MINFER_LLAMA_CACHE
# (default ~/.cache/minfer-llama), outside the repo. A benchmark, not a test: CI does not run it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MINFER_LLAMA_CACHE:-$HOME/.cache/minfer-llama}"
model="$repo/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
threads=2 n_prompt=512 n_gen=128 reps=3 rounds=2 bins=()
die() { echo "bench_vs_llama.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads="$2"; shift 2 ;;
        -p) n_prompt="$2"; shift 2 ;;
        -n) n_gen="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --minfer) bins+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) model="$1"; shift ;;
    esac
done
[ -f "$model" ] || die "no model at $model (scripts/fetch_models.sh)"

pkg=llama_cpp_python-0.3.36
src="$cache/src/$pkg/vendor/llama.cpp"
venv="$cache/venv"
bench="$cache/build/bin/llama-bench"
mkdir -p "$cache"
if [ ! -x "$venv/bin/cmake" ]; then
    echo "bench_vs_llama.sh: creating $venv (cmake, ninja, scikit-build-core)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet cmake==4.4.5 ninja==1.13.2 scikit-build-core
fi
if [ ! -d "$src" ]; then
    echo "bench_vs_llama.sh: fetching the $pkg source package"
    tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation \
        -d "$tmp" llama-cpp-python==0.3.36
    mkdir -p "$cache/src"
    tar -xzf "$tmp/$pkg.tar.gz" -C "$cache/src"
fi
if [ ! -x "$bench" ]; then
    vnni=OFF
    grep -qw avx_vnni /proc/cpuinfo && vnni=ON
    echo "bench_vs_llama.sh: building llama-bench (GGML_AVX_VNNI=$vnni)"
    "$venv/bin/cmake" -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON \
        -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=$vnni -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF >"$cache/cmake.log"
    make -C "$cache/build" -j"$(nproc)" llama-bench >"$cache/make.log"
fi
if [ ${#bins[@]} -eq 0 ]; then
    (cd "$repo" && cargo build --release --quiet)
    bins=("$repo/target/release/minfer")
fi
for b in "${bins[@]}"; do [ -x "$b" ] || die "--minfer $b is not an executable"; done

out="$(mktemp -d)"
for round in $(seq 1 "$rounds"); do
    echo "bench_vs_llama.sh: round $round/$rounds" >&2
    "$bench" -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o json >"$out/llama-$round.json" 2>/dev/null
    for i in "${!bins[@]}"; do
        "${bins[$i]}" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o json >"$out/minfer$i-$round.json"
    done
done
python3 - "$out" "$rounds" "$model" "$threads" "${bins[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, model, threads, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
def tests(engine):
    res = {}
    for r in range(1, rounds + 1):
        for row in json.load(open(os.path.join(out, f"{engine}-{r}.json"))):
            name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
            res.setdefault(name, []).append(row["avg_ts"])
    return res
ll = tests("llama")
mfs = [tests(f"minfer{i}") for i in range(len(bins))]
print(f"model {os.path.basename(model)}, {threads} threads, median of {rounds} alternating rounds")
for i, b in enumerate(bins):
    print(f"minfer{'' if len(bins) == 1 else f' #{i + 1}'}: {b}")
heads = [f"minfer{'' if len(bins) == 1 else f' #{i + 1}'}" for i in range(len(bins))]
print("| test | llama.cpp t/s | " + " | ".join(f"{h} t/s | {h} / llama.cpp" for h in heads) + " |")
print("| --- | ---: | " + " | ".join("---: | ---:" for _ in heads) + " |")
for name in ll:
    a = statistics.median(ll[name])
    cells = []
    for mf in mfs:
        b = statistics.median(mf.get(name, [float("nan")]))
        cells.append(f"{b:.2f} | {b / a:.2f}x")
    print(f"| {name} | {a:.2f} | " + " | ".join(cells) + " |")
PY
rm -rf "$out"
