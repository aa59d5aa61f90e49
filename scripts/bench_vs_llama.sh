#!/usr/bin/env bash
# minfer vs llama.cpp's llama-bench on the same model and threads, alternating, with ratios.
#
# Usage: scripts/bench_vs_llama.sh [MODEL]... [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-d N_DEPTH]
#                                  [-r REPS] [--rounds K] [--minfer BIN]...
#   defaults: models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, 2 threads, pp512, tg128, depth 0,
#   3 reps, 2 rounds. Several MODELs are benchmarked one after another, a table each. -d takes a
#   comma list (e.g. -d 0,4096): every test runs at each depth, as llama-bench's -d does.
#   --minfer BIN (repeatable) benchmarks those minfer binaries instead of this checkout's build,
#   each in every round after llama-bench (e.g. a build of the previous commit, then HEAD).
# --batched [B,B,...]: llama-batched-bench against `minfer bench --batch` instead (default
#   1,2,4,8; -p is the prompt and -n the generated tokens per sequence, default 128 and 128):
#   S_PP, S_TG and S for each B, alternating rounds, with ratios.
#
# llama-bench is built once from the llama-cpp-python==0.3.36 source package (PyPI) with its
# bundled llama.cpp (with llama-quantize): GGML_NATIVE=OFF, AVX2 on, each AVX-512 part and
# GGML_AVX_VNNI as the CPU's flags say (GCC emits VEX vpdpbusd for AVX_VNNI, which raises SIGILL
# on CPUs that have only AVX512-VNNI), every GGML_AMX_* off (a native build picks AMX, which
# faults on these machines). Source,
# venv (cmake, scikit-build-core) and build are cached in $MINFER_LLAMA_CACHE
# (default ~/.cache/minfer-llama), outside the repo. A benchmark, not a test: CI does not run it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MINFER_LLAMA_CACHE:-$HOME/.cache/minfer-llama}"
models=()
threads=2 n_prompt=512 n_gen=128 depth=0 reps=3 rounds=2 bins=() batched="" p_set="" 
die() { echo "bench_vs_llama.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads="$2"; shift 2 ;;
        -p) n_prompt="$2"; p_set=1; shift 2 ;;
        --batched)
            if [[ "${2:-}" =~ ^[0-9]+(,[0-9]+)*$ ]]; then batched="$2"; shift 2; else batched="1,2,4,8"; shift; fi ;;
        -n) n_gen="$2"; shift 2 ;;
        -d) depth="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --minfer) bins+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) models+=("$1"); shift ;;
    esac
