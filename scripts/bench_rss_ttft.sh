#!/usr/bin/env bash
# Peak RSS and cold-start time to first token: `minfer run` against llama.cpp's
# `llama-completion`, same model, prompt, context and threads, alternating rounds.
#
# Usage: scripts/bench_rss_ttft.sh [MODEL] [-t THREADS] [-c CTX] [-p N_PROMPT_WORDS] [--rounds K]
#                                  [--minfer BIN] [--cache-type f32|f16]
#   defaults: models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, 2 threads, ctx 4096, a prompt of
#   500 words ("word word ..."), 3 rounds, this checkout's release build, minfer's default KV
#   (f32; llama.cpp's default is f16: pass --cache-type f16 for the same KV bytes).
#
# Each run generates one token (`-n 1`), so its wall time is load + prompt + the first token:
# the time to first token from a cold process. Before every run the page cache is dropped
# (`echo 3 > /proc/sys/vm/drop_caches`, root only) so the model is read from disk; where that
# is not allowed the runs are warm and the table says so. Peak RSS is GNU time's %M of a run
# of 16 tokens. llama-completion comes from scripts/bench_vs_llama.sh's cached llama.cpp build
# for this CPU's flags (this script adds that target). A benchmark, not a test: CI does not
# run it.
set -euo pipefail
cd "$(dirname "$0")/.."

model=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
threads=2 ctx=4096 words=500 rounds=3 minfer=target/release/minfer cache_type=""
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads=$2; shift 2 ;;
        -c) ctx=$2; shift 2 ;;
        -p) words=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --minfer) minfer=$2; shift 2 ;;
        --cache-type) cache_type=$2; shift 2 ;;
        -*) echo "bench_rss_ttft.sh: unknown option $1" >&2; exit 2 ;;
        *) model=$1; shift ;;
    esac
done
[ -f "$model" ] || { echo "bench_rss_ttft.sh: no model file $model" >&2; exit 2; }
[ -x "$minfer" ] || { echo "bench_rss_ttft.sh: no minfer binary $minfer (cargo build --release)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "bench_rss_ttft.sh: needs GNU time (/usr/bin/time)" >&2; exit 2; }

# bench_vs_llama.sh's llama.cpp build for this CPU's flags (built there on first use).
cache=${MINFER_LLAMA_CACHE:-$HOME/.cache/minfer-llama}
bin=$(MINFER_LLAMA_BUILD_ONLY=1 scripts/bench_vs_llama.sh "$model" | tail -1)
[ -d "$bin" ] || { echo "bench_rss_ttft.sh: no llama.cpp build ($bin)" >&2; exit 1; }
[ -x "$bin/llama-completion" ] || "$cache/venv/bin/cmake" --build "$(dirname "$bin")" --target llama-completion -j"$(nproc)" >/dev/null
llama="$bin/llama-completion"

[[ "$words" =~ ^[0-9]+$ ]] || { echo "bench_rss_ttft.sh: -p takes a word count, not $words" >&2; exit 2; }
prompt=$(printf 'word %.0s' $(seq "$words"))
cold=warm
if (sync && echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then cold=cold; fi
drop() { if [ "$cold" = cold ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }

kv_args=()
[ -n "$cache_type" ] && kv_args=(--cache-type "$cache_type")
llama_kv=()
[ -n "$cache_type" ] && llama_kv=(-ctk "$cache_type" -ctv "$cache_type")
minfer_cmd=("$minfer" run -m "$model" -t "$threads" --ctx "$ctx" --temp 0 --raw ${kv_args[@]+"${kv_args[@]}"} -p "$prompt" -n)
llama_cmd=("$llama" -m "$model" -t "$threads" -c "$ctx" --temp 0 -no-cnv ${llama_kv[@]+"${llama_kv[@]}"} -p "$prompt" -n)

# "seconds KiB": wall seconds of `-n 1` after a cache drop, peak RSS of `-n 16`. A run that
# fails stops the script with its command and error output.
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
timed() { # FORMAT CMD...: GNU time's FORMAT of one run of CMD
    local fmt=$1
    shift
    if ! /usr/bin/time -f "$fmt" -o "$out" "$@" </dev/null >/dev/null 2>"$err"; then
        echo "bench_rss_ttft.sh: $1 failed (exit status or error below)" >&2
        tail -5 "$err" >&2
        exit 1
    fi
    tail -1 "$out"
}
measure() {
    local -n cmd=$1
    local t r
    drop
    t=$(timed %e "${cmd[@]}" 1) || exit 1
    r=$(timed %M "${cmd[@]}" 16) || exit 1
    echo "$t $r"
}

declare -a lt lr mt mr
for ((i = 1; i <= rounds; i++)); do
    echo "bench_rss_ttft.sh: round $i/$rounds" >&2
    m=$(measure llama_cmd); read -r a b <<<"$m"; lt+=("$a"); lr+=("$b")
    m=$(measure minfer_cmd); read -r a b <<<"$m"; mt+=("$a"); mr+=("$b")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p')"
echo "model $(basename "$model"), $threads threads, ctx $ctx, prompt of $words words, KV ${cache_type:-default (minfer f32, llama.cpp f16)}, $cold start, median of $rounds alternating rounds"
echo "| | llama.cpp | minfer | minfer / llama.cpp |"
echo "| --- | ---: | ---: | ---: |"
lt_m=$(median "${lt[@]}"); mt_m=$(median "${mt[@]}")
lr_m=$(median "${lr[@]}"); mr_m=$(median "${mr[@]}")
awk -v a="$lt_m" -v b="$mt_m" -v c="$cold" 'BEGIN {printf "| time to first token, %s (s) | %.2f | %.2f | %.2fx |\n", c, a, b, b / a}'
awk -v a="$lr_m" -v b="$mr_m" 'BEGIN {printf "| peak RSS (MiB) | %.0f | %.0f | %.2fx |\n", a / 1024, b / 1024, b / a}'
