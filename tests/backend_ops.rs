//! Op conformance of every backend, after ggml's `test-backend-ops`: one table of cases
//! (op × shape × type), each run as a one-node split on every backend in [`backends`] through
//! the [`BackendImpl`] API only (`alloc_buffer`, `set_tensor` of the inputs, `load_weights`,
//! `compute`, `get_tensor` of the result), and compared with a reference computed on host
//! vectors by the scalar kernels called directly.
//!
//! ```text
//! cargo test --release --test backend_ops                      # everything
//! cargo test --release --test backend_ops -- --list            # the cases, one per line
//! cargo test --release --test backend_ops -- mul_mat/Q4_K      # cases whose name contains it
//! cargo test --release --test backend_ops -- --backend cpu     # one backend only
//! ```
//!
//! (`harness = false` in Cargo.toml: this file is its own `main`.) Exit status 1 when any
//! check fails (one line per failure with the reason), 2 on a bad command line.
//!
//! # Backends and how they are judged
//!
//! [`backends`] is the one list: the CPU backend (default ISA, 2 workers) and the test backend
//! of `tests/support/test_backend.rs` (claims every node the CPU kernels implement, runs them
//! with `KernelIsa::Scalar` here, keeps its buffers behind the API). A backend whose `supports_node`
//! refuses a case's node is *skipped* for it (counted as skipped, not passed).
//!
//! A backend is either **bit-exact** (`Exactness::Bits`): every value must equal the reference
//! bit for bit. That is the design's promise for the CPU and the test backend: the element-wise,
//! norm, rope, softmax and attention kernels' SIMD paths are bit-identical to their scalar
//! twins (`kernels::Isa`). **Except the matrix product**: the quantized dots of
//! `quants::simd` mirror ggml's x86 kernels, whose f32 summation order is not that of the
//! scalar (ggml generic) dots, so `mul_mat` is bitwise against `matmul_with_isa` at the
//! backend's *own* dot ISA (the CPU: `active_isa()`; the test backend: `Scalar`), and the CPU is
//! in addition held to the `mul_mat` tolerance against the scalar reference. Only the
//! repacked Q4_0/Q4_K gemv (rows a multiple of 8) is bitwise across ISAs.
//!
//! Or it is held to **tolerances** (`Exactness::Tolerance`: the CUDA backend, on the GPU as
//! `cuda` and on the host emulator of `tests/support/cuda_emu.rs` as `cuda-emu`, with the cuda
//! feature; `--tolerances`
//! judges every backend so): the op's tolerance in the table against the scalar reference,
//! ggml-style normalized mean squared error `NMSE = Σ(got-want)² / Σwant²` over the output (KV
//! rows decoded to f32 first), or bitwise where any correct implementation gives the same bits
//! (IEEE single roundings, copies). KV regions an op must not touch (attention's K and V, the
//! K-shift's and the load's V) are bitwise for every backend.
//!
//! # The table
//!
//! | op (`Op::name`) | cases | reference (host vectors) | bit-exact backends | tolerance otherwise |
//! |---|---|---|---|---|
//! | `add`, `mul` | d 896 × nt 1/2/7/32/512, d 67 × nt 1/7 | `kernels::add` / `mul` | bitwise | bitwise |
//! | `silu` | as `add`, + in place (out = src 0) ×2 | `silu_with(Isa::Scalar)` | bitwise | NMSE 1e-7 |
//! | `swiglu` (fused) | as `add` | `swiglu_with(Isa::Scalar)` | bitwise | NMSE 1e-7 |
//! | `geglu` (fused) | as `add` | `kernels::geglu` (ggml's f16 GELU table) | bitwise | NMSE 1e-6 |
//! | `gelu`, `scale` (×0.0625, ×25.298221) | as `silu` | `kernels::gelu`; `x * s` | bitwise | gelu NMSE 1e-6, scale bitwise |
//! | `rms_norm` | weighted d 896 × nt 1/2/7/32/512 + d 67; unweighted nt 1/7 | `kernels::rms_norm` | bitwise | NMSE 1e-7 |
//! | `qk_norm` | hd 64 × 4 heads × nt 1/7; hd 128 × 2 heads × nt 1/2/7/32/512; hd 256 × 4 heads × nt 1/7 | `kernels::qk_norm` | bitwise | NMSE 1e-7 |
//! | `mul_mat` | all 13 `GgmlType::WEIGHT_TYPES` × {k 256, m 48 × nt 1/2/7/32/512; k = 3 blocks (130 for floats), m 37, + bias × nt 1/7}; Qwen2.5-0.5B shapes Q4_K/Q6_K 4864→896, Q5_0 896→4864, Q8_0 896→128 + bias | `matmul_with_isa` at the backend's dot ISA (bitwise) and at `Scalar` (tolerance) | bitwise at its own dot ISA | NMSE 5e-4 |
//! | `get_rows` (embedding) | all 13 weight types, n_embd 256 × nt 1/7/512 | `kernels::get_rows` | bitwise | NMSE 1e-7 |
//! | `get_rows` (tail rows) | d 896: 1 of 7, 2 of 32, 1 of 512 rows | `kernels::select_rows` | bitwise | bitwise |
//! | `rope` | NORM and NEOX × hd 64 (4 heads) / 128 (2 heads) × n_rot full/half × nt 1/2/7/32 (+512 NEOX full, NORM half); 14 heads hd 64; NEOX hd 256 (bases 1e4, 1e6); in place ×2 | `kernels::rope_ext` | bitwise | NMSE 1e-6 |
//! | `attn` | KV f32/f16/q8_0 × hd 64/128 × nt 1/2/7/32, heads 4:2; 14:2 hd 64 × nt 1/7; 2:2; nt 512 (f32 hd 64, q8_0 hd 128); long context n_ctx 1100 × (hd 64 nt 1, hd 128 nt 2) for each KV type; heads 4:1 hd 256 (full, window 20, window 512 at n_ctx 1100); sliding windows 5, 1, 70, 300 and 100 (nt 512) | f32: `attention_with(Isa::Scalar)`; f16: the same on the decoded cells; q8_0: `attention_q8` (no scalar entry point), or with `MINFER_NO_FUSED_Q8_KV=1` the scalar f32 path on the decoded, rotated cells | bitwise (+ K, V untouched) | NMSE 5e-4 |
//! | `kv_store` | KV f32/f16/q8_0 × hd 64/128 × nt 1/2/7/32 (+512 f32, q8_0), 2 KV heads, scattered cells | `kv_store_typed` | bitwise (K and V) | f32/f16 bitwise, q8_0 NMSE 1e-6 |
//! | `kv_load` | KV f32/f16/q8_0 × hd 64/128 | the region as written | bitwise | bitwise |
//! | `kv_shift` | KV f32/f16/q8_0 × NORM/NEOX × hd 64/128 × n_rot full/half, a quarter of the deltas 0 | `decode_row` + `rope_ext` + `encode_row` per moved cell | bitwise (+ V untouched) | f32/f16 NMSE 1e-6, q8_0 NMSE 1e-4 |
//!
//! Every reference is a scalar kernel of `backends::cpu::kernels` called on host vectors, except
//! the fused q8_0 attention read (`attention_q8` picks `Isa::detected()` itself). Where the CPU
//! takes another route the reference takes the general one, so the pairing is checked too: the
//! K-shift's NEOX full rotation (CPU: `RopeCache::new`; reference: `rope_ext`), the f16
//! attention (CPU: `attention_dequantized`; reference: decode every cell, then
//! `attention_with(Scalar)`). Positions stay below ~700 so that a backend computing `theta`
//! per pair (`powf`) rather than iteratively stays inside 1e-6.
//!
//! Each case's data comes from a fixed seed (its name), so a failure reproduces alone. Outputs
//! are NaN-filled before the run (a value never written cannot pass for a zero), the inputs sit
//! at aligned offsets of one compute buffer (the KV regions in two KV buffers), and every
//! buffer is freed after the case: a backend whose `bytes_in_use` does not return fails it.
//!
//! # Coverage guards (cases of their own, backend-independent)
//!
//! * `coverage/op_examples`: every `Op::examples()` variant but `Input` has a case.
//! * `coverage/model_graphs`: the graphs the model builders emit (forward passes for 1 and 7
//!   tokens and the K-shift graph, for every KV type, after backend assignment and the fusion
//!   pass, so `swiglu` is there) for the test models in `$MINFER_MODEL_DIR` (else
//!   `<repo>/models`): every op they contain has a case, and so does every (weight type, bias),
//!   (KV type, head size), (RoPE style, head size, partial), (norm weighted or not) they use.
//!   Without the model files it is reported as skipped and only `coverage/op_examples` guards.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use minfer::backends::cpu::CpuBackend;
use minfer::backends::cpu::exec::KernelIsa;
use minfer::backends::cpu::kernels::attention_q8::{PackedKv, attention_q8};
use minfer::backends::cpu::kernels::hadamard::rotate_heads;
use minfer::backends::cpu::kernels::kv_cache::{decode_row, encode_row, kv_store_typed, load_rows};
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul_with_isa};
use minfer::backends::cpu::kernels::{self, AttnArgs, Isa, RopeMode, RopeSpec};
use minfer::gguf::GgufFile;
use minfer::graph::{
    AttnMeta, Backend, BackendImpl, BackendScheduler, BufferId, BufferUsage, CNode, CParams, ComputeGraph, DType,
    FusionPass, GraphBuilder, GraphParams, GraphType, KvPair, KvType, KvcacheMeta, NodeId, NodeMeta, NodeWork, Op,
    RoPEMeta, RopeStyle, SplitWork, TensorRef, WeightStore,
};
use minfer::quants::GgmlType;
use minfer::quants::simd::{Isa as DotIsa, active_isa};
use minfer::workers::Pool;

#[allow(dead_code)]
#[path = "common/gguf_bytes.rs"]
mod gguf_bytes;
#[path = "matmul_gen.rs"]
mod generate;
#[path = "support/test_backend.rs"]
mod test_backend;
#[cfg(feature = "cuda")]
#[path = "support/cuda_emu.rs"]
mod cuda_emu;

use generate::Rng;

// ---------------------------------------------------------------------------------------------
// Backends under test
// ---------------------------------------------------------------------------------------------

