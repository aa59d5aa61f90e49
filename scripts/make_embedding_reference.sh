#!/usr/bin/env bash
# Writes tests/data/qwen2.5-0.5b.embeddings.json: llama.cpp's own final hidden states of a few
# texts with Qwen2.5-Coder-0.5B (the independent reference of tests/embeddings.rs).
#
# The states come from llama.cpp's embeddings API (pooling none) through tools/parity/lldump.cpp:
# every token evaluated on its own, f32 K and V, flash attention off, 2 threads — the path
# ../shared/reference and minfer's parity follow. (llama-server cannot embed that way: it
# evaluates an embedding's input in one batch, whose rounding differs from llama.cpp's own
# single-token path by up to ~1e-3 of the states' largest value; it is only used here to
# tokenize.) Both are built from the llama-cpp-python==0.3.36 sources
# (tests/compat/build_llama_server.sh). The mean (in f64) and first-token ("cls") vectors are
# computed here from the per-token rows; raw states, not normalised.
# Usage: scripts/make_embedding_reference.sh [MODEL]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${1:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}"
server="$("$root/tests/compat/build_llama_server.sh")"
libs="$(dirname "$server")"
src="$("$root/scripts/llama_src.sh")"
tmp="$(mktemp -d)"
g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$root/tools/parity/lldump.cpp" -o "$tmp/lldump" \
    -L"$libs" -lllama -lggml -lggml-base -Wl,-rpath,"$libs"
out="$root/tests/data/qwen2.5-0.5b.embeddings.json"
port=18571
"$server" -m "$model" -t 2 -c 512 --port "$port" --host 127.0.0.1 >"$tmp/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.3
done
python3 - "$port" "$out" "$model" "$tmp" <<'EOF'
import json, os, struct, subprocess, sys, urllib.request
port, out, model, tmp = sys.argv[1:5]
# (text, keep every token's state): the long one keeps only its pooled vectors.
texts = [
    ("Hello", True),
    ("The quick brown fox jumps over the lazy dog.", True),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", False),
    ("Embeddings pool the final hidden states of a sequence into one vector.", True),
]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
def g8(v):
    return [float("%.8g" % x) for x in v]
cases = []
for text, keep_rows in texts:
    tokens = post("/tokenize", {"content": text, "add_special": True})["tokens"]
    raw = f"{tmp}/embd.f32"
    subprocess.run([f"{tmp}/lldump", "-m", model, "--ids", ",".join(map(str, tokens)), "--from", str(len(tokens)), "--embd-out", raw], check=True, stdout=subprocess.DEVNULL)
    data = open(raw, "rb").read()
    n = len(data) // 4 // len(tokens)
    flat = struct.unpack(f"<{len(data) // 4}f", data)
    rows = [list(flat[i * n:(i + 1) * n]) for i in range(len(tokens))]
    mean = [sum(r[j] for r in rows) / len(rows) for j in range(n)]
    case = {"text": text, "tokens": tokens, "last": g8(rows[-1]), "cls": g8(rows[0]), "mean": g8(mean)}
    if keep_rows:
        case["none"] = [g8(r) for r in rows]
    cases.append(case)
ref = {
    "source": "llama.cpp (llama-cpp-python==0.3.36) embeddings API, pooling none, one token per llama_decode (tools/parity/lldump.cpp --embd-out): CPU, 2 threads, f32 KV, flash attention off; tokens from llama-server /tokenize (add_special); mean (f64) and cls from the rows",
    "model": os.path.basename(model),
    "cases": cases,
}
json.dump(ref, open(out, "w"), separators=(",", ":"))
print(f"wrote {out}")
EOF
