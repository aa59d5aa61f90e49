#!/usr/bin/env bash
# The compatibility harness: llama.cpp's own server test suite (tools/server/tests of the
# llama-cpp-python==0.3.36 source package) run against `minfer serve` through
# tests/compat/llama_server_shim.py, on a local GGUF (default: Qwen3-tiny).
#
# Usage: tests/compat/run.sh [--llama-server | --only-llama-server] [--check] [--model GGUF]
#                            [--minfer BIN] [FILE...]
#   FILE...         unit files of the suite (default: the nine of docs/SERVER.md's table)
#   --llama-server  also run the suite against llama-server itself (built by
#                   tests/compat/build_llama_server.sh, ~15 minutes the first time), same model;
#                   --only-llama-server: that one alone (the table then reads the last minfer run)
#   --check         exit 1 when a test fails that tests/compat/expected_failures.txt does not
#                   list (each listed failure is classified there), or when a listed one passes
#                   (the list must stay true); CI runs this
# Writes target/compat/<engine>.json (every test's outcome) and prints passed/failed per file.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
FILES=(test_basic.py test_chat_completion.py test_completion.py test_security.py test_tokenize.py
       test_ctx_shift.py test_metrics.py test_ignore_eos.py test_compat_oai_responses.py)
model="$repo/models/qwen3-tiny.gguf" bin="$repo/target/release/minfer" llama=0 check=0 files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --llama-server) llama=1; shift ;;
    --only-llama-server) llama=2; shift ;;
    --check) check=1; shift ;;
    --model) model="$2"; shift 2 ;;
    --minfer) bin="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
[ ${#files[@]} -gt 0 ] || files=("${FILES[@]}")
[ -f "$model" ] || { echo "run.sh: no model at $model (scripts/fetch_models.sh qwen3-tiny)" >&2; exit 1; }
[ -x "$bin" ] || { echo "run.sh: no minfer at $bin (cargo build --release)" >&2; exit 1; }
src="$(scripts/llama_src.sh)"
py="$(scripts/python_env.sh tests/compat/requirements.txt "${MINFER_COMPAT_VENV:-$repo/.venv-compat}")"
out="$repo/target/compat"
mkdir -p "$out"

run_suite() { # run_suite ENGINE: the files against one engine, outcomes in $out/ENGINE.json
  local engine=$1 work tests
  work="$(mktemp -d)"
  tests="$work/tools/server/tests"
  # The suite's own layout: some tests name files relative to it (../../../models/templates).
  mkdir -p "$tests" "$work/models"
  cp -r "$src/tools/server/tests/." "$tests/"
  cp -r "$src/models/templates" "$work/models/"
  export LLAMA_SERVER_BIN_PATH="$repo/tests/compat/llama_server_shim.py" COMPAT_MODEL="$model" \
    COMPAT_TARGET="$engine" MINFER_BIN="$bin" PORT="${COMPAT_PORT:-18431}" LLAMA_CACHE="$work/tmp"
  for f in "${files[@]}"; do
    [ -f "$tests/unit/$f" ] || { echo "run.sh: the suite has no unit/$f" >&2; exit 1; }
    # One file at a time, one process (the tests share the port); a file's failures do not stop
    # the others; slow tests deselected, as the suite's own tests.sh does. pytest's exit status
    # is read from the JUnit report instead.
    (cd "$tests" && timeout 900 "$py" -m pytest -q -p no:cacheprovider -o junit_family=xunit1 -m "not slow" \
      --junitxml="$work/junit-${f%.py}.xml" "unit/$f" > "$work/log-${f%.py}.txt" 2>&1) || true
  done
  # With --check, a failure expected_failures.txt does not list is run once more on its own
  # (the suite has timing-dependent tests; a machine's hiccup is not a regression).
  local retry=0
  [ "$engine" = minfer ] && retry=$check
  "$py" - "$work" "$tests" "$out/$engine.json" "$retry" "$repo/tests/compat/expected_failures.txt" "${files[@]}" <<'EOF'
import json, subprocess, sys, xml.etree.ElementTree as ET
work, tests, dest, check, expected_path, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5], sys.argv[6:]
def outcomes(xml_path, f):
    out = {}
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        name = f"{f}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (el.get("message") or "")[:300]
        out[name] = {"outcome": outcome, "message": message}
    return out
results = {}
for f in files:
    try:
        results.update(outcomes(f"{work}/junit-{f[:-3]}.xml", f))
    except (OSError, ET.ParseError) as e:
        results[f"{f}::(file)"] = {"outcome": "error", "message": f"no JUnit report: {e}"}
if check:
    expected = {l.split(" # ", 1)[0].strip() for l in open(expected_path) if l.strip() and not l.startswith("#")}
    for i, (name, r) in enumerate(sorted(results.items())):
        if r["outcome"] in ("failed", "error") and name not in expected and "::(" not in name:
            xml = f"{work}/retry-{i}.xml"
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                            f"--junitxml={xml}", "unit/" + name], cwd=tests, capture_output=True, timeout=600)
            try:
                again = outcomes(xml, name.split("::")[0]).get(name)
            except (OSError, ET.ParseError):
                again = None
            if again and again["outcome"] == "passed":
                results[name] = {"outcome": "passed", "message": "passed when run again alone (first: " + r["message"][:200] + ")"}