/// How a backend's results are judged.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Exactness {
    /// Bit-exact with the kernels: every value equals the reference bit for bit, the matrix
    /// product's reference being `matmul_with_isa` at `dot` (the backend's dot-product ISA).
    Bits { dot: DotIsa },
    /// Held to each op's tolerance against the scalar reference.
    Tolerance,
}

/// A backend in the list: its name (for `--backend` and the report), the handle its tensors
/// carry (`BackendImpl` has no method that says it), how it is judged, and the implementation.
struct BackendUnderTest {
    name: String,
    handle: Backend,
    exact: Exactness,
    imp: Box<dyn BackendImpl>,
    /// Cases whose [`Spec::work`] exceeds this are skipped on this backend (an emulator).
    max_work: Option<u64>,
}

/// The backends every case runs on, CPU first. **The one place to add a backend** (a CUDA
/// backend: `Exactness::Tolerance`, handle `Backend::CUDA`).
fn backends() -> Result<Vec<BackendUnderTest>, String> {
    let pool = Arc::new(Pool::new(2).map_err(|e| format!("worker pool: {e}"))?);
    // The dot-product ISA a KernelIsa runs the matrix products with.
    let dots = |isa: KernelIsa| match isa {
        KernelIsa::Detected => active_isa(),
        KernelIsa::Scalar => DotIsa::Scalar,
    };
    let test = test_backend::TestBackend::new::<test_backend::Everything>(Backend::METAL, pool.clone()).with_isa(KernelIsa::Scalar);
    let list = vec![
        BackendUnderTest {
            name: "cpu".into(),
            handle: Backend::CPU,
            // The quantized dots of the detected ISA mirror ggml's x86 kernels, not the scalar
            // (generic) ones: bitwise against the same ISA.
            exact: Exactness::Bits { dot: dots(KernelIsa::Detected) },
            imp: Box::new(CpuBackend::with_pool(pool.clone())),
            max_work: None,
        },
        BackendUnderTest {
            // Claims every node the CPU kernels implement and runs them with the scalar kernels
            // (KernelIsa::Scalar: the CPU covers the detected ISA), its buffers behind the API
            // (tests/support/test_backend.rs). The METAL handle is a stand-in: it only has to
            // differ from the CPU's.
            name: "test".into(),
            handle: Backend::METAL,
            exact: Exactness::Bits { dot: dots(test.isa()) },
            imp: Box::new(test),
            max_work: None,
        },
    ];
    #[cfg(feature = "cuda")]
    let list = with_cuda(list);
    Ok(list)
}

/// The CUDA executor, with the cuda feature: on the host emulator (`cuda-emu`, where g++ and
/// x86-64 allow) and on the GPU (`cuda`, where the probe finds one). Both are held to the
/// tolerances. The emulator runs every fiber on one core, so it takes the cases up to
/// [`EMU_MAX_WORK`] (see [`Spec::work`]); the GPU takes them all.
#[cfg(feature = "cuda")]
fn with_cuda(mut list: Vec<BackendUnderTest>) -> Vec<BackendUnderTest> {
    use minfer::backends::cuda::{self, CudaBackend};
    match cuda_emu::EmuDevice::new() {
        Ok(dev) => list.push(BackendUnderTest {
            name: "cuda-emu".into(),
            handle: Backend::CUDA,
            exact: Exactness::Tolerance,
            imp: Box::new(CudaBackend::new(Box::new(dev), None)),
            max_work: Some(EMU_MAX_WORK),
        }),
        Err(e) => eprintln!("backend_ops: no cuda-emu backend: {e}"),
    }
    match cuda::probe().map_err(|u| u.reason).and_then(|_| cuda::driver_device::DriverDevice::open().map_err(|e| e.to_string())) {
        Ok(dev) => list.push(BackendUnderTest {
            name: "cuda".into(),
            handle: Backend::CUDA,
            exact: Exactness::Tolerance,
            imp: Box::new(CudaBackend::new(Box::new(dev), None)),
            max_work: None,
        }),
        Err(e) => eprintln!("backend_ops: no cuda backend: {e}"),
    }
    list
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/// How a non-exact backend's output is judged (exact backends are always bitwise).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tol {
    Bitwise,
    Nmse(f64),
}

impl std::fmt::Display for Tol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tol::Bitwise => f.write_str("bitwise"),
            Tol::Nmse(e) => write!(f, "NMSE {e:e}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Binary {
    Add,
    Mul,
    SwiGLU,
    GeGLU,
}

/// The one-operand element-wise ops.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Unary {
    Silu,
    Gelu,
    /// Times 0.0625 (Gemma's query scale) or 25.3 (an embedding scale): the case name says.
    Scale(f32),
}

/// One case's op and shape.
#[derive(Debug, Clone)]
enum Spec {
    Binary { op: Binary, d: usize, nt: usize },
    Unary { op: Unary, d: usize, nt: usize, inplace: bool },
    RmsNorm { d: usize, nt: usize, weighted: bool },
    QkNorm { hd: usize, nh: usize, nt: usize },
    MatMul { ty: GgmlType, k: usize, m: usize, nt: usize, bias: bool },
    Embed { ty: GgmlType, n_embd: usize, n_vocab: usize, nt: usize },
    TailRows { d: usize, nt: usize, n_out: usize },
    Rope { style: RopeStyle, n_head: usize, hd: usize, n_rot: usize, nt: usize, freq_base: f32, inplace: bool },
    Attn { kv: KvType, n_head: usize, n_head_kv: usize, hd: usize, nt: usize, n_ctx: usize, window: Option<usize> },
    /// Attention over regions several sequences share (4 query heads on 2 KV heads): sequence
    /// `s` owns cells `s * n_ctx..`, and has `lens[s]` tokens in the pass.
    AttnSeqs { kv: KvType, hd: usize, n_ctx: usize, lens: [usize; 3] },
    KvStore { kv: KvType, n_head_kv: usize, hd: usize, nt: usize, n_ctx: usize },
    KvLoad { kv: KvType, n_head_kv: usize, hd: usize, n_ctx: usize },
    KvShift { kv: KvType, style: RopeStyle, n_head_kv: usize, hd: usize, n_rot: usize, n_ctx: usize },
}

/// The CUDA host emulator's cost budget, in [`Spec::work`] units (about a fiber step each).
#[cfg(feature = "cuda")]
const EMU_MAX_WORK: u64 = 20_000_000;

impl Spec {
    /// A rough count of the emulated thread steps a case takes on the CUDA kernels (threads
    /// times their loop trips), for the emulator's budget.
    fn work(&self) -> u64 {
        let w = |x: usize| x as u64;
        match *self {
            Spec::Binary { d, nt, .. } | Spec::Unary { d, nt, .. } => w(d * nt),
            Spec::RmsNorm { d, nt, .. } => w(nt * 256 * (d / 256 + 8)),
            Spec::QkNorm { hd, nh, nt } => w(nt * nh * 256 * (hd / 256 + 8)),
            Spec::MatMul { k, m, nt, .. } => w(m * nt * 32 * (k / 32 + 6)),
            Spec::Embed { n_embd, nt, .. } => w(nt * 256 * (n_embd / 256 + 1)),
            Spec::TailRows { d, n_out, .. } => w(n_out * 256 * (d / 256 + 1)),
            Spec::Rope { n_head, hd, nt, .. } => w(nt * n_head * hd),
            Spec::Attn { n_head, hd, nt, n_ctx, .. } => w(nt * n_head * 32 * n_ctx * (2 * hd / 32 + 6)),
            Spec::AttnSeqs { hd, n_ctx, lens, .. } => w(lens.iter().sum::<usize>() * 4 * 32 * n_ctx * (2 * hd / 32 + 6)),
            Spec::KvStore { n_head_kv, hd, nt, .. } => w(nt * n_head_kv * hd),
            Spec::KvLoad { .. } => 0,
            Spec::KvShift { n_head_kv, hd, n_ctx, .. } => w(n_ctx * n_head_kv * hd * 4),
        }
    }
}

/// A backend-independent check.
#[derive(Debug, Clone, Copy)]
enum Guard {
    OpExamples,
    ModelGraphs,
}

enum CaseKind {
    Op { spec: Spec, tol: Tol },
    Guard(Guard),
}

struct Case {
    name: String,
    kind: CaseKind,
}

const TOKENS: [usize; 5] = [1, 2, 7, 32, 512];
const KV_TYPES: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];
const STYLES: [RopeStyle; 2] = [RopeStyle::Interleaved, RopeStyle::NonInterleaved];

fn style_name(s: RopeStyle) -> &'static str {
    match s {
        RopeStyle::Interleaved => "norm",
        RopeStyle::NonInterleaved => "neox",
    }
}

/// Row length of the second matmul shape: three blocks of the type (odd), 130 for floats.
fn odd_k(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 130,
        b => 3 * b,
    }
}

