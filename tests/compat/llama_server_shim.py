#!/usr/bin/env python3
"""llama-server's command line, served by `minfer serve` (or by llama-server itself).

llama.cpp's server tests start `$LLAMA_SERVER_BIN_PATH` with llama-server's flags and a model
named by `--hf-repo`/`--hf-file` (downloaded from Hugging Face there). This shim is that
program for the compatibility harness (tests/compat/run.sh): it reads the flags, replaces the
model with the local GGUF in $COMPAT_MODEL (no network here), and execs

- `minfer serve` ($MINFER_BIN) with each flag translated, when $COMPAT_TARGET is `minfer`
  (the default);
- llama-server ($LLAMA_SERVER_REAL) with the same flags and the local model, when it is
  `llama-server`, so both engines are measured by the same suite on the same model.

Flags that change nothing minfer does differently (GPU layers, flash attention, the web UI,
unified KV, continuous batching, --jinja: minfer always renders Jinja) are dropped. A flag the
shim does not know is dropped with a line on stderr, so that the suite's session-wide warm-up
(which starts every preset once) does not stop; the tests that rely on it fail on their own
assertions, and docs/SERVER.md lists them.
"""

import os
import sys

# llama-server flag -> (number of values, minfer flag or None to drop).
MAP = {
    "--port": (1, "--port"),
    "--host": (1, "--host"),
    "--temp": (1, "--temp"),
    "--seed": (1, "--seed"),
    "--alias": (1, "--alias"),
    "--tags": (1, "--tags"),
    "--threads": (1, "--threads"),
    "-t": (1, "--threads"),
    "--ctx-size": (1, "--ctx"),
    "-c": (1, "--ctx"),
    "--parallel": (1, "--slots"),
    "-np": (1, "--slots"),
    # llama-server evaluates a prompt n_batch tokens at a time (its progress events follow
    # them): minfer's prefill chunk. Its physical micro-batch has no counterpart.
    "--batch-size": (1, "--ubatch"),
    "-b": (1, "--ubatch"),
    "--ubatch-size": (1, None),
    "--n-predict": (1, "--n-predict"),
    "-n": (1, "--n-predict"),
    "--api-key": (1, "--api-key"),
    "--cors-origins": (1, "--cors-origins"),
    "--slot-save-path": (1, "--slot-save-path"),
    "--chat-template": (1, None),  # a built-in template's name: handled below
    "--chat-template-file": (1, "--chat-template"),
    "--context-shift": (0, "--context-shift"),
    "--no-slots": (0, "--no-slots-endpoint"),
    "--embedding": (0, None),  # minfer always serves embeddings
    "--embeddings": (0, None),
    "--pooling": (1, "--pooling"),
    # No effect on what minfer answers.
    "--n-gpu-layers": (1, None),
    "-ngl": (1, None),
    "-fa": (1, None),
    "--cont-batching": (0, None),
    "--no-cont-batching": (0, None),
    "--kv-unified": (0, None),
    "--swa-full": (0, None),
    "--slots": (0, None),
    "--metrics": (0, None),  # handled below: without it, --no-metrics
    "--tools": (1, None),  # handled below: it narrows the default CORS origins to localhost
    "--no-ui": (0, "--no-ui"),
    "--jinja": (0, None),
    "--no-jinja": (0, None),
    "--offline": (0, None),
    "--verbose": (0, "--verbose"),
    "--no-warmup": (0, None),
    # The model: replaced by $COMPAT_MODEL.
    "--model": (1, None),
    "-m": (1, None),
    "--hf-repo": (1, None),
    "-hf": (1, None),
    "--hf-file": (1, None),
    "--model-url": (1, None),
}
CACHE_TYPES = {"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"}


def minfer_args(argv: list[str], model: str) -> list[str]:
    # The suite stops every server with SIGTERM and kills it 5 s later: no drain.
    # llama-server continues a conversation that ends with an assistant message.
    out = ["serve", "--model", model, "--drain-timeout", "0", "--prefill-assistant"]
    cache_types = set()
    if "--metrics" not in argv:
        out.append("--no-metrics")
    if "--tools" in argv and "--cors-origins" not in argv:
        out += ["--cors-origins", "localhost"]
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--chat-template":
            # llama-server's built-in templates by name (or, with --jinja, Jinja text): minfer
            # takes a template file.
            if os.path.isfile(argv[i + 1]) or argv[i + 1] in ("chatml", "llama3", "command-r"):
                out += ["--chat-template", argv[i + 1]]
            else:
                print(f"llama_server_shim: dropped --chat-template {argv[i + 1]!r}: minfer has no built-in templates by name", file=sys.stderr)
            i += 2
            continue
        if flag in CACHE_TYPES:
            cache_types.add(argv[i + 1])
            i += 2
            continue
        if flag not in MAP:
            print(f"llama_server_shim: dropped a flag minfer has no counterpart for: {flag}", file=sys.stderr)
            i += 1
            # Its value, if it has one, goes with it.
            if i < len(argv) and not argv[i].startswith("-"):
                i += 1
            continue
        n, target = MAP[flag]
        values = argv[i + 1 : i + 1 + n]
        i += 1 + n
        if target is not None:
            out += [target, *values]
    if len(cache_types) == 1:
        out += ["--cache-type", cache_types.pop()]
    elif cache_types:
        print(f"llama_server_shim: K and V cache types differ ({sorted(cache_types)}); minfer has one", file=sys.stderr)
    return out


def llama_server_args(argv: list[str], model: str) -> list[str]:
    out = ["--model", model]
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in ("--model", "-m", "--hf-repo", "-hf", "--hf-file", "--model-url"):
            i += 2
            continue
        out.append(flag)
        i += 1
    return out


def main() -> None:
    model = os.environ.get("COMPAT_MODEL")
    if not model:
        sys.exit("llama_server_shim: set COMPAT_MODEL to the GGUF the suite runs against")
    argv = sys.argv[1:]
    target = os.environ.get("COMPAT_TARGET", "minfer")
    if target == "minfer":
        binary = os.environ.get("MINFER_BIN", "minfer")
        args = minfer_args(argv, model)
    elif target == "llama-server":
        binary = os.environ["LLAMA_SERVER_REAL"]
        args = llama_server_args(argv, model)
    else:
        sys.exit(f"llama_server_shim: COMPAT_TARGET is minfer or llama-server, not {target}")
    print(f"llama_server_shim: {binary} {' '.join(args)}", file=sys.stderr)
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