done
[ ${#models[@]} -gt 0 ] || models=("$repo/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
for model in "${models[@]}"; do [ -f "$model" ] || die "no model at $model (scripts/fetch_models.sh)"; done
[[ "$depth" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "-d takes depths like 0,4096, not $depth"

src="$("$repo/scripts/llama_src.sh")"
venv="$cache/venv"
# The build follows this CPU's flags (sessions land on AVX2-only and AVX-512 machines; an
# instruction the CPU lacks faults at the first kernel): one build folder per flag set.
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
avx512="$(has avx512f)" vnni512="$(has avx512_vnni)" vbmi="$(has avx512vbmi)" bf16="$(has avx512_bf16)"
vnni="$(has avx_vnni)"
build="$cache/build-avx512$avx512-vnni$vnni512-vbmi$vbmi-bf16$bf16-avxvnni$vnni"
bench="$build/bin/llama-bench"
quantize="$build/bin/llama-quantize"
batched_bench="$build/bin/llama-batched-bench"
if [ ! -x "$bench" ] || [ ! -x "$quantize" ] || [ ! -x "$batched_bench" ]; then
    echo "bench_vs_llama.sh: building llama-bench, llama-batched-bench, llama-quantize in $build"
    "$venv/bin/cmake" -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512="$avx512" -DGGML_AVX512_VNNI="$vnni512" \
        -DGGML_AVX512_VBMI="$vbmi" -DGGML_AVX512_BF16="$bf16" -DGGML_AVX_VNNI="$vnni" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF >"$cache/cmake.log"
    make -C "$build" -j"$(nproc)" llama-bench llama-batched-bench llama-quantize >"$cache/make.log"
fi
# MINFER_LLAMA_BUILD_ONLY=1: stop here (other scripts use the build, e.g. llama-quantize).
[ -z "${MINFER_LLAMA_BUILD_ONLY:-}" ] || { echo "$build/bin"; exit 0; }
if [ ${#bins[@]} -eq 0 ]; then
    (cd "$repo" && cargo build --release --quiet)
    bins=("$repo/target/release/minfer")
fi
for b in "${bins[@]}"; do [ -x "$b" ] || die "--minfer $b is not an executable"; done

lscpu | sed -n 's/^Model name: *//p' | sed 's/^/CPU: /'
if [ -n "$batched" ]; then
    [ -n "$p_set" ] || n_prompt=128
    for model in "${models[@]}"; do
    out="$(mktemp -d)"
    max_b="$(tr ',' '\n' <<<"$batched" | sort -n | tail -1)"
    ctx=$(( max_b * (n_prompt + n_gen) ))
    for round in $(seq 1 "$rounds"); do
        echo "bench_vs_llama.sh: $(basename "$model") batched round $round/$rounds" >&2
        "$batched_bench" -m "$model" -t "$threads" -tb "$threads" -c "$ctx" -b 2048 -ub 512 \
            -npp "$n_prompt" -ntg "$n_gen" -npl "$batched" --output-format jsonl 2>/dev/null \
            | grep '^{' >"$out/llama-$round.jsonl"
        for i in "${!bins[@]}"; do
            "${bins[$i]}" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" \
                --batch "$batched" -o json >"$out/minfer$i-$round.json"
        done
    done
    python3 - "$out" "$rounds" "$model" "$threads" "${bins[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, model, threads, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
def rows(engine):
    res = {}
    for r in range(1, rounds + 1):
        path = os.path.join(out, f"{engine}-{r}.json" + ("l" if engine == "llama" else ""))
        items = [json.loads(l) for l in open(path) if l.strip()] if engine == "llama" else json.load(open(path))
        for row in items:
            res.setdefault(row["pl"], []).append(row)
    return res
med = lambda rs, k: statistics.median(r[k] for r in rs)
ll = rows("llama")
mfs = [rows(f"minfer{i}") for i in range(len(bins))]
print(f"model {os.path.basename(model)}, {threads} threads, median of {rounds} alternating rounds (llama-batched-bench vs minfer bench --batch)")
print("| B | PP | TG | llama S_PP | llama S_TG | llama S | " + " | ".join(f"minfer S_PP | minfer S_TG | minfer S | S_TG ratio" for _ in bins) + " |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---: | ---: | ---: | ---:" for _ in bins) + " |")
for b in sorted(ll):
    l = ll[b]
    cells = []
    for mf in mfs:
        m = mf.get(b, [])
        if not m:
            cells.append("- | - | - | -")
            continue
        cells.append(f"{med(m, 'speed_pp'):.2f} | {med(m, 'speed_tg'):.2f} | {med(m, 'speed'):.2f} | {med(m, 'speed_tg') / med(l, 'speed_tg'):.2f}x")
    print(f"| {b} | {l[0]['pp']} | {l[0]['tg']} | {med(l, 'speed_pp'):.2f} | {med(l, 'speed_tg'):.2f} | {med(l, 'speed'):.2f} | " + " | ".join(cells) + " |")
PY
    rm -rf "$out"
    done
    exit 0
fi
for model in "${models[@]}"; do
out="$(mktemp -d)"
for round in $(seq 1 "$rounds"); do
    echo "bench_vs_llama.sh: $(basename "$model") round $round/$rounds" >&2
    "$bench" -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$depth" -r "$reps" -o json >"$out/llama-$round.json" 2>/dev/null
    for i in "${!bins[@]}"; do
        for d in ${depth//,/ }; do
            "${bins[$i]}" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -d "$d" -r "$reps" -o json >"$out/minfer$i-$round-d$d.json"
        done
        python3 -c 'import json,sys; print(json.dumps(sum((json.load(open(f)) for f in sys.argv[2:]), [])))' \
            x "$out"/minfer$i-$round-d*.json >"$out/minfer$i-$round.json"
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
            if row.get("n_depth", 0):
                name += f" @ d{row['n_depth']}"
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
done