/// Every case, in a fixed order.
fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    let mut op = |name: String, spec: Spec, tol: Tol| v.push(Case { name, kind: CaseKind::Op { spec, tol } });

    // ---- element-wise ----
    let ew_shapes: Vec<(usize, usize)> = TOKENS.iter().map(|&nt| (896, nt)).chain([(67, 1), (67, 7)]).collect();
    for (bop, name, tol) in [
        (Binary::Add, "add", Tol::Bitwise),
        (Binary::Mul, "mul", Tol::Bitwise),
        (Binary::SwiGLU, "swiglu", Tol::Nmse(1e-7)),
        (Binary::GeGLU, "geglu", Tol::Nmse(1e-6)),
    ] {
        for &(d, nt) in &ew_shapes {
            op(format!("{name}/d={d}/nt={nt}"), Spec::Binary { op: bop, d, nt }, tol);
        }
    }
    // gelu: the f16 table; another implementation may round a rare entry to the next f16.
    for (uop, name, tol) in [
        (Unary::Silu, "silu", Tol::Nmse(1e-7)),
        (Unary::Gelu, "gelu", Tol::Nmse(1e-6)),
        (Unary::Scale(0.0625), "scale=0.0625", Tol::Bitwise),
        (Unary::Scale(25.298221), "scale=25.298221", Tol::Bitwise),
    ] {
        for &(d, nt) in &ew_shapes {
            op(format!("{name}/d={d}/nt={nt}"), Spec::Unary { op: uop, d, nt, inplace: false }, tol);
        }
        for (d, nt) in [(896, 7), (67, 2)] {
            op(format!("{name}/inplace/d={d}/nt={nt}"), Spec::Unary { op: uop, d, nt, inplace: true }, tol);
        }
    }

    // ---- norms ----
    for &(d, nt) in &ew_shapes[..6] {
        op(format!("rms_norm/weighted/d={d}/nt={nt}"), Spec::RmsNorm { d, nt, weighted: true }, Tol::Nmse(1e-7));
    }
    for nt in [1, 7] {
        op(format!("rms_norm/plain/d=896/nt={nt}"), Spec::RmsNorm { d: 896, nt, weighted: false }, Tol::Nmse(1e-7));
    }
    for nt in [1, 7] {
        op(format!("qk_norm/hd=64/nh=4/nt={nt}"), Spec::QkNorm { hd: 64, nh: 4, nt }, Tol::Nmse(1e-7));
    }
    for nt in TOKENS {
        op(format!("qk_norm/hd=128/nh=2/nt={nt}"), Spec::QkNorm { hd: 128, nh: 2, nt }, Tol::Nmse(1e-7));
    }
    // Gemma-3's heads (256 values).
    for nt in [1, 7] {
        op(format!("qk_norm/hd=256/nh=4/nt={nt}"), Spec::QkNorm { hd: 256, nh: 4, nt }, Tol::Nmse(1e-7));
    }

    // ---- matmul: every weight type ----
    for ty in GgmlType::WEIGHT_TYPES {
        for nt in TOKENS {
            op(format!("mul_mat/{ty}/k=256,m=48/nt={nt}"), Spec::MatMul { ty, k: 256, m: 48, nt, bias: false }, Tol::Nmse(5e-4));
        }
        let k = odd_k(ty);
        for nt in [1, 7] {
            op(format!("mul_mat/{ty}/k={k},m=37,bias/nt={nt}"), Spec::MatMul { ty, k, m: 37, nt, bias: true }, Tol::Nmse(5e-4));
        }
    }

    // Model-shaped (Qwen2.5-0.5B's types and sizes): ffn_down Q4_K/Q6_K, ffn_gate Q5_0,
    // attn_k Q8_0 + bias.
    for (ty, k, m, bias, nts) in [
        (GgmlType::Q4K, 4864, 896, false, &[1, 7][..]),
        (GgmlType::Q6K, 4864, 896, false, &[1][..]),
        (GgmlType::Q5_0, 896, 4864, false, &[1, 7][..]),
        (GgmlType::Q8_0, 896, 128, true, &[7][..]),
    ] {
        for &nt in nts {
            let b = if bias { ",bias" } else { "" };
            op(format!("mul_mat/{ty}/k={k},m={m}{b}/nt={nt}"), Spec::MatMul { ty, k, m, nt, bias }, Tol::Nmse(5e-4));
        }
    }

    // ---- row gathers ----
    for ty in GgmlType::WEIGHT_TYPES {
        for nt in [1, 7, 512] {
            op(format!("get_rows/embed/{ty}/n_embd=256/nt={nt}"), Spec::Embed { ty, n_embd: 256, n_vocab: 40, nt }, Tol::Nmse(1e-7));
        }
    }
    for (nt, n_out) in [(7, 1), (32, 2), (512, 1)] {
        op(format!("get_rows/tail/d=896/nt={nt},n_out={n_out}"), Spec::TailRows { d: 896, nt, n_out }, Tol::Bitwise);
    }

    // ---- rope ----
    for style in STYLES {
        for hd in [64, 128] {
            let (n_head, freq_base) = if hd == 64 { (4, 10000.0) } else { (2, 1_000_000.0) };
            for n_rot in [hd, hd / 2] {
                let part = if n_rot == hd { "full" } else { "partial" };
                let mut nts = vec![1, 2, 7, 32];
                if hd == 128 && (n_rot == hd) == (style == RopeStyle::NonInterleaved) {
                    nts.push(512); // neox full and norm partial
                }
                for nt in nts {
                    let spec = Spec::Rope { style, n_head, hd, n_rot, nt, freq_base, inplace: false };
                    op(format!("rope/{}/hd={hd},n_rot={n_rot}({part})/nh={n_head}/nt={nt}", style_name(style)), spec, Tol::Nmse(1e-6));
                }
            }
        }
    }
    let spec = Spec::Rope { style: RopeStyle::NonInterleaved, n_head: 14, hd: 64, n_rot: 64, nt: 7, freq_base: 1_000_000.0, inplace: false };
    op("rope/neox/hd=64,n_rot=64(full)/nh=14/nt=7".into(), spec, Tol::Nmse(1e-6));
    // Gemma-3: 256-value heads, the windowed layers' base and the global layers'.
    for (freq_base, nt) in [(10000.0, 7), (1_000_000.0, 2)] {
        let spec = Spec::Rope { style: RopeStyle::NonInterleaved, n_head: 4, hd: 256, n_rot: 256, nt, freq_base, inplace: false };
        op(format!("rope/neox/hd=256,n_rot=256(full)/nh=4/base={freq_base}/nt={nt}"), spec, Tol::Nmse(1e-6));
    }
    for (style, hd, n_rot, nt) in [(RopeStyle::NonInterleaved, 64, 64, 7), (RopeStyle::Interleaved, 128, 64, 2)] {
        let spec = Spec::Rope { style, n_head: 2, hd, n_rot, nt, freq_base: 10000.0, inplace: true };
        op(format!("rope/inplace/{}/hd={hd},n_rot={n_rot}/nh=2/nt={nt}", style_name(style)), spec, Tol::Nmse(1e-6));
    }

    // ---- attention and the KV cache ----
    for kv in KV_TYPES {
        for hd in [64, 128] {
            for nt in [1, 2, 7, 32] {
                let spec = Spec::Attn { kv, n_head: 4, n_head_kv: 2, hd, nt, n_ctx: 64, window: None };
                op(format!("attn/{kv}/hd={hd}/heads=4:2/nt={nt}"), spec, Tol::Nmse(5e-4));
            }
        }
    }
    // Qwen2.5-0.5B's heads (14 query heads share each of 2 KV heads).
    for kv in KV_TYPES {
        for nt in [1, 7] {
            let spec = Spec::Attn { kv, n_head: 14, n_head_kv: 2, hd: 64, nt, n_ctx: 64, window: None };
            op(format!("attn/{kv}/hd=64/heads=14:2/nt={nt}"), spec, Tol::Nmse(5e-4));
        }
    }
    // Long context, decode-sized batches: the cells span several of a split-KV kernel's splits.
    for kv in KV_TYPES {
        for (hd, nt) in [(64, 1), (128, 2)] {
            let spec = Spec::Attn { kv, n_head: 4, n_head_kv: 2, hd, nt, n_ctx: 1100, window: None };
            op(format!("attn/{kv}/hd={hd}/heads=4:2/n_ctx=1100/nt={nt}"), spec, Tol::Nmse(5e-4));
        }
    }
    // Three sequences in one pass: a prefill chunk, a decode token and a short chunk, each
    // attending only its own cells.
    for kv in KV_TYPES {
        for (hd, lens) in [(64, [5, 1, 3]), (128, [1, 1, 1])] {
            let spec = Spec::AttnSeqs { kv, hd, n_ctx: 80, lens };
            op(format!("attn_seqs/{kv}/hd={hd}/heads=4:2/lens={lens:?}"), spec, Tol::Nmse(5e-4));
        }
    }
    op("attn/f32/hd=64/heads=2:2/nt=7".into(), Spec::Attn { kv: KvType::F32, n_head: 2, n_head_kv: 2, hd: 64, nt: 7, n_ctx: 64, window: None }, Tol::Nmse(5e-4));
    for (kv, hd) in [(KvType::F32, 64), (KvType::Q8_0, 128)] {
        let spec = Spec::Attn { kv, n_head: 4, n_head_kv: 2, hd, nt: 512, n_ctx: 544, window: None };
        op(format!("attn/{kv}/hd={hd}/heads=4:2/nt=512"), spec, Tol::Nmse(5e-4));
    }
    // Gemma-3's heads (4 query heads on 1 KV head of 256 values), full and windowed.
    for kv in KV_TYPES {
        for (nt, window) in [(1, None), (7, None), (7, Some(20)), (2, Some(512))] {
            let n_ctx = if window == Some(512) { 1100 } else { 64 };
            let w = window.map_or(String::new(), |w| format!("/window={w}"));
            let spec = Spec::Attn { kv, n_head: 4, n_head_kv: 1, hd: 256, nt, n_ctx, window };
            op(format!("attn/{kv}/hd=256/heads=4:1/n_ctx={n_ctx}{w}/nt={nt}"), spec, Tol::Nmse(5e-4));
        }
    }
    // Sliding windows: narrower than the cells before the batch, 1 cell, across a 64-cell
    // boundary, and a prefill-sized batch over a long context.
    for kv in KV_TYPES {
        for (hd, nt, n_ctx, window) in [(64, 7, 64, 5), (64, 2, 64, 1), (128, 32, 200, 70), (64, 1, 1100, 300)] {
            let spec = Spec::Attn { kv, n_head: 4, n_head_kv: 2, hd, nt, n_ctx, window: Some(window) };
            op(format!("attn/{kv}/hd={hd}/heads=4:2/n_ctx={n_ctx}/window={window}/nt={nt}"), spec, Tol::Nmse(5e-4));
        }
    }
    let spec = Spec::Attn { kv: KvType::F32, n_head: 4, n_head_kv: 2, hd: 64, nt: 512, n_ctx: 544, window: Some(100) };
    op("attn/f32/hd=64/heads=4:2/window=100/nt=512".into(), spec, Tol::Nmse(5e-4));
    for kv in KV_TYPES {
        let tol = if kv == KvType::Q8_0 { Tol::Nmse(1e-6) } else { Tol::Bitwise };
        for hd in [64, 128] {
            for nt in [1, 2, 7, 32] {
                op(format!("kv_store/{kv}/hd={hd}/kv_heads=2/nt={nt}"), Spec::KvStore { kv, n_head_kv: 2, hd, nt, n_ctx: 64 }, tol);
            }
        }
        if kv != KvType::F16 {
            op(format!("kv_store/{kv}/hd=128/kv_heads=2/nt=512"), Spec::KvStore { kv, n_head_kv: 2, hd: 128, nt: 512, n_ctx: 600 }, tol);
        }
        op(format!("kv_store/{kv}/hd=256/kv_heads=1/nt=7"), Spec::KvStore { kv, n_head_kv: 1, hd: 256, nt: 7, n_ctx: 64 }, tol);
    }
    for kv in KV_TYPES {
        for hd in [64, 128] {
            op(format!("kv_load/{kv}/hd={hd}/kv_heads=2"), Spec::KvLoad { kv, n_head_kv: 2, hd, n_ctx: 16 }, Tol::Bitwise);
        }
        op(format!("kv_load/{kv}/hd=256/kv_heads=1"), Spec::KvLoad { kv, n_head_kv: 1, hd: 256, n_ctx: 16 }, Tol::Bitwise);
    }
    for kv in KV_TYPES {
        let tol = if kv == KvType::Q8_0 { Tol::Nmse(1e-4) } else { Tol::Nmse(1e-6) };
        for style in STYLES {
            for hd in [64, 128] {
                for n_rot in [hd, hd / 2] {
                    let part = if n_rot == hd { "full" } else { "partial" };
                    let spec = Spec::KvShift { kv, style, n_head_kv: 2, hd, n_rot, n_ctx: 32 };
                    op(format!("kv_shift/{kv}/{}/hd={hd},n_rot={n_rot}({part})/kv_heads=2", style_name(style)), spec, tol);
                }
            }
        }
        let spec = Spec::KvShift { kv, style: RopeStyle::NonInterleaved, n_head_kv: 1, hd: 256, n_rot: 256, n_ctx: 32 };
        op(format!("kv_shift/{kv}/neox/hd=256,n_rot=256(full)/kv_heads=1"), spec, tol);
    }

    v.push(Case { name: "coverage/op_examples".into(), kind: CaseKind::Guard(Guard::OpExamples) });
    v.push(Case { name: "coverage/model_graphs".into(), kind: CaseKind::Guard(Guard::ModelGraphs) });
    v
}

