#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine, as one prepared run (docs/CUDA.md).
#
#   scripts/device_check.sh --bundle    here: build the cuda-feature binaries and fill
#                                       target/device-bundle (stripped minfer, the backend_ops
#                                       test binary, qwen3-tiny.gguf); check it fits 64 MiB
#   scripts/device_check.sh --dry-run   --bundle, then check the tools and rehearse every step
#                                       on the CPU (the comparators, synth, the session round
#                                       trip) with the GPU steps skipped; CI runs this
#   scripts/device_check.sh             on the GPU machine (a bare x86-64 box with an NVIDIA
#                                       driver; no Rust, no network), from the repository root
#                                       with target/device-bundle carried: every step on CUDA;
#                                       writes device_report.json and device_report.md to $OUT
#
# Steps on the GPU: backend_ops on CUDA beside the CPU (every op, shape and type of its table,
# with its tolerances); Qwen3-tiny teacher-forced logits against llama.cpp's reference
# (tests/data/qwen3-tiny.greedy.jsonl) and greedy equality on the decisive prefix; a session
# saved on CUDA continued on the CPU and back; minfer bench pp512/tg128 on a synthetic model
# shaped like Qwen2.5-0.5B Q4_K_M (minfer synth), CUDA and CPU. Budget: under 6 minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODE=device
case "${1:-}" in
  --bundle) MODE=bundle ;;
  --dry-run) MODE=dry ;;
  "") ;;
  *) echo "usage: scripts/device_check.sh [--bundle | --dry-run]" >&2; exit 2 ;;
esac
BUNDLE=target/device-bundle
LIMIT=$((64 * 1024 * 1024))
say() { echo "device_check: $*" >&2; }
die() { say "$*"; exit 1; }