json.dump(results, open(dest, "w"), indent=1, sort_keys=True)
EOF
  rm -rf "$work"
}

[ "$llama" = 2 ] || run_suite minfer
engines=(minfer)
if [ "$llama" != 0 ]; then
  export LLAMA_SERVER_REAL="$(tests/compat/build_llama_server.sh)"
  run_suite llama-server
  engines+=(llama-server)
fi

"$py" - "$out" "$check" "$repo/tests/compat/expected_failures.txt" "${engines[@]}" <<'EOF'
import json, sys, collections
out, check, expected_path, engines = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4:]
res = {e: json.load(open(f"{out}/{e}.json")) for e in engines}
files = sorted({k.split("::")[0] for r in res.values() for k in r})
print("| file | " + " | ".join(f"{e} passed / failed" for e in engines) + " |")
print("| --- |" + " --- |" * len(engines))
totals = collections.Counter()
for f in files:
    cells = []
    for e in engines:
        c = collections.Counter(v["outcome"] for k, v in res[e].items() if k.startswith(f + "::"))
        n = sum(c.values())
        cells.append(f"{c['passed']} / {n - c['passed'] - c['skipped']}" + (f" ({c['skipped']} skipped)" if c["skipped"] else ""))
        totals[(e, "passed")] += c["passed"]
        totals[(e, "all")] += n
    print(f"| {f} | " + " | ".join(cells) + " |")
print("| all | " + " | ".join(f"{totals[(e, 'passed')]} of {totals[(e, 'all')]}" for e in engines) + " |")
if not check:
    sys.exit(0)
# "FILE::TEST  # class: why" per line; lines starting with # are comments.
expected = {}
for line in open(expected_path):
    if line.strip() and not line.startswith("#"):
        test, _, cls = line.partition(" # ")
        expected[test.strip()] = cls.strip()
mine = res["minfer"]
bad = [k for k, v in mine.items() if v["outcome"] in ("failed", "error") and k not in expected]
stale = [k for k in expected if mine.get(k, {}).get("outcome") == "passed"]
missing = [k for k in expected if k not in mine and k.split("::")[0] in files]
for k in bad:
    print(f"compat: FAILED, not in expected_failures.txt: {k}: {mine[k]['message']}")
for k in stale:
    print(f"compat: passes now, remove it from expected_failures.txt: {k}")
for k in missing:
    print(f"compat: listed in expected_failures.txt but not run: {k}")
sys.exit(1 if bad or stale or missing else 0)
EOF