// ---------------------------------------------------------------------------------------------
// Case setup: the one-node graph, its input data, the KV regions, the weights
// ---------------------------------------------------------------------------------------------

/// Which region a result is read from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Region {
    /// The node's output.
    Out,
    K,
    V,
}

/// How a result's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    F32,
    /// `n_ctx` rows of a KV type.
    Kv { t: KvType, width: usize, hd: usize },
}

/// One region read back after the run.
#[derive(Debug, Clone, Copy)]
struct Seg {
    region: Region,
    kind: Kind,
    /// Must be left as it was: bitwise for every backend.
    unchanged: bool,
}

/// A layer's K and V regions before the run (as f32 words: a region always has an f32 view).
struct KvInit {
    t: KvType,
    width: usize,
    hd: usize,
    n_ctx: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvInit {
    /// Regions of `n_ctx` random rows, each encoded as the type stores it.
    fn random(rng: &mut Rng, t: KvType, width: usize, hd: usize, n_ctx: usize) -> KvInit {
        let mut region = || {
            let mut words = vec![0.0f32; t.region_len(width, n_ctx)];
            let rb = t.row_bytes(width);
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
            for cell in 0..n_ctx {
                let row: Vec<f32> = (0..width).map(|_| rng.normal()).collect();
                encode_row(t, hd, &row, &mut bytes[cell * rb..(cell + 1) * rb]).expect("encode a KV row");
            }
            words
        };
        let k = region();
        let v = region();
        KvInit { t, width, hd, n_ctx, k, v }
    }

    fn bytes(&self) -> usize {
        self.t.region_bytes(self.width, self.n_ctx)
    }
}

/// Everything a backend needs for one case, and what to read back.
struct Setup {
    graph: ComputeGraph,
    /// The node under test (the graph's last).
    node: NodeId,
    /// Host data of each input node.
    inputs: Vec<(NodeId, Vec<u8>)>,
    kv: Option<KvInit>,
    store: Option<Arc<WeightStore>>,
    /// The output region is `src[0]`'s (in place).
    inplace: bool,
    read: Vec<Seg>,
    /// [`Spec::work`] of the case.
    work: u64,
}

impl Setup {
    fn input(&self, name: &str) -> &[u8] {
        self.inputs
            .iter()
            .find(|(id, _)| self.graph.nodes[*id].name == name)
            .map(|(_, b)| b.as_slice())
            .unwrap_or_else(|| panic!("no input {name}"))
    }
    fn f32s(&self, name: &str) -> Vec<f32> {
        words(self.input(name)).into_iter().map(f32::from_bits).collect()
    }
    fn i32s(&self, name: &str) -> Vec<i32> {
        words(self.input(name)).into_iter().map(|w| w as i32).collect()
    }
    fn node(&self) -> &CNode {
        &self.graph.nodes[self.node]
    }
}

/// Little-endian 4-byte words of `b` (any alignment; a trailing partial word is dropped).
fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// `n` activations: normal at `scale`, with a few exact zeros and a signed zero.
fn acts(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
    if n > 8 {
        x[3] = 0.0;
        x[5] = -0.0;
    }
    x
}

/// A tiny GGUF image holding `tensors` (name, ggml dims, type, bytes), and its weight store.
fn weight_file(tensors: &[(&str, Vec<u64>, GgmlType, Vec<u8>)]) -> Arc<WeightStore> {
    let mut g = gguf_bytes::GgufBytes::default().kv_str("general.architecture", "backend-ops");
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in tensors {
        while data.len() % 32 != 0 {
            data.push(0);
        }
        g = g.tensor(name, dims, ty.id(), data.len() as u64);
        data.extend_from_slice(bytes);
    }
    let file = GgufFile::from_bytes(g.data(data).build()).expect("the test GGUF parses");
    Arc::new(WeightStore::new(Arc::new(file)).expect("the test GGUF indexes"))
}

fn f32_tensor(v: &[f32]) -> Vec<u8> {
    f32_bytes(v)
}

/// `n` distinct cells of `0..n_ctx` in a scattered order.
fn scattered_cells(rng: &mut Rng, n: usize, n_ctx: usize) -> Vec<i32> {
    let mut cells: Vec<i32> = (0..n_ctx as i32).collect();
    for i in (1..cells.len()).rev() {
        let j = rng.next_u32() as usize % (i + 1);
        cells.swap(i, j);
    }
    cells.truncate(n);
    cells
}

const EPS: f32 = 1e-6;

fn build(spec: &Spec, rng: &mut Rng) -> Setup {
    let mut b = GraphBuilder::new();
    let mut inputs: Vec<(NodeId, Vec<u8>)> = Vec::new();
    let mut kv = None;
    let mut store = None;
    let mut inplace = false;
    let out = Seg { region: Region::Out, kind: Kind::F32, unchanged: false };
    let mut read = vec![out];
    let e = |r: Result<NodeId, minfer::graph::GraphError>| r.expect("the builder accepts the case");
    let node = match *spec {
        Spec::Binary { op, d, nt } => {
            let x = b.input("a", [d, nt, 1, 1], DType::F32);
            let y = b.input("b", [d, nt, 1, 1], DType::F32);
            let gated = matches!(op, Binary::SwiGLU | Binary::GeGLU);
            let scale = if gated { 4.0 } else { 1.0 };
            let mut xa = acts(rng, d * nt, scale);
            if gated && xa.len() > 20 {
                xa[10] = -100.0;
                xa[11] = 100.0;
                xa[12] = -88.5;
            }
            inputs.push((x, f32_bytes(&xa)));
            inputs.push((y, f32_bytes(&acts(rng, d * nt, 1.0))));
            e(match op {
                Binary::Add => b.add(x, y),
                Binary::Mul => b.mul(x, y),
                Binary::SwiGLU => b.swiglu(x, y),
                Binary::GeGLU => b.geglu(x, y),
            })
        }
        Spec::Unary { op, d, nt, inplace: ip } => {
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let mut xa = acts(rng, d * nt, 4.0);
            if xa.len() > 20 {
                // The ends of the ranges: exp overflow, gelu's +-10 cut-offs.
                xa[10] = -100.0;
                xa[11] = 100.0;
                xa[12] = -88.5;
                xa[13] = -10.0;
                xa[14] = 10.0;
                xa[15] = 9.999;
            }
            inputs.push((x, f32_bytes(&xa)));
            inplace = ip;
            e(match op {
                Unary::Silu => b.silu(x),
                Unary::Gelu => b.gelu(x),
                Unary::Scale(f) => b.scale(x, f),
            })
        }
        Spec::RmsNorm { d, nt, weighted } => {
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let xa = acts(rng, d * nt, 3.0);
            inputs.push((x, f32_bytes(&xa)));
            b.set_layer(Some(0));
            if weighted {
                let w: Vec<f32> = (0..d).map(|_| 1.0 + rng.normal()).collect();
                let s = weight_file(&[("blk.0.attn_norm.weight", vec![d as u64], GgmlType::F32, f32_tensor(&w))]);
                let info = s.file().tensors()[0].clone();
                store = Some(s);
                e(b.rms_norm(x, Some(&info), EPS))
            } else {
                e(b.rms_norm(x, None, EPS))
            }
        }
        Spec::QkNorm { hd, nh, nt } => {
            let x = b.input("x", [hd * nh, nt, 1, 1], DType::F32);
            inputs.push((x, f32_bytes(&acts(rng, hd * nh * nt, 2.0))));
            let w: Vec<f32> = (0..hd).map(|_| 1.0 + rng.normal()).collect();
            let s = weight_file(&[("blk.0.attn_q_norm.weight", vec![hd as u64], GgmlType::F32, f32_tensor(&w))]);
            let info = s.file().tensors()[0].clone();
            store = Some(s);
            b.set_layer(Some(0));
            e(b.qk_norm(x, Some(&info), hd, nh, EPS))
        }
        Spec::MatMul { ty, k, m, nt, bias } => {
            let x = b.input("x", [k, nt, 1, 1], DType::F32);
            let xa: Vec<f32> = (0..nt).flat_map(|_| generate::activations(rng, k)).collect();
            inputs.push((x, f32_bytes(&xa)));
            let w: Vec<u8> = (0..m).flat_map(|_| generate::weight_row(rng, ty, k)).collect();
            let mut tensors = vec![("blk.0.ffn_up.weight", vec![k as u64, m as u64], ty, w)];
            if bias {
                let bv: Vec<f32> = (0..m).map(|_| rng.normal()).collect();
                tensors.push(("blk.0.ffn_up.bias", vec![m as u64], GgmlType::F32, f32_tensor(&bv)));
            }
            let s = weight_file(&tensors);
            let infos = s.file().tensors().to_vec();
            store = Some(s);
            e(b.matmul(x, &infos[0], infos.get(1)))
        }
        Spec::Embed { ty, n_embd, n_vocab, nt } => {
            let ids = b.input("token_ids", [nt, 1, 1, 1], DType::I32);
            let mut id: Vec<i32> = (0..nt).map(|_| (rng.next_u32() % n_vocab as u32) as i32).collect();
            id[0] = n_vocab as i32 - 1;
            if nt > 1 {
                id[1] = 0;
            }
            inputs.push((ids, i32_bytes(&id)));
            let w: Vec<u8> = (0..n_vocab).flat_map(|_| generate::weight_row(rng, ty, n_embd)).collect();
            let s = weight_file(&[("token_embd.weight", vec![n_embd as u64, n_vocab as u64], ty, w)]);
            let info = s.file().tensors()[0].clone();
            store = Some(s);
            e(b.embedding(ids, &info))
        }
        Spec::TailRows { d, nt, n_out } => {
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let ids = b.input("tail_ids", [n_out, 1, 1, 1], DType::I32);
            inputs.push((x, f32_bytes(&acts(rng, d * nt, 1.0))));
            let mut id: Vec<i32> = (0..n_out).map(|_| (rng.next_u32() % nt as u32) as i32).collect();
            id[n_out - 1] = nt as i32 - 1;
            inputs.push((ids, i32_bytes(&id)));
            e(b.get_rows(x, ids))
        }
        Spec::Rope { style, n_head, hd, n_rot, nt, freq_base, inplace: ip } => {
            let x = b.input("x", [n_head * hd, nt, 1, 1], DType::F32);
            let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
            inputs.push((x, f32_bytes(&acts(rng, n_head * hd * nt, 1.0))));
            // A batch at a random start; a lone token anywhere in 0..600.
            let p0 = (rng.next_u32() % 80) as i32;
            let p: Vec<i32> = match nt {
                1 => vec![(rng.next_u32() % 600) as i32],
                _ => (0..nt as i32).map(|t| p0 + t).collect(),
            };
            inputs.push((pos, i32_bytes(&p)));
            inplace = ip;
            e(b.rope(x, pos, style, RoPEMeta { n_head, head_dim: hd, n_rot, freq_base }))
        }
        Spec::Attn { kv: t, n_head, n_head_kv, hd, nt, n_ctx, window } => {
            let q = b.input("q", [n_head * hd, nt, 1, 1], DType::F32);
            let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
            inputs.push((q, f32_bytes(&acts(rng, n_head * hd * nt, 1.0))));
            // The batch sits mid-context: the first token sees a few cells, the last most.
            let p0 = ((n_ctx - nt) / 2) as i32;
            inputs.push((pos, i32_bytes(&(0..nt as i32).map(|t| p0 + t).collect::<Vec<_>>())));
            let width = n_head_kv * hd;
            kv = Some(KvInit::random(rng, t, width, hd, n_ctx));
            let view = b.kvcache_load(0, width, n_ctx, (t, hd));
            let meta = AttnMeta { layer: 0, n_head, n_head_kv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), n_ctx, kv_type: t, window };
            let kind = Kind::Kv { t, width, hd };
            read.push(Seg { region: Region::K, kind, unchanged: true });
            read.push(Seg { region: Region::V, kind, unchanged: true });
            e(b.attn(q, view, pos, meta))
        }
        Spec::AttnSeqs { kv: t, hd, n_ctx, lens } => {
            let (n_head, n_head_kv, nt) = (4, 2, lens.iter().sum::<usize>());
            let q = b.input("q", [n_head * hd, nt, 1, 1], DType::F32);
            let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
            let cells = b.input("kv_cells", [nt, 1, 1, 1], DType::I32);
            inputs.push((q, f32_bytes(&acts(rng, n_head * hd * nt, 1.0))));
            let (mut p, mut c) = (Vec::new(), Vec::new());
            for (s, &len) in lens.iter().enumerate() {
                let p0 = rng.next_u32() as usize % (n_ctx - len + 1);
                p.extend((p0..p0 + len).map(|x| x as i32));
                c.extend((p0..p0 + len).map(|x| (s * n_ctx + x) as i32));
            }
            inputs.push((pos, i32_bytes(&p)));
            inputs.push((cells, i32_bytes(&c)));
            let (width, total) = (n_head_kv * hd, lens.len() * n_ctx);
            kv = Some(KvInit::random(rng, t, width, hd, total));
            let view = b.kvcache_load(0, width, total, (t, hd));
            let meta = AttnMeta { layer: 0, n_head, n_head_kv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), n_ctx: total, kv_type: t, window: None };
            let kind = Kind::Kv { t, width, hd };
            read.push(Seg { region: Region::K, kind, unchanged: true });
            read.push(Seg { region: Region::V, kind, unchanged: true });
            e(b.attn_cells(q, view, pos, cells, meta))
        }
        Spec::KvStore { kv: t, n_head_kv, hd, nt, n_ctx } => {
            let width = n_head_kv * hd;
            let k = b.input("k", [width, nt, 1, 1], DType::F32);
            let v = b.input("v", [width, nt, 1, 1], DType::F32);
            let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
            inputs.push((k, f32_bytes(&acts(rng, width * nt, 1.0))));
            inputs.push((v, f32_bytes(&acts(rng, width * nt, 1.0))));
            inputs.push((pos, i32_bytes(&scattered_cells(rng, nt, n_ctx))));
            kv = Some(KvInit::random(rng, t, width, hd, n_ctx));
            let kind = Kind::Kv { t, width, hd };
            read = vec![Seg { region: Region::K, kind, unchanged: false }, Seg { region: Region::V, kind, unchanged: false }];
            e(b.kvcache_store(0, k, v, pos, n_ctx, (t, hd)))
        }
        Spec::KvLoad { kv: t, n_head_kv, hd, n_ctx } => {
            let width = n_head_kv * hd;
            kv = Some(KvInit::random(rng, t, width, hd, n_ctx));
            let kind = Kind::Kv { t, width, hd };
            read = vec![Seg { region: Region::K, kind, unchanged: false }, Seg { region: Region::V, kind, unchanged: true }];
            b.kvcache_load(0, width, n_ctx, (t, hd))
        }
        Spec::KvShift { kv: t, style, n_head_kv, hd, n_rot, n_ctx } => {
            let width = n_head_kv * hd;
            let deltas = b.input("kv_deltas", [n_ctx, 1, 1, 1], DType::I32);
            // A quarter of the cells stay (delta 0), the others move back or forth.
            let d: Vec<i32> = (0..n_ctx)
                .map(|_| match rng.next_u32() % 4 {
                    0 => 0,
                    1 => -((rng.next_u32() % 300) as i32) - 1,
                    _ => (rng.next_u32() % 300) as i32 + 1,
                })
                .collect();
            inputs.push((deltas, i32_bytes(&d)));
            kv = Some(KvInit::random(rng, t, width, hd, n_ctx));
            let rope = RoPEMeta { n_head: n_head_kv, head_dim: hd, n_rot, freq_base: 1_000_000.0 };
            let meta = KvcacheMeta { layer: 0, n_embd_kv: width, n_ctx, kv_type: t, head_dim: hd };
            let kind = Kind::Kv { t, width, hd };
            read = vec![Seg { region: Region::K, kind, unchanged: false }, Seg { region: Region::V, kind, unchanged: true }];
            b.set_layer(Some(0));
            e(b.kv_shift(0, deltas, rope, style, meta))
        }
    };
    let graph = b.build();
    Setup { work: spec.work(), graph, node, inputs, kv, store, inplace, read }
}

