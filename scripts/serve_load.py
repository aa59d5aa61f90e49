#!/usr/bin/env python3
"""Load run of `minfer serve`: N clients send R requests of mixed lengths (short and long
prompts, 16 to 96 generated tokens, chat and completions) to a server started with the given
options; prints requests/s, p50/p95 latency, generated tokens/s, errors, and checks that
/metrics counts what the clients got. A benchmark, not a test.

Usage: scripts/serve_load.py [--clients 8] [--requests 64] [--bin target/release/minfer]
                             [--model MODEL] [-- SERVER OPTIONS...]
e.g.   scripts/serve_load.py -- --slots 4 --batch on
       scripts/serve_load.py -- --slots 4 --batch off
Only the standard library: it speaks HTTP itself.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(binary, model, opts):
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", *opts],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("serve_load.py: the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    while request(port, "GET", "/health")[0] != 200:
        time.sleep(0.05)
    return proc, port


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def metrics(port):
    out = {}
    for line in request(port, "GET", "/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


TOPICS = ["cats", "rivers", "compilers", "tea", "mountains", "trains", "bees", "rain", "maps", "clocks"]


def body(i):
    """Request i: every third a completion, every fourth a long prompt; 16..96 tokens."""
    topic = TOPICS[i % len(TOPICS)]
    n = [16, 32, 64, 96][i % 4]
    text = f"Tell me about {topic}."
    if i % 4 == 3:
        text = " ".join(f"Note {k}: {TOPICS[(i + k) % 10]} are interesting." for k in range(40)) + f" Summarize the notes about {topic}."
    if i % 3 == 2:
        return "/v1/completions", {"prompt": text, "max_tokens": n, "temperature": 0.7, "seed": i}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": n,
                                    "temperature": 0.7, "seed": i}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/minfer"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("opts", nargs="*")
    a = ap.parse_args()
    proc, port = start(a.bin, a.model, a.opts)
    try:
        before = metrics(port)
        results, errors, lock = [], [], threading.Lock()

        def client(k):
            for i in range(k, a.requests, a.clients):
                path, b = body(i)
                t0 = time.time()
                status, r = request(port, "POST", path, b)
                with lock:
                    if status == 200:
                        u = r["usage"]
                        results.append((time.time() - t0, u["prompt_tokens"], u["completion_tokens"],
                                        u.get("prompt_tokens_details", {}).get("cached_tokens", 0)))
                    else:
                        errors.append((i, status, str(r)[:200]))

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        after = metrics(port)
    finally:
        proc.terminate()
        proc.wait()
    d = lambda k: after.get(k, 0) - before.get(k, 0)
    lat = sorted(r[0] for r in results)
    prompt, gen, cached = (sum(r[i] for r in results) for i in (1, 2, 3))
    checks = {
        "requests_200": d('minfer_requests_total{status="200"}') == len(results),
        "generated_tokens": d("minfer_generated_tokens_total") == gen,
        "prompt_tokens": d("minfer_prompt_tokens_total") + d("minfer_prompt_cached_tokens_total") == prompt,
        "cached_tokens": d("minfer_prompt_cached_tokens_total") == cached,
    }
    report = {
        "server": " ".join(a.opts), "clients": a.clients, "requests": a.requests, "errors": len(errors),
        "requests_per_s": round(len(results) / wall, 3),
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3) if lat else None,
        "wall_s": round(wall, 2), "prompt_tokens": prompt, "cached_tokens": cached, "generated_tokens": gen,
        "generated_tokens_per_s": round(gen / wall, 2), "metrics_match": checks,
    }
    print(json.dumps(report))
    if errors or not all(checks.values()):
        print("serve_load.py: FAILED: " + json.dumps(errors[:5]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