make_bundle() {
  command -v cargo >/dev/null || die "--bundle needs cargo (it builds the binaries)"
  [ -f models/qwen3-tiny.gguf ] || scripts/fetch_models.sh qwen3-tiny >/dev/null
  cargo build --release --features cuda >&2
  local ops
  ops=$(cargo test --release --features cuda --test backend_ops --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "backend_ops" and m.get("executable"):
        print(m["executable"])')
  [ -x "$ops" ] || die "the backend_ops test binary was not built"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  cp target/release/minfer "$BUNDLE/minfer"
  cp "$ops" "$BUNDLE/backend_ops"
  strip "$BUNDLE/minfer" "$BUNDLE/backend_ops" 2>/dev/null || say "strip not found: the binaries keep their symbols"
  cp models/qwen3-tiny.gguf "$BUNDLE/"
  local bundle tree total
  bundle=$(du -cb "$BUNDLE"/* | tail -1 | cut -f1)
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  total=$((bundle + tree))
  say "bundle $BUNDLE: $((bundle / 1024 / 1024)) MiB, with the tracked tree $((total / 1024 / 1024)) MiB (limit 64 MiB)"
  [ "$total" -lt "$LIMIT" ] || die "the bundle and the tree are $total bytes, over the 64 MiB a device run carries"
}

if [ "$MODE" != device ]; then
  make_bundle
  [ "$MODE" = bundle ] && { say "carry: [\"$BUNDLE\"]; run: scripts/device_check.sh"; exit 0; }
fi

# ---- tools and the bundle (every mode from here) ----
for f in minfer backend_ops qwen3-tiny.gguf; do [ -e "$BUNDLE/$f" ] || die "missing $BUNDLE/$f: run scripts/device_check.sh --bundle first (and carry $BUNDLE)"; done
command -v python3 >/dev/null || die "python3 is needed for the comparisons"
M="$BUNDLE/minfer"
MODEL="$BUNDLE/qwen3-tiny.gguf"
REF=tests/data/qwen3-tiny.greedy.jsonl
"$M" --version >/dev/null || die "$M does not run here"
"$BUNDLE/backend_ops" --list >/dev/null || die "$BUNDLE/backend_ops does not run here"
OUT_DIR="${OUT:-target/device-report}"
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ "$MODE" = device ]; then
  BACKEND=cuda
  # NVRTC: a CUDA 12 toolkit's libnvrtc.so.12, else a CUDA 13 one (the lent H200s carry CUDA
  # 13): the calls minfer makes (create, compile, PTX/cubin, log, version) keep their ABI, so a
  # folder of links names it libnvrtc.so.12 and libnvrtc.so for cudarc's loader, which finds
  # the file already mapped.
  nvrtc=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libnvrtc.so.12" ] && { nvrtc="$d/libnvrtc.so.12"; break; }
  done
  if [ -z "$nvrtc" ]; then
    nvrtc=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local/cuda* /opt /usr/lib -maxdepth 8 \
      -name 'libnvrtc.so.1[0-9]' 2>/dev/null | sort | tail -1 || true)
  fi
  if [ -n "$nvrtc" ]; then
    links="$WORK/nvrtc"; mkdir -p "$links"
    for b in "$(dirname "$nvrtc")"/libnvrtc-builtins.so*; do [ -e "$b" ] && ln -sf "$b" "$links/"; done
    ln -sf "$nvrtc" "$links/libnvrtc.so.12"; ln -sf "$nvrtc" "$links/libnvrtc.so"
    export MINFER_NVRTC="$links/libnvrtc.so.12" LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
    echo "nvrtc: ${nvrtc:-not found}"; } > "$WORK/gpu.txt"
  export MINFER_CUDA_CACHE="$WORK/ptx"
else
  BACKEND=cpu
  echo "dry run: no GPU" > "$WORK/gpu.txt"
fi
say "mode $MODE, backend $BACKEND, report in $OUT_DIR"
STEP_LOG="$WORK/steps.tsv"
: > "$STEP_LOG"
export M MODEL BACKEND WORK
# The whole run keeps inside DEVICE_BUDGET_S (default 480 s), so that the report is written even
# when a step hangs: each step's limit is cut to what is left, and a step with nothing left is
# skipped (exit 125).
DEADLINE=$(( $(date +%s) + ${DEVICE_BUDGET_S:-480} ))
step() { # step NAME SECONDS COMMAND...: runs it (a command or a function of this script) with a
  # time limit, logs name, exit status, seconds
  local name=$1 limit=$2; shift 2
  local t0 rc left
  left=$(( DEADLINE - $(date +%s) - 15 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    printf '%s\t125\t0\n' "$name" >> "$STEP_LOG"; : > "$WORK/$name.out"; echo "skipped: no time left" > "$WORK/$name.err"
    say "$name: skipped (no time left)"; return 0
  fi
  t0=$(date +%s%N)
  set +e
  timeout "$limit" bash -c '"$@"' _ "$@" > "$WORK/$name.out" 2> "$WORK/$name.err"
  rc=$?
  set -e
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( ($(date +%s%N) - t0) / 100000000 ))" >> "$STEP_LOG"
  say "$name: exit $rc"
}

# 1. backend_ops: the CPU and CUDA on every case (on the dry run: the CPU alone, a few cases).
# 0. The probe: the backend loads Qwen3-tiny (a failure here explains every later one).
step probe 60 "$M" info --backend "$BACKEND" "$MODEL"

if [ "$MODE" = device ]; then
  MINFER_MODEL_DIR="$BUNDLE" step backend_ops 150 "$BUNDLE/backend_ops" --backend cpu --backend cuda
else
  MINFER_MODEL_DIR="$BUNDLE" step backend_ops 120 "$BUNDLE/backend_ops" --backend cpu add/ rms_norm/ coverage/
fi

# 2. Teacher-forced logits and greedy prefix, Qwen3-tiny, every reference record.
python3 - "$REF" "$WORK/records" <<'EOF'
import json, sys, os
os.makedirs(sys.argv[2], exist_ok=True)
for n, line in enumerate(l for l in open(sys.argv[1]) if l.strip()):
    r = json.loads(line)
    steps = len(r["top20_per_step"])
    ids = r["prompt_ids"] + r["generated_ids"][: steps - 1]
    open(f"{sys.argv[2]}/{n:02d}.ids", "w").write(",".join(map(str, ids)) + f"\n{len(r['prompt_ids']) - 1}\n")
EOF
logits_all() {
  for f in "$WORK"/records/*.ids; do
    local ids from
    ids=$(sed -n 1p "$f"); from=$(sed -n 2p "$f")
    "$M" logits -m "$MODEL" --backend "$BACKEND" --ids "$ids" --from "$from" --top 200 --ctx 512 > "${f%.ids}.logits" || return 1
  done
}
export -f logits_all
step logits 180 logits_all

# 3. Session round trip: a turn on one backend, /save, /load on the other, another turn.
session() {
  local a=$1 b=$2 file="$WORK/session-$1-$2.bin"
  printf 'Hello there\n/save %s\n/exit\n' "$file" | "$M" chat -m "$MODEL" --backend "$a" --temp 0 -n 8 > "$WORK/chat-$a-$b.1" 2>&1 || return 1
  local saved loaded
  saved=$(sed -n 's/^saved \([0-9]*\) tokens.*/\1/p' "$WORK/chat-$a-$b.1")
  [ -n "$saved" ] && [ -s "$file" ] || { echo "no session saved on $a"; cat "$WORK/chat-$a-$b.1"; return 1; }
  printf '/load %s\nAnd then?\n/exit\n' "$file" | "$M" chat -m "$MODEL" --backend "$b" --temp 0 -n 8 > "$WORK/chat-$a-$b.2" 2>&1 || return 1
  loaded=$(sed -n 's/^loaded \([0-9]*\) tokens.*/\1/p' "$WORK/chat-$a-$b.2")
  [ "$loaded" = "$saved" ] || { echo "saved $saved tokens on $a, loaded '${loaded}' on $b"; cat "$WORK/chat-$a-$b.2"; return 1; }
  echo "saved $saved tokens on $a, loaded them on $b, answered the next turn"
}
export -f session
step session_there 60 session "$BACKEND" cpu
step session_back 60 session cpu "$BACKEND"

# 4. Speed on a synthetic Qwen2.5-0.5B Q4_K_M: CUDA, then the CPU for the ratio.
step synth 60 "$M" synth --like qwen2.5-0.5b-q4_k_m -o "$WORK/synth05.gguf"
step load 60 "$M" info --backend "$BACKEND" "$WORK/synth05.gguf"
if [ "$MODE" = device ]; then
  step bench_cuda 150 "$M" bench -m "$WORK/synth05.gguf" --backend cuda -p 512 -n 128 -r 3 -o json
  MINFER_NO_CUDA_GRAPH=1 step bench_cuda_nograph 90 "$M" bench -m "$WORK/synth05.gguf" --backend cuda -p 0 -n 128 -r 2 -o json
  step bench_cpu 90 "$M" bench -m "$WORK/synth05.gguf" --backend cpu -p 512 -n 128 -r 1 -o json
  # 5. Where the GPU time goes: Nsight Compute's per-kernel durations over a window of decode
  # launches and one of prefill launches (one metric, one pass each), where ncu is there and
  # can read the counters (it cannot under gVisor).
  profile() {
    local ncu
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
    [ -n "$ncu" ] || { echo "no ncu"; return 3; }
    echo "== decode: bench -p 0 -n 48, launches 1500..2999"
    "$ncu" --clock-control none --metrics gpu__time_duration.sum --launch-skip 1500 --launch-count 1500 \
      --print-summary per-kernel "$M" bench -m "$WORK/synth05.gguf" --backend cuda -p 0 -n 48 -r 1 2>&1 | grep -v "^==PROF==" || return 1
    echo "== prefill: bench -p 512 -n 0, launches 700..1399"
    MINFER_NO_CUDA_GRAPH=1 "$ncu" --clock-control none --metrics gpu__time_duration.sum --launch-skip 700 --launch-count 700 \
      --print-summary per-kernel "$M" bench -m "$WORK/synth05.gguf" --backend cuda -p 512 -n 0 -r 1 2>&1 | grep -v "^==PROF==" || return 1
  }
  export -f profile
  step profile 150 profile
else
  step bench_cpu 90 "$M" bench -m "$WORK/synth05.gguf" --backend cpu -p 16 -n 4 -r 1 -o json
fi

# ---- the report ----
python3 - "$MODE" "$WORK" "$REF" "$OUT_DIR" <<'EOF'
import json, sys, glob, os, datetime
mode, work, ref, out = sys.argv[1:5]
steps = {}
for line in open(f"{work}/steps.tsv"):
    name, rc, secs = line.rstrip("\n").split("\t")
    tail = lambda ext: open(f"{work}/{name}.{ext}", errors="replace").read()[-2000:] if os.path.exists(f"{work}/{name}.{ext}") else ""
    steps[name] = {"rc": int(rc), "seconds": int(secs) / 10, "stdout_tail": tail("out"), "stderr_tail": tail("err")}
report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "mode": mode,
          "gpu": open(f"{work}/gpu.txt").read().strip(), "steps": steps, "checks": {}}
checks = report["checks"]

# backend_ops: its summary line.
summary = [l for l in steps["backend_ops"]["stdout_tail"].splitlines() if l.startswith("backend_ops:")]
checks["backend_ops"] = {"pass": steps["backend_ops"]["rc"] == 0, "summary": summary[-1] if summary else "no summary"}

# Logits: each reference top-20 id's logit against minfer's (its top-200; a missing id fails).
records = [json.loads(l) for l in open(ref) if l.strip()]
max_d, worst, n, missing, greedy_checked, greedy_bad = 0.0, "", 0, 0, 0, []
for i, r in enumerate(records):
    path = f"{work}/records/{i:02d}.logits"
    lines = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    decisive = True
    for s, want in enumerate(r["top20_per_step"]):
        if s >= len(lines):
            missing += len(want)
            continue
        got = {p[0]: p[1] for p in lines[s]["top"]}
        for tok, logit in want:
            if tok not in got:
                missing += 1
                continue
            d = abs(got[tok] - logit)
            n += 1
            if d > max_d:
                max_d, worst = d, f"record {r.get('id', i)} step {s} id {tok}: {got[tok]:.4f} vs {logit:.4f}"
        decisive = decisive and r["margin_top1_top2"][s] >= 0.5
        if decisive:
            greedy_checked += 1
            if lines[s]["top"][0][0] != r["generated_ids"][s]:
                greedy_bad.append(f"record {r.get('id', i)} step {s}")
checks["logits"] = {"compared": n, "missing": missing, "max_abs_diff": round(max_d, 6), "worst": worst,
                    "target": 0.05, "pass": n > 0 and missing == 0 and max_d <= 0.05}
checks["greedy"] = {"decisive_steps": greedy_checked, "mismatches": greedy_bad[:10], "pass": not greedy_bad}
checks["session"] = {"pass": steps["session_there"]["rc"] == 0 and steps["session_back"]["rc"] == 0}

def bench(name):
    try:
        rows = json.load(open(f"{work}/{name}.out"))
        return {f"{'pp' if r.get('n_prompt') else 'tg'}{r.get('n_prompt') or r.get('n_gen')}": round(r.get("avg_ts"), 1) for r in rows}
    except Exception as e:
        return {"error": str(e)}
checks["bench"] = {k: bench(k) for k in ("bench_cuda", "bench_cuda_nograph", "bench_cpu") if k in steps}
checks["load"] = [l for l in open(f"{work}/load.out").read().splitlines() if l.startswith(("loaded in", "backend "))] if os.path.exists(f"{work}/load.out") else []
if mode == "device":
    cu = checks["bench"].get("bench_cuda", {})
    checks["bench"]["targets"] = {"tg128 >= 1000": (cu.get("tg128") or 0) >= 1000, "pp512 >= 20000": (cu.get("pp512") or 0) >= 20000}
json.dump(report, open(f"{out}/device_report.json", "w"), indent=1)
ok = lambda b: "pass" if b else "FAIL"
md = [f"# minfer device check ({mode}, {report['date']})", "", f"GPU: {report['gpu']}", "",
      "| check | result | detail |", "| --- | --- | --- |",
      f"| backend_ops | {ok(checks['backend_ops']['pass'])} | {checks['backend_ops']['summary']} |",
      f"| Qwen3-tiny teacher-forced logits | {ok(checks['logits']['pass'])} | max abs diff {checks['logits']['max_abs_diff']} (target 0.05) over {n} logits, {missing} missing; largest: {worst} |",
      f"| greedy on the decisive prefix | {ok(checks['greedy']['pass'])} | {greedy_checked} steps, {len(greedy_bad)} mismatches |",
      f"| session round trip | {ok(checks['session']['pass'])} | there: exit {steps['session_there']['rc']}, back: exit {steps['session_back']['rc']} |",
      f"| bench (synthetic 0.5B Q4_K_M) | | {json.dumps({k: v for k, v in checks['bench'].items()})} |",
      f"| load (synthetic 0.5B) | | {'; '.join(checks['load'])} |", "",
      f"| probe | {ok(steps['probe']['rc'] == 0)} | {steps['probe']['stdout_tail'][-300:].strip()} {steps['probe']['stderr_tail'][-300:].strip()} |".replace("\n", "; "), "",
      "| step | exit | seconds |", "| --- | --- | --- |"] + [f"| {k} | {v['rc']} | {v['seconds']} |" for k, v in steps.items()]
open(f"{out}/device_report.md", "w").write("\n".join(md) + "\n")
import tarfile
with tarfile.open(f"{out}/device_steps.tgz", "w:gz") as t:
    for f in sorted(glob.glob(f"{work}/*.out") + glob.glob(f"{work}/*.err") + [f"{work}/gpu.txt"]):
        t.add(f, arcname=os.path.basename(f))
print("\n".join(md))
EOF
if [ "$MODE" = dry ]; then
  # The rehearsal must itself succeed: every step ran, the comparators read what minfer wrote.
  python3 - "$OUT_DIR/device_report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [k for k, v in r["steps"].items() if v["rc"] != 0]
lg = r["checks"]["logits"]
if bad or lg["compared"] == 0 or lg["missing"] or not r["checks"]["session"]["pass"]:
    sys.exit(f"device_check: the dry run failed: steps {bad}, logits {lg}")
print(f"device_check: dry run ok (CPU rehearsal: logits max abs diff {lg['max_abs_diff']} over {lg['compared']})")
EOF
fi