// ---------------------------------------------------------------------------------------------
// The reference: scalar kernels on host vectors
// ---------------------------------------------------------------------------------------------

fn rope_spec(style: RopeStyle, n_head: usize, head_dim: usize, n_rot: usize, freq_base: f32) -> RopeSpec {
    let mode = match style {
        RopeStyle::Interleaved => RopeMode::Normal,
        RopeStyle::NonInterleaved => RopeMode::Neox,
    };
    RopeSpec { mode, n_head, head_dim, n_rot, freq_base }
}

fn fused_q8_kv() -> bool {
    std::env::var("MINFER_NO_FUSED_Q8_KV").map_or(true, |v| v != "1")
}

/// The expected bytes of each of `s.read`, in order; the matrix product at dot-product ISA
/// `dot` (every other op is ISA-independent and uses the scalar kernels).
fn reference(spec: &Spec, s: &Setup, pool: &Pool, dot: DotIsa) -> Result<Vec<Vec<u8>>, String> {
    let err = |e: &dyn std::fmt::Display| format!("reference: {e}");
    let node = s.node();
    let n_out = node.out_dtype.bytes_for(node.n_elements()) / 4;
    let mut out = vec![0.0f32; n_out];
    let weight_vec = |id| s.store.as_ref().unwrap().vector(id).map(<[f32]>::to_vec).map_err(|e| err(&e));
    match spec {
        &Spec::Binary { op, d, .. } => {
            let (a, b) = (s.f32s("a"), s.f32s("b"));
            match op {
                Binary::Add => kernels::add(&a, &b, &mut out),
                Binary::Mul => kernels::mul(&a, &b, &mut out),
                Binary::SwiGLU => kernels::swiglu_with(Isa::Scalar, &a, &b, d, &mut out),
                Binary::GeGLU => kernels::geglu(&a, &b, &mut out),
            }
            .map_err(|e| err(&e))?;
        }
        &Spec::Unary { op, d, .. } => {
            let x = s.f32s("x");
            match op {
                Unary::Silu => kernels::silu_with(Isa::Scalar, &x, d, &mut out),
                Unary::Gelu => kernels::gelu(&x, &mut out),
                // ggml's scale: one f32 product per value.
                Unary::Scale(f) => {
                    out.iter_mut().zip(&x).for_each(|(o, v)| *o = v * f);
                    Ok(())
                }
            }
            .map_err(|e| err(&e))?
        }
        &Spec::RmsNorm { d, .. } => {
            let w = match &node.meta {
                NodeMeta::Norm(m) => m.weight.map(weight_vec).transpose()?,
                _ => return Err("rms_norm without norm meta".into()),
            };
            kernels::rms_norm(&s.f32s("x"), w.as_deref(), d, EPS, &mut out).map_err(|e| err(&e))?;
        }
        &Spec::QkNorm { hd, .. } => {
            let NodeMeta::Norm(m) = &node.meta else { return Err("qk_norm without norm meta".into()) };
            let w = weight_vec(m.weight.ok_or("qk_norm without weight")?)?;
            kernels::qk_norm(&s.f32s("x"), &w, hd, EPS, &mut out).map_err(|e| err(&e))?;
        }
        Spec::MatMul { .. } => {
            let NodeMeta::MatMul(m) = &node.meta else { return Err("mul_mat without matmul meta".into()) };
            let st = s.store.as_ref().unwrap();
            let w = st.matrix(m.weight).map_err(|e| err(&e))?;
            let bias = m.bias.map(weight_vec).transpose()?;
            let wm = WeightMatrix { ty: w.ty, data: w.data, rows: w.rows, cols: w.cols, packed: None };
            matmul_with_isa(pool, &wm, &s.f32s("x"), bias.as_deref(), &mut out, dot).map_err(|e| err(&e))?;
        }
        Spec::Embed { .. } => {
            let NodeMeta::Embed(m) = &node.meta else { return Err("get_rows without embed meta".into()) };
            let w = s.store.as_ref().unwrap().matrix(m.weight).map_err(|e| err(&e))?;
            kernels::get_rows(w.ty, w.data, w.cols, &s.i32s("token_ids"), &mut out).map_err(|e| err(&e))?;
        }
        &Spec::TailRows { d, .. } => kernels::select_rows(&s.f32s("x"), d, &s.i32s("tail_ids"), &mut out).map_err(|e| err(&e))?,
        &Spec::Rope { style, n_head, hd, n_rot, freq_base, .. } => {
            out = s.f32s("x");
            kernels::rope_ext(&mut out, &s.i32s("positions"), &rope_spec(style, n_head, hd, n_rot, freq_base)).map_err(|e| err(&e))?;
        }
        &Spec::AttnSeqs { kv: t, hd, n_ctx, .. } => {
            // Each sequence alone: its run of tokens over its own n_ctx cells.
            let kv = s.kv.as_ref().unwrap();
            let (q, pos, cells) = (s.f32s("q"), s.i32s("positions"), s.i32s("kv_cells"));
            let (width, words) = (4 * hd, t.row_bytes(2 * hd) / 4);
            let mut t0 = 0;
            while t0 < pos.len() {
                let base = (cells[t0] - pos[t0]) as usize;
                let t1 = (t0..pos.len()).find(|&t| (cells[t] - pos[t]) as usize != base).unwrap_or(pos.len());
                let rows = base * words..(base + n_ctx) * words;
                let (k, v) = (&kv.k[rows.clone()], &kv.v[rows]);
                attn_reference(pool, (t, 4, 2, hd, None), (&q[t0 * width..t1 * width], &pos[t0..t1]), (k, v), &mut out[t0 * width..t1 * width]).map_err(|e| err(&e))?;
                t0 = t1;
            }
            return Ok(vec![f32_bytes(&out), f32_bytes(&kv.k), f32_bytes(&kv.v)]);
        }
        &Spec::Attn { kv: t, n_head, n_head_kv, hd, window, .. } => {
            let kv = s.kv.as_ref().unwrap();
            let (q, pos) = (s.f32s("q"), s.i32s("positions"));
            attn_reference(pool, (t, n_head, n_head_kv, hd, window), (&q, &pos), (&kv.k, &kv.v), &mut out).map_err(|e| err(&e))?;
            let kb = f32_bytes(&kv.k);
            let vb = f32_bytes(&kv.v);
            return Ok(vec![f32_bytes(&out), kb, vb]);
        }
        Spec::KvStore { n_ctx, .. } => {
            let kv = s.kv.as_ref().unwrap();
            let (mut k, mut v) = (kv.k.clone(), kv.v.clone());
            kv_store_typed((kv.t, kv.hd), &s.f32s("k"), &s.f32s("v"), &s.i32s("positions"), *n_ctx, &mut k, &mut v).map_err(|e| err(&e))?;
            return Ok(vec![f32_bytes(&k), f32_bytes(&v)]);
        }
        Spec::KvLoad { .. } => {
            let kv = s.kv.as_ref().unwrap();
            return Ok(vec![f32_bytes(&kv.k), f32_bytes(&kv.v)]);
        }
        &Spec::KvShift { style, n_head_kv, hd, n_rot, .. } => {
            let kv = s.kv.as_ref().unwrap();
            let mut k = kv.k.clone();
            let rb = kv.t.row_bytes(kv.width);
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut k);
            let spec = rope_spec(style, n_head_kv, hd, n_rot, 1_000_000.0);
            let mut plain = vec![0.0f32; kv.width];
            for (cell, &delta) in s.i32s("kv_deltas").iter().enumerate().filter(|(_, d)| **d != 0) {
                let row = &mut bytes[cell * rb..(cell + 1) * rb];
                decode_row(kv.t, hd, row, &mut plain).map_err(|e| err(&e))?;
                kernels::rope_ext(&mut plain, &[delta], &spec).map_err(|e| err(&e))?;
                encode_row(kv.t, hd, &plain, row).map_err(|e| err(&e))?;
            }
            return Ok(vec![f32_bytes(&k), f32_bytes(&kv.v)]);
        }
    }
    Ok(vec![f32_bytes(&out)])
}

