#!/usr/bin/env python3
"""Generate qwen3-tiny.gguf, minfer's small Qwen3-architecture test model (random weights, deterministic).

Usage: make_qwen3_tiny.py QWEN2.5-0.5B.gguf OUT.gguf

Why it exists: no Qwen3 weights can be fetched here, and a Qwen3 file derived from Qwen2.5 weights is
numerically chaotic, so it is no parity target. This model is small and well-conditioned and exercises
what Qwen3 adds over Qwen2: arch `qwen3`, no attention biases, per-head q/k RMSNorm weights, a head dim
(128) decoupled from n_embd / n_head (64), tied output (no output.weight), and seven weight types
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16). Tokenizer, special tokens and chat template are copied from
the Qwen2.5 file given as input.

It must reproduce shared/fixtures/qwen3-tiny.gguf byte for byte (sha256 071aa994...2fc30): the seed, the
order in which random numbers are drawn, the metadata order and the tensor order are all part of the
format. scripts/fetch_models.sh runs it in a venv with the gguf and numpy versions that do so.
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

SEED = 20261129
ARCH = "qwen3"
N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 4, 256, 4, 2, 128, 768

HPARAMS = [  # (key, writer method, value), in file order
    ("general.name", "add_string", "minfer qwen3-tiny test model (random weights)"),
    (f"{ARCH}.block_count", "add_uint32", N_LAYER),
    (f"{ARCH}.context_length", "add_uint32", 4096),
    (f"{ARCH}.embedding_length", "add_uint32", N_EMBD),
    (f"{ARCH}.feed_forward_length", "add_uint32", N_FF),
    (f"{ARCH}.attention.head_count", "add_uint32", N_HEAD),
    (f"{ARCH}.attention.head_count_kv", "add_uint32", N_HEAD_KV),
    (f"{ARCH}.attention.key_length", "add_uint32", HEAD_DIM),
    (f"{ARCH}.attention.value_length", "add_uint32", HEAD_DIM),
    (f"{ARCH}.rope.freq_base", "add_float32", 1000000.0),
    (f"{ARCH}.attention.layer_norm_rms_epsilon", "add_float32", 1e-6),
]

# Per layer, in file order: (tensor, kind, type). kind "norm" = 1 + std * N(0, 1) over `dim` (F32);
# kind "mat" = std * N(0, 1) of shape (rows = out, cols = in), i.e. GGUF dims [in, out].
Q_DIM, KV_DIM = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
LAYER = [
    ("attn_norm", ("norm", N_EMBD, 0.1), Q.F32),
    ("attn_q", ("mat", Q_DIM, N_EMBD, 0.08), Q.Q4_0),
    ("attn_k", ("mat", KV_DIM, N_EMBD, 0.08), Q.Q4_1),
    ("attn_v", ("mat", KV_DIM, N_EMBD, 0.08), Q.Q5_0),
    ("attn_q_norm", ("norm", HEAD_DIM, 0.2), Q.F32),
    ("attn_k_norm", ("norm", HEAD_DIM, 0.2), Q.F32),
    ("attn_output", ("mat", N_EMBD, Q_DIM, 0.01), Q.Q5_1),
    ("ffn_norm", ("norm", N_EMBD, 0.1), Q.F32),
    ("ffn_gate", ("mat", N_FF, N_EMBD, 0.06), Q.F16),
    ("ffn_up", ("mat", N_FF, N_EMBD, 0.06), Q.BF16),
    ("ffn_down", ("mat", N_EMBD, N_FF, 0.01), Q.Q8_0),
]


def kv_value(field):
    """The value of a GGUFReader field, as GGUFWriter.add_key_value takes it."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def generate(src, dst):
    reader = GGUFReader(src)
    rng = np.random.default_rng(SEED)
    writer = GGUFWriter(dst, ARCH, use_temp_file=False)

    for key, method, value in HPARAMS:
        getattr(writer, method)(key, value)
    for key, field in reader.fields.items():  # the tokenizer, in the source file's order
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            if vtype == GGUFValueType.ARRAY:
                writer.add_key_value(key, kv_value(field), vtype, sub_type=field.types[-1])
            else:
                writer.add_key_value(key, kv_value(field), vtype)
    n_vocab = len(kv_value(reader.fields["tokenizer.ggml.tokens"]))

    def draw(spec):
        if spec[0] == "norm":
            _, dim, std = spec
            return (1.0 + std * rng.standard_normal(dim)).astype(np.float32)
        _, rows, cols, std = spec
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def add(name, data, qtype):
        if qtype == Q.F32:
            writer.add_tensor(name, data)
        elif qtype == Q.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    add("token_embd.weight", draw(("mat", n_vocab, N_EMBD, 0.15)), Q.Q4_0)
    add("output_norm.weight", draw(("norm", N_EMBD, 0.1)), Q.F32)
    for il in range(N_LAYER):
        for name, spec, qtype in LAYER:
            add(f"blk.{il}.{name}.weight", draw(spec), qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    generate(sys.argv[1], sys.argv[2])
