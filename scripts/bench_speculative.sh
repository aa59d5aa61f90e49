#!/usr/bin/env bash
# Speculative decoding vs plain decoding on the same target, greedy, alternating runs.
#
# Usage: scripts/bench_speculative.sh [-t THREADS] [-n N_GEN] [--rounds K] [--draft-n N] [--draft-min-p P]
#   defaults: target models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, draft the 0.5B, 2 threads,
#   128 tokens, 3 rounds, minfer's draft defaults.
#
# For a code prompt and a prose prompt, each round runs `minfer run --json` without and with
# `--draft` (in that order, then the next round); prints the median decode t/s of each, their
# ratio, and the draft's acceptance. Also checks that both give the same tokens. A benchmark,
# not a test: CI does not run it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$repo/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
draft="$repo/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
threads=2 n_gen=128 rounds=3 extra=()
die() { echo "bench_speculative.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        -t) threads="$2"; shift 2 ;;
        -n) n_gen="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --draft-n|--draft-min-p) extra+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
done
for m in "$target" "$draft"; do [ -f "$m" ] || die "no model at $m (scripts/fetch_models.sh default 1.5b)"; done
cargo build --release --quiet --manifest-path "$repo/Cargo.toml"
minfer="$repo/target/release/minfer"
out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT

declare -A prompts=(
    [code]='def quicksort(arr):'
    [prose]='The history of the Roman Empire is'
)
echo "target $(basename "$target"), draft $(basename "$draft"), $threads threads, $n_gen tokens, $rounds rounds ${extra[*]:-}"
printf '| prompt | plain t/s | draft t/s | ratio | acceptance | drafted | accepted | rounds |\n|---|---|---|---|---|---|---|---|\n'
for name in code prose; do
    p="${prompts[$name]}"
    for r in $(seq "$rounds"); do
        "$minfer" run -m "$target" --raw -p "$p" -n "$n_gen" --temp 0 -t "$threads" --json 2>/dev/null >"$out/$name.plain.$r"
        "$minfer" run -m "$target" --draft "$draft" "${extra[@]}" --raw -p "$p" -n "$n_gen" --temp 0 -t "$threads" --json \
            2>/dev/null >"$out/$name.spec.$r"
    done
    python3 - "$out" "$name" "$rounds" <<'EOF'
import json, statistics, sys
out, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
load = lambda kind: [json.load(open(f"{out}/{name}.{kind}.{r}")) for r in range(1, rounds + 1)]
plain, spec = load("plain"), load("spec")
for a, b in zip(plain, spec):
    if a["generated_ids"] != b["generated_ids"]:
        sys.exit(f"{name}: speculative tokens differ from plain greedy")
tp = statistics.median(x["gen_tokens_per_s"] for x in plain)
ts = statistics.median(x["gen_tokens_per_s"] for x in spec)
d = spec[-1]["draft"]
print(f"| {name} | {tp:.1f} | {ts:.1f} | {ts / tp:.2f} | {100 * d['acceptance']:.0f}% | {d['drafted']} | {d['accepted']} | {d['rounds']} |")
EOF
done