// ---------------------------------------------------------------------------------------------
// Running one case on one backend, through the API only
// ---------------------------------------------------------------------------------------------

/// A reference: the bytes of each of `Setup::read`, or why it could not be computed.
type Expected = Result<Vec<Vec<u8>>, String>;

enum Outcome {
    /// The backend's `supports_node` refused the node.
    Unsupported,
    /// The case is over the backend's work budget (an emulator).
    OverBudget,
    /// The bytes of each of `Setup::read`.
    Ran(Vec<Vec<u8>>),
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

fn run_on(be: &mut BackendUnderTest, s: &Setup) -> Result<Outcome, String> {
    let mut graph = s.graph.clone();
    for n in &mut graph.nodes {
        n.backend = Some(be.handle);
    }
    let node = graph.nodes[s.node].clone();
    if !be.imp.supports_node(&node) {
        return Ok(Outcome::Unsupported);
    }
    if be.max_work.is_some_and(|m| s.work > m) {
        return Ok(Outcome::OverBudget);
    }
    let imp = be.imp.as_mut();
    let before = imp.memory().bytes_in_use;
    let mut buffers: Vec<BufferId> = Vec::new();
    let r = run_inner(imp, be.handle, &graph, &node, s, &mut buffers);
    for id in buffers {
        imp.free_buffer(id);
    }
    let after = imp.memory().bytes_in_use;
    match r {
        Ok(_) if after != before => Err(format!("{} bytes still in use after freeing every buffer of the case (was {before})", after)),
        r => r.map(Outcome::Ran),
    }
}

fn run_inner(
    imp: &mut dyn BackendImpl,
    handle: Backend,
    graph: &ComputeGraph,
    node: &CNode,
    s: &Setup,
    buffers: &mut Vec<BufferId>,
) -> Result<Vec<Vec<u8>>, String> {
    fn ge(what: &'static str) -> impl Fn(minfer::graph::GraphError) -> String {
        move |e| format!("{what}: {e}")
    }
    if let Some(store) = &s.store {
        let ids = node.weights();
        imp.load_weights(store, &ids).map_err(ge("load_weights"))?;
    }
    // One compute arena: every input, then the output, at aligned offsets.
    let align = imp.alignment().max(4);
    let mut offset = 0usize;
    let mut placed: Vec<(NodeId, usize, usize)> = Vec::new();
    for (id, data) in &s.inputs {
        placed.push((*id, offset, data.len()));
        offset = align_up(offset + data.len(), align);
    }
    let kv_bound = node.op.binds_kv_region();
    let out_bytes = node.out_dtype.bytes_for(node.n_elements());
    let out_at = offset;
    if !kv_bound && !s.inplace {
        offset = align_up(offset + out_bytes, align);
    }
    let arena = imp.alloc_buffer(offset.max(align), BufferUsage::Compute).map_err(|e| format!("alloc_buffer: {e}"))?;
    buffers.push(arena);
    let bref = minfer::graph::BufRef { backend: handle, id: arena };
    let tensor_of = |id: NodeId, offset: usize, bytes: usize| TensorRef { buf: bref, offset, bytes, dtype: graph.nodes[id].out_dtype };
    for ((id, data), &(_, at, len)) in s.inputs.iter().zip(&placed) {
        imp.set_tensor(tensor_of(*id, at, len), 0, data).map_err(ge("set_tensor"))?;
    }
    // The KV pair of layer 0.
    let pair = match &s.kv {
        Some(kv) => {
            let bytes = kv.bytes();
            let mut half = |init: &[f32]| -> Result<TensorRef, String> {
                let id = imp.alloc_buffer(bytes, BufferUsage::Kv).map_err(|e| format!("alloc_buffer (kv): {e}"))?;
                buffers.push(id);
                let t = TensorRef { buf: minfer::graph::BufRef { backend: handle, id }, offset: 0, bytes, dtype: kv.t.dtype() };
                imp.set_tensor(t, 0, bytemuck::cast_slice(init)).map_err(ge("set_tensor (kv)"))?;
                Ok(t)
            };
            let k = half(&kv.k)?;
            let v = half(&kv.v)?;
            Some(KvPair { k, v })
        }
        None => None,
    };
    let out = match (kv_bound, s.inplace) {
        (true, _) => pair.ok_or("a KV node without a KV pair")?.k,
        (false, true) => {
            let &(id, at, len) = placed.first().ok_or("an in-place case without a source")?;
            tensor_of(id, at, len)
        }
        (false, false) => {
            let t = TensorRef { buf: bref, offset: out_at, bytes: out_bytes, dtype: node.out_dtype };
            // NaN-filled, so a value the kernel never writes cannot pass as a zero.
            imp.set_tensor(t, 0, &vec![0xffu8; out_bytes]).map_err(ge("set_tensor (output sentinel)"))?;
            t
        }
    };
    let srcs = node
        .src
        .iter()
        .map(|&src| match placed.iter().find(|p| p.0 == src) {
            Some(&(id, at, len)) => Ok(tensor_of(id, at, len)),
            // The kv_load view's tensor is the layer's K region.
            None if matches!(graph.nodes[src].op, Op::KvcacheLoad { .. }) => pair.map(|p| p.k).ok_or_else(|| "kv_load without a KV pair".to_string()),
            None => Err(format!("source {src} has no data")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    let kv = node.kv_layer().and(pair);
    let work = [NodeWork { node: node.id, out, srcs, kv }];
    imp.compute(&SplitWork { graph, backend: handle, nodes: &work }).map_err(ge("compute"))?;
    imp.synchronize().map_err(ge("synchronize"))?;
    let mut results = Vec::new();
    for seg in &s.read {
        let t = match seg.region {
            Region::Out => out,
            Region::K => pair.ok_or("no KV pair")?.k,
            Region::V => pair.ok_or("no KV pair")?.v,
        };
        let mut bytes = vec![0u8; t.bytes];
        imp.get_tensor(t, 0, &mut bytes).map_err(ge("get_tensor"))?;
        results.push(bytes);
    }
    Ok(results)
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

/// The values of a result (KV rows decoded to the plain values).
fn values(kind: Kind, bytes: &[u8]) -> Result<Vec<f32>, String> {
    match kind {
        Kind::F32 => Ok(words(bytes).into_iter().map(f32::from_bits).collect()),
        Kind::Kv { t, width, hd } => {
            let rb = t.row_bytes(width);
            let rows = bytes.len() / rb;
            let mut out = vec![0.0f32; rows * width];
            for (r, o) in out.chunks_exact_mut(width).enumerate() {
                decode_row(t, hd, &bytes[r * rb..(r + 1) * rb], o).map_err(|e| format!("decoding row {r}: {e}"))?;
            }
            Ok(out)
        }
    }
}

fn region_name(r: Region) -> &'static str {
    match r {
        Region::Out => "out",
        Region::K => "K region",
        Region::V => "V region",
    }
}

/// `Ok` when `got` passes against `want` under `tol`; else the one-line reason.
fn compare(seg: &Seg, tol: Tol, got: &[u8], want: &[u8]) -> Result<(), String> {
    let what = region_name(seg.region);
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes read back, {} expected", got.len(), want.len()));
    }
    let tol = if seg.unchanged { Tol::Bitwise } else { tol };
    match tol {
        Tol::Bitwise => {
            if got == want {
                return Ok(());
            }
            match seg.kind {
                Kind::F32 => {
                    let (g, w): (Vec<u32>, Vec<u32>) = (words(got), words(want));
                    let diff: Vec<usize> = (0..g.len()).filter(|&i| g[i] != w[i]).collect();
                    let i = diff[0];
                    Err(format!(
                        "{what}: not bitwise: {} of {} values differ, first [{i}]: got {:e} ({:#010x}), want {:e} ({:#010x})",
                        diff.len(),
                        g.len(),
                        f32::from_bits(g[i]),
                        g[i],
                        f32::from_bits(w[i]),
                        w[i]
                    ))
                }
                Kind::Kv { t, width, .. } => {
                    let rb = t.row_bytes(width);
                    let rows: BTreeSet<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).map(|i| i / rb).collect();
                    Err(format!(
                        "{what} ({t}): not bitwise: {} of {} rows differ, first row {}{}",
                        rows.len(),
                        got.len() / rb,
                        rows.first().unwrap(),
                        if seg.unchanged { " (the op must not write it)" } else { "" }
                    ))
                }
            }
        }
        Tol::Nmse(max) => {
            let (g, w) = (values(seg.kind, got)?, values(seg.kind, want)?);
            if let Some(i) = (0..g.len()).find(|&i| g[i].is_nan() != w[i].is_nan() || (w[i].is_infinite() && g[i] != w[i])) {
                return Err(format!("{what}: [{i}] got {:e}, want {:e}", g[i], w[i]));
            }
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (&a, &b) in g.iter().zip(&w).filter(|(_, b)| b.is_finite()) {
                num += (f64::from(a) - f64::from(b)).powi(2);
                den += f64::from(b).powi(2);
            }
            let nmse = if den == 0.0 { num } else { num / den };
            match nmse <= max {
                true => Ok(()),
                false => Err(format!("{what}: NMSE {nmse:.3e} > {max:e}")),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coverage guards
// ---------------------------------------------------------------------------------------------

fn kv_of(node: &CNode) -> Option<(KvType, usize)> {
    match &node.meta {
        NodeMeta::Kvcache(m) => Some((m.kv_type, m.head_dim)),
        NodeMeta::KvShift(m) => Some((m.kv.kv_type, m.kv.head_dim)),
        NodeMeta::Attn(m) => Some((m.kv_type, m.head_dim)),
        _ => None,
    }
}

/// What a node needs a case for: its op, and the op's variant where kernels differ (weight
/// type and bias, KV type and head size, RoPE style, head size and partial rotation, weighted
/// norm or not). The same function runs on the cases' nodes and on the models' nodes.
fn coverage_keys(node: &CNode) -> Vec<String> {
    let name = node.op.name();
    let mut keys = vec![name.to_string()];
    let detail = match (&node.op, &node.meta) {
        (Op::MatMul, NodeMeta::MatMul(m)) => Some(format!("{}{}", m.weight_type, if m.bias.is_some() { "+bias" } else { "" })),
        (Op::GetRows, NodeMeta::Embed(m)) => Some(format!("embed {}", m.weight_type)),
        (Op::GetRows, _) => Some("rows".to_string()),
        (Op::RmsNorm { .. }, NodeMeta::Norm(m)) => Some(if m.weight.is_some() { "weighted" } else { "plain" }.to_string()),
        (Op::QkNorm { hd, .. }, _) => Some(format!("hd={hd}")),
        (Op::RoPE { style }, NodeMeta::Rope(m)) => {
            Some(format!("{} hd={} {}", style_name(*style), m.head_dim, if m.n_rot == m.head_dim { "full" } else { "partial" }))
        }
        (Op::KvShift { .. }, NodeMeta::KvShift(m)) => Some(format!(
            "{} {} hd={} {}",
            m.kv.kv_type,
            style_name(m.style),
            m.kv.head_dim,
            if m.rope.n_rot == m.rope.head_dim { "full" } else { "partial" }
        )),
        (Op::Attn, NodeMeta::Attn(m)) => Some(format!("{} hd={}{}", m.kv_type, m.head_dim, if m.window.is_some() { " windowed" } else { "" })),
        (Op::KvcacheStore { .. } | Op::KvcacheLoad { .. }, _) => kv_of(node).map(|(t, hd)| format!("{t} hd={hd}")),
        _ => None,
    };
    if let Some(d) = detail {
        keys.push(format!("{name}[{d}]"));
    }
    keys
}

/// The coverage keys of every op case in the table.
fn table_keys(cases: &[Case]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for c in cases {
        if let CaseKind::Op { spec, .. } = &c.kind {
            let s = build(spec, &mut Rng(0x9e37_79b9));
            keys.extend(coverage_keys(s.node()));
        }
    }
    keys
}

fn check_op_examples(cases: &[Case]) -> Result<String, String> {
    let keys = table_keys(cases);
    let missing: Vec<&str> = Op::examples().iter().filter(|op| **op != Op::Input).map(|op| op.name()).filter(|n| !keys.contains(*n)).collect();
    match missing.is_empty() {
        true => Ok(format!("{} op variants, each with a case", Op::examples().len() - 1)),
        false => Err(format!("Op::examples() variants without a case: {}", missing.join(", "))),
    }
}

fn model_dir() -> std::path::PathBuf {
    std::env::var_os("MINFER_MODEL_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"))
}

const MODELS: [&str; 4] =
    ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen3-tiny.gguf", "smollm2-135m-instruct-q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"];

/// `Ok(None)`: no model file present (skipped).
fn check_model_graphs(cases: &[Case]) -> Result<Option<String>, String> {
    let dir = model_dir();
    let present: Vec<_> = MODELS.iter().map(|m| dir.join(m)).filter(|p| p.is_file()).collect();
    if present.is_empty() {
        return Ok(None);
    }
    let keys = table_keys(cases);
    let mut missing: BTreeSet<String> = BTreeSet::new();
    let mut seen = 0usize;
    for path in &present {
        let file = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let model = minfer::models::load_model(Arc::new(file)).map_err(|e| format!("{}: {e}", path.display()))?;
        let short = path.file_name().unwrap().to_string_lossy().to_string();
        for kv_type in KV_TYPES {
            for n_tokens in [1, 7] {
                let p = GraphParams {
                    n_tokens,
                    n_out: 1,
                    output: Default::default(),
                    gtype: GraphType::for_tokens(n_tokens),
                    cparams: CParams { n_ctx: 64, n_seq: 1, gpu: false, kv_type },
                    weights_version: 1,
                };
                let graphs = [
                    ("forward", model.def.build_graph(&p).map_err(|e| format!("{short}: build_graph: {e}"))?),
                    ("kv_shift", model.def.build_kv_shift(&p).map_err(|e| format!("{short}: build_kv_shift: {e}"))?),
                ];
                for (what, mut g) in graphs {
                    let alloc = minfer::backends::cpu_allocator();
                    BackendScheduler::new().assign_backends(&mut g, &alloc);
                    FusionPass::new().run(&mut g, &alloc);
                    for n in g.nodes.iter().filter(|n| !n.is_input()) {
                        seen += 1;
                        for k in coverage_keys(n) {
                            if !keys.contains(&k) {
                                missing.insert(format!("{k} ({short} {what}, e.g. {})", n.name));
                            }
                        }
                    }
                }
            }
        }
    }
    // One line per missing key (the first example of each).
    let mut by_key: std::collections::BTreeMap<String, String> = Default::default();
    for m in missing {
        let k = m.split(" (").next().unwrap().to_string();
        by_key.entry(k).or_insert(m);
    }
    match by_key.is_empty() {
        true => Ok(Some(format!(
            "{} model nodes of {} in {} (forward 1/7 tokens, K-shift, every KV type, fused) all have cases",
            seen,
            present.iter().map(|p| p.file_name().unwrap().to_string_lossy()).collect::<Vec<_>>().join(", "),
            dir.display()
        ))),
        false => Err(format!("model ops without a case: {}", by_key.into_values().collect::<Vec<_>>().join("; "))),
    }
}

// ---------------------------------------------------------------------------------------------
// Command line and main
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Args {
    list: bool,
    terse: bool,
    exact: bool,
    ignored: bool,
    /// Judge every backend by the op tolerances, as a non-exact backend is.
    tolerances: bool,
    filters: Vec<String>,
    skips: Vec<String>,
    backends: Vec<String>,
}

const USAGE: &str = "usage: backend_ops [--list] [--exact] [--skip SUBSTR]... [--backend NAME]... [--tolerances] [FILTER]...";

fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| inline.clone().or_else(|| it.next()).ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--list" => a.list = true,
            "--exact" => a.exact = true,
            "--tolerances" => a.tolerances = true,
            "--ignored" => a.ignored = true,
            "--backend" => a.backends.push(value("--backend")?),
            "--skip" => a.skips.push(value("--skip")?),
            "--format" => a.terse = value("--format")? == "terse",
            // libtest options that mean nothing here.
            "--nocapture" | "--show-output" | "--quiet" | "-q" | "--include-ignored" | "--test" => {}
            "--test-threads" | "--color" | "-Z" | "--logfile" => {
                value(&flag)?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            f if f.starts_with('-') => return Err(format!("unknown option {f}\n{USAGE}")),
            _ => a.filters.push(arg),
        }
    }
    Ok(a)
}

impl Args {
    fn selects(&self, name: &str) -> bool {
        let hit = |f: &String| if self.exact { name == f } else { name.contains(f.as_str()) };
        !self.ignored && (self.filters.is_empty() || self.filters.iter().any(hit)) && !self.skips.iter().any(|s| name.contains(s.as_str()))
    }
}

#[derive(Default)]
struct Tally {
    run: usize,
    passed: usize,
    failed: usize,
    skipped: usize,
    failures: Vec<String>,
}

fn seed_of(name: &str) -> u32 {
    // FNV-1a: a fixed seed per case, whatever runs before it.
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    h | 1
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let cases = cases();
    let selected: Vec<&Case> = cases.iter().filter(|c| args.selects(&c.name)).collect();
    if args.list {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for c in &selected {
            let line = match args.terse {
                true => writeln!(out, "{}: test", c.name),
                false => writeln!(out, "{}", c.name),
            };
            if line.is_err() {
                return; // the reader went away (`| head`)
            }
        }
        return;
    }
    let mut bes = match backends() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("backend_ops: cannot create the backends: {e}");
            std::process::exit(1);
        }
    };
    if !args.backends.is_empty() {
        let names: Vec<String> = bes.iter().map(|b| b.name.clone()).collect();
        if let Some(bad) = args.backends.iter().find(|n| !names.contains(n)) {
            eprintln!("backend_ops: no backend {bad} (have: {})", names.join(", "));
            std::process::exit(2);
        }
        bes.retain(|b| args.backends.contains(&b.name));
    }
    if args.tolerances {
        for b in &mut bes {
            b.exact = Exactness::Tolerance;
        }
    }
    let pool = Pool::new(2).expect("reference worker pool");
    let started = Instant::now();
    println!(
        "backend_ops: {} of {} cases on {}",
        selected.len(),
        cases.len(),
        bes.iter()
            .map(|b| match b.exact {
                Exactness::Bits { dot } => format!("{} (bit-exact, dots {dot:?})", b.name),
                Exactness::Tolerance => format!("{} (tolerances)", b.name),
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut t = Tally::default();
    for case in selected {
        match &case.kind {
            CaseKind::Guard(g) => {
                t.run += 1;
                let r = match g {
                    Guard::OpExamples => check_op_examples(&cases).map(Some),
                    Guard::ModelGraphs => check_model_graphs(&cases),
                };
                match r {
                    Ok(Some(note)) => {
                        t.passed += 1;
                        println!("ok   {}  ({note})", case.name);
                    }
                    Ok(None) => {
                        t.run -= 1;
                        t.skipped += 1;
                        println!(
                            "skip {}  (no model file in {}: only Op::examples() was checked, by coverage/op_examples)",
                            case.name,
                            model_dir().display()
                        );
                    }
                    Err(e) => {
                        t.failed += 1;
                        let line = format!("{}: {e}", case.name);
                        println!("FAIL {line}");
                        t.failures.push(line);
                    }
                }
            }
            CaseKind::Op { spec, tol } => {
                let setup = build(spec, &mut Rng(seed_of(&case.name)));
                let scalar = reference(spec, &setup, &pool, DotIsa::Scalar);
                let want = match scalar {
                    Ok(w) => w,
                    Err(e) => {
                        t.run += 1;
                        t.failed += 1;
                        let line = format!("{}: {e}", case.name);
                        println!("FAIL {line}");
                        t.failures.push(line);
                        continue;
                    }
                };
                // The matrix product at each other dot ISA a bit-exact backend runs.
                let mut at_isa: Vec<(DotIsa, Expected)> = Vec::new();
                if matches!(spec, Spec::MatMul { .. }) {
                    for be in &bes {
                        if let Exactness::Bits { dot } = be.exact
                            && dot != DotIsa::Scalar
                            && !at_isa.iter().any(|(d, _)| *d == dot)
                        {
                            at_isa.push((dot, reference(spec, &setup, &pool, dot)));
                        }
                    }
                }
                let mut status: Vec<String> = Vec::new();
                for be in bes.iter_mut() {
                    let outcome = run_on(be, &setup).and_then(|o| match o {
                        Outcome::Unsupported => Ok(None),
                        Outcome::OverBudget => Ok(Some(false)),
                        Outcome::Ran(got) => {
                            let check = |want: &[Vec<u8>], tol: Tol, vs: &str| -> Result<(), String> {
                                for ((seg, g), w) in setup.read.iter().zip(&got).zip(want) {
                                    compare(seg, tol, g, w).map_err(|e| format!("{e} (vs {vs})"))?;
                                }
                                Ok(())
                            };
                            match be.exact {
                                Exactness::Tolerance => check(&want, *tol, "the scalar reference")?,
                                Exactness::Bits { dot: DotIsa::Scalar } => check(&want, Tol::Bitwise, "the scalar reference")?,
                                Exactness::Bits { dot } => match at_isa.iter().find(|(d, _)| *d == dot) {
                                    // mul_mat: the bits of its own ISA, and the scalar reference's tolerance.
                                    Some((_, r)) => {
                                        let w = r.as_ref().map_err(Clone::clone)?;
                                        check(w, Tol::Bitwise, &format!("the {dot:?} reference"))?;
                                        check(&want, *tol, "the scalar reference")?;
                                    }
                                    None => check(&want, Tol::Bitwise, "the scalar reference")?,
                                },
                            }
                            Ok(Some(true))
                        }
                    });
                    match outcome {
                        Ok(Some(false)) => {
                            t.skipped += 1;
                            status.push(format!("{} over its budget", be.name));
                        }
                        Ok(Some(true)) => {
                            t.run += 1;
                            t.passed += 1;
                            status.push(format!("{} ok", be.name));
                        }
                        Ok(None) => {
                            t.skipped += 1;
                            status.push(format!("{} unsupported", be.name));
                        }
                        Err(e) => {
                            t.run += 1;
                            t.failed += 1;
                            let line = format!("{} [{}]: {e}", case.name, be.name);
                            status.push(format!("{} FAILED", be.name));
                            t.failures.push(line);
                        }
                    }
                }
                let tag = match () {
                    _ if status.iter().any(|s| s.ends_with("FAILED")) => "FAIL",
                    _ if status.iter().all(|s| s.ends_with("unsupported") || s.ends_with("budget")) => "skip",
                    _ => "ok  ",
                };
                println!("{tag} {}  ({}; tolerance {})", case.name, status.join(", "), tol);
            }
        }
    }
    if !t.failures.is_empty() {
        println!("\nfailures:");
        for f in &t.failures {
            println!("    {f}");
        }
    }
    println!(
        "\nbackend_ops: {} (case x backend checks): {} run, {} passed, {} failed, {} skipped (unsupported by a backend, or no model files); {:.1}s",
        if t.failed == 0 { "ok" } else { "FAILED" },
        t.run,
        t.passed,
        t.failed,
        t.skipped,
        started.elapsed().as_secs_f64()
    );
    if t.failed > 0 {
        std::process::exit(1);
    }
}

/// The scalar reference of attention over one sequence's cells: `k` and `v` its regions as
/// stored (f32 words; packed rows as their bytes), `out` `[nt][n_head * hd]`.
fn attn_reference(
    pool: &Pool,
    (t, n_head, n_head_kv, hd, window): (KvType, usize, usize, usize, Option<usize>),
    (q, pos): (&[f32], &[i32]),
    (k, v): (&[f32], &[f32]),
    out: &mut [f32],
) -> Result<(), Box<dyn std::error::Error>> {
    let scale = 1.0 / (hd as f32).sqrt();
    let args = |q, k, v| AttnArgs { q, k_cache: k, v_cache: v, positions: &[], n_head, n_head_kv, head_dim: hd, scale, window };
    let (width, q) = (n_head_kv * hd, q.to_vec());
    let rows = k.len() * 4 / t.row_bytes(width);
    match t {
        KvType::F32 => {
            let a = AttnArgs { positions: &pos, ..args(&q, k, v) };
            kernels::attention_with(Isa::Scalar, pool, &a, out).map_err(Box::new)?;
        }
        KvType::Q8_0 if fused_q8_kv() => {
            let a = AttnArgs { positions: &pos, ..args(&q, &[], &[]) };
            let packed = PackedKv { k: bytemuck::cast_slice(k), v: bytemuck::cast_slice(v) };
            attention_q8(pool, &a, packed, out).map_err(Box::new)?;
        }
        _ => {
            // Decoded cells (as stored: q8_0 rows stay rotated), then the f32 path; the
            // rotated cache wants the rotated query and rotates the output back.
            let kf = load_rows(t, k, width, rows).map_err(Box::new)?;
            let vf = load_rows(t, v, width, rows).map_err(Box::new)?;
            let mut qr = q.clone();
            if t == KvType::Q8_0 {
                rotate_heads(&mut qr, hd);
            }
            let a = AttnArgs { positions: &pos, ..args(&qr, &kf, &vf) };
            kernels::attention_with(Isa::Scalar, pool, &a, out).map_err(Box::new)?;
            if t == KvType::Q8_0 {
                rotate_heads(out, hd);
            }
        }
    }
    Ok(())
}
