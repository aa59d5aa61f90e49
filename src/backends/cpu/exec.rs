//! The CPU backend's node kernels: one function per op, mapping a node (its meta, its operand
//! regions as bytes) onto the [`kernels`](super::kernels). Activations are token-major
//! `[nt][d]` f32, ids and positions i32, KV regions rows of their [`KvType`].
//!
//! Every function here works on byte slices it was handed, so any backend that can produce
//! host copies of its operands can run them: the test backend of `tests/` does, to prove the
//! seam against the CPU's own results (with the same [`KernelIsa`] on both sides).

use super::kernels::attention_q8::PackedKv;
use super::kernels::kv_cache::{attention_dequantized, decode_row, encode_row, kv_store_typed};
use super::kernels::matmul::{WeightMatrix, matmul, matmul_with_isa};
use super::kernels::{self, AttnArgs, Isa};
use crate::graph::{AttnMeta, CNode, GraphError, KvType, NodeMeta, Op, RopeStyle, WeightId, WeightStore, WeightView};
use crate::quants::packed::PackedMatrix;
use crate::workers::Pool;
use std::sync::Arc;

/// Which instruction set the kernels run with. The element-wise kernels, norms, RoPE, softmax
/// and attention have SIMD paths bit-identical to their scalar twins. The quantized dots do
/// not: on x86 they reproduce ggml's x86 summation order (what llama.cpp's reference data
/// comes from), while the scalar dots keep ggml's generic order, so a matmul differs in the
/// last bits between the two (within a few roundings; `tests/matmul_real.rs` bounds it).
/// `Scalar` is ggml's generic CPU build; `Detected` is the build the reference data matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelIsa {
    /// The best this CPU has (after the `MINFER_NO_*` levers).
    Detected,
    /// The scalar reference kernels.
    Scalar,
}

impl KernelIsa {
    /// The instruction set this stands for.
    pub fn isa(self) -> Isa {
        match self {
            KernelIsa::Detected => Isa::detected(),
            KernelIsa::Scalar => Isa::Scalar,
        }
    }
}

/// Where kernels read weights from: the CPU reads the model's memory map (the store); a backend
/// that uploaded its own copies answers from them.
pub trait Weights {
    fn matrix(&self, id: WeightId) -> Result<WeightView<'_>, GraphError>;
    fn vector(&self, id: WeightId) -> Result<&[f32], GraphError>;
    /// The weight's name, for errors.
    fn name(&self, id: WeightId) -> String;
}

impl Weights for WeightStore {
    fn matrix(&self, id: WeightId) -> Result<WeightView<'_>, GraphError> {
        WeightStore::matrix(self, id)
    }
    fn vector(&self, id: WeightId) -> Result<&[f32], GraphError> {
        WeightStore::vector(self, id)
    }
    fn name(&self, id: WeightId) -> String {
        WeightStore::name(self, id).to_string()
    }
}

/// What kernels may need besides operands.
pub struct KernelCtx<'a> {
    pub weights: Option<&'a dyn Weights>,
    /// `loaded[id]`: was weight `id` offered to this backend?
    pub loaded: &'a [bool],
    /// `packed[id]`: a repacked copy of matrix `id` for one-token products, where the backend
    /// made one.
    pub packed: &'a [Option<Arc<PackedMatrix>>],
    pub pool: Option<&'a Pool>,
    pub isa: KernelIsa,
    /// The backend's recent RoPE tables (Q and K of every layer at one set of positions share
    /// one).
    pub rope: &'a kernels::RopeTables,
}

impl<'a> KernelCtx<'a> {
    fn weights(&self, node: &CNode, id: WeightId) -> Result<&'a dyn Weights, GraphError> {
        let store = self.weights.ok_or_else(|| GraphError::NoModel { node: node.name.clone(), what: "the model's weights" })?;
        match self.loaded.get(id.0 as usize) {
            Some(true) => Ok(store),
            _ => Err(GraphError::WeightNotLoaded {
                node: node.name.clone(),
                weight: store.name(id),
                backend: node.backend.unwrap_or(crate::graph::Backend::CPU),
            }),
        }
    }

    fn pool(&self, node: &CNode) -> Result<&'a Pool, GraphError> {
        self.pool.ok_or_else(|| GraphError::NoModel { node: node.name.clone(), what: "worker threads" })
    }
}

fn kernel<E: std::error::Error + Send + Sync + 'static>(node: &CNode) -> impl Fn(E) -> GraphError + '_ {
    move |source| GraphError::Kernel { node: node.name.clone(), source: Box::new(source) }
}

fn wrong_meta(node: &CNode, expected: &'static str) -> GraphError {
    GraphError::WrongMeta { node: node.name.clone(), expected, found: node.meta.kind_name() }
}

/// An f32 view of a region (4-byte aligned by the allocator's 64-byte offsets).
pub fn f32s<'b>(node: &CNode, b: &'b [u8]) -> Result<&'b [f32], GraphError> {
    bytemuck::try_cast_slice(b).map_err(|e| GraphError::Kernel { node: node.name.clone(), source: format!("f32 view: {e:?}").into() })
}

/// An f32 view of a mutable region.
pub fn f32s_mut<'b>(node: &CNode, b: &'b mut [u8]) -> Result<&'b mut [f32], GraphError> {
    bytemuck::try_cast_slice_mut(b).map_err(|e| GraphError::Kernel { node: node.name.clone(), source: format!("f32 view: {e:?}").into() })
}

/// An i32 view of a region (ids, positions).
pub fn i32s<'b>(node: &CNode, b: &'b [u8]) -> Result<&'b [i32], GraphError> {
    bytemuck::try_cast_slice(b).map_err(|e| GraphError::Kernel { node: node.name.clone(), source: format!("i32 view: {e:?}").into() })
}

fn norm_weight<'a>(node: &CNode, cx: &KernelCtx<'a>) -> Result<Option<&'a [f32]>, GraphError> {
    match &node.meta {
        NodeMeta::Norm(m) => match m.weight {
            Some(id) => Ok(Some(cx.weights(node, id)?.vector(id)?)),
            None => Ok(None),
        },
        _ => Err(wrong_meta(node, "norm")),
    }
}

/// An operand: its own region, or `Aliased` when the allocator made it the output region
/// itself (Silu and RoPE in place).
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Buf(&'a [u8]),
    Aliased,
}

/// Does the CPU implement this RoPE? Both styles (ggml NORM and NEOX), rotating any even
/// `n_rot <= head_dim` of an even head (the rest copied through).
pub fn rope_supported(node: &CNode) -> bool {
    let ok = |m: &crate::graph::RoPEMeta| m.n_rot > 0 && m.n_rot.is_multiple_of(2) && m.n_rot <= m.head_dim && m.head_dim.is_multiple_of(2);
    match (&node.op, &node.meta) {
        (Op::RoPE { .. }, NodeMeta::Rope(m)) => ok(m),
        (_, NodeMeta::KvShift(m)) => ok(&m.rope),
        _ => false,
    }
}

/// RoPE in place on `x` `[nt][n_head * head_dim]` at `positions` with the kernels of `isa`, a
/// table from `tables` where given (a graph's RoPE nodes) or a fresh one (a KV shift's one-off
/// rotation).
fn rope_in_place(
    node: &CNode,
    x: &mut [f32],
    positions: &[i32],
    (m, style): (&crate::graph::RoPEMeta, RopeStyle),
    (tables, isa): (Option<&kernels::RopeTables>, Isa),
) -> Result<(), GraphError> {
    let mode = match style {
        RopeStyle::NonInterleaved => kernels::RopeMode::Neox,
        RopeStyle::Interleaved => kernels::RopeMode::Normal,
    };
    let spec = kernels::RopeSpec { mode, n_head: m.n_head, head_dim: m.head_dim, n_rot: m.n_rot, freq_base: m.freq_base };
    match tables {
        Some(t) => kernels::rope_ext_cached(isa, x, positions, &spec, t),
        None => kernels::rope_ext_with(isa, x, positions, &spec),
    }
    .map_err(kernel(node))
}

/// Ops whose output is a function of the operand regions alone.
pub fn run(node: &CNode, cx: &KernelCtx, ins: &[Operand], dst: &mut [u8]) -> Result<(), GraphError> {
    let d = node.out_shape[0];
    let count = || GraphError::OperandCount { node: node.name.clone(), expected: ins.len() + 1, got: ins.len() };
    // In-place RoPE rotates the output region as it stands; any other op reads a snapshot.
    if let (Op::RoPE { style }, Some(Operand::Aliased)) = (&node.op, ins.first()) {
        let NodeMeta::Rope(m) = &node.meta else { return Err(wrong_meta(node, "rope")) };
        let Some(Operand::Buf(pos)) = ins.get(1) else { return Err(count()) };
        let pos = i32s(node, pos)?;
        return rope_in_place(node, f32s_mut(node, dst)?, pos, (m, *style), (Some(cx.rope), cx.isa.isa()));
    }
    // In-place SwiGLU (the fused output over its gate): row by row, no snapshot.
    if let (Op::SwiGLU, Some(Operand::Aliased), Some(Operand::Buf(up))) = (&node.op, ins.first(), ins.get(1)) {
        let up = f32s(node, up)?;
        return kernels::swiglu_inplace_with(cx.isa.isa(), f32s_mut(node, dst)?, up, node.out_shape[0]).map_err(kernel(node));
    }
    // In-place element-wise ops over their first operand.
    if let Some(Operand::Aliased) = ins.first() {
        match &node.op {
            Op::Scale { s } => {
                kernels::scale_inplace(f32s_mut(node, dst)?, *s);
                return Ok(());
            }
            Op::Gelu => {
                kernels::gelu_inplace(f32s_mut(node, dst)?);
                return Ok(());
            }
            Op::GeGLU => {
                let Some(Operand::Buf(up)) = ins.get(1) else { return Err(count()) };
                return kernels::geglu_inplace(f32s_mut(node, dst)?, f32s(node, up)?).map_err(kernel(node));
            }
            _ => {}
        }
    }
    let snapshot: Option<Vec<u8>> = ins.iter().any(|o| matches!(o, Operand::Aliased)).then(|| dst.to_vec());
    let operand = |i: usize| -> Result<&[u8], GraphError> {
        match ins.get(i) {
            Some(Operand::Buf(b)) => Ok(b),
            Some(Operand::Aliased) => Ok(snapshot.as_deref().unwrap_or(&[])),
            None => Err(count()),
        }
    };
    let f = |i: usize| operand(i).and_then(|b| f32s(node, b));
    let isa = cx.isa.isa();
    let out = f32s_mut(node, dst)?;
    match &node.op {
        Op::Add => kernels::add(f(0)?, f(1)?, out).map_err(kernel(node)),
        Op::Mul => kernels::mul(f(0)?, f(1)?, out).map_err(kernel(node)),
        Op::Silu => kernels::silu_with(isa, f(0)?, d, out).map_err(kernel(node)),
        Op::SwiGLU => kernels::swiglu_with(isa, f(0)?, f(1)?, d, out).map_err(kernel(node)),
        Op::Scale { s } => kernels::scale(f(0)?, *s, out).map_err(kernel(node)),
        Op::Gelu => kernels::gelu(f(0)?, out).map_err(kernel(node)),
        Op::GeGLU => kernels::geglu(f(0)?, f(1)?, out).map_err(kernel(node)),
        Op::RmsNorm { eps } => {
            let w = norm_weight(node, cx)?;
            kernels::rms_norm(f(0)?, w, d, *eps, out).map_err(kernel(node))
        }
        Op::QkNorm { hd, eps, .. } => {
            let w = norm_weight(node, cx)?.ok_or_else(|| wrong_meta(node, "a q/k norm weight"))?;
            kernels::qk_norm(f(0)?, w, *hd, *eps, out).map_err(kernel(node))
        }
        Op::MatMul => {
            let NodeMeta::MatMul(m) = &node.meta else { return Err(wrong_meta(node, "matmul")) };
            let store = cx.weights(node, m.weight)?;
            let w = store.matrix(m.weight)?;
            let bias = match m.bias {
                Some(b) => Some(cx.weights(node, b)?.vector(b)?),
                None => None,
            };
            let packed = cx.packed.get(m.weight.0 as usize).and_then(Option::as_deref);
            let w = WeightMatrix { ty: w.ty, data: w.data, rows: w.rows, cols: w.cols, packed };
            let pool = cx.pool(node)?;
            match cx.isa {
                KernelIsa::Detected => matmul(pool, &w, f(0)?, bias, out).map_err(kernel(node)),
                KernelIsa::Scalar => matmul_with_isa(pool, &w, f(0)?, bias, out, Isa::Scalar).map_err(kernel(node)),
            }
        }
        Op::GetRows => match &node.meta {
            // Embedding: src = [ids]; rows dequantized from the weight.
            NodeMeta::Embed(m) => {
                let w = cx.weights(node, m.weight)?.matrix(m.weight)?;
                kernels::get_rows(w.ty, w.data, w.cols, i32s(node, operand(0)?)?, out).map_err(kernel(node))
            }
            // Tail rows: src = [x, ids].
            _ => kernels::select_rows(f(0)?, d, i32s(node, operand(1)?)?, out).map_err(kernel(node)),
        },
        Op::RoPE { style } => {
            let NodeMeta::Rope(m) = &node.meta else { return Err(wrong_meta(node, "rope")) };
            let x = f(0)?;
            if x.len() != out.len() {
                return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: out.len(), got: x.len() });
            }
            out.copy_from_slice(x);
            rope_in_place(node, out, i32s(node, operand(1)?)?, (m, *style), (Some(cx.rope), cx.isa.isa()))
        }
        _ => Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() }),
    }
}

/// Attention: src = [q, kv_load, pos] or [q, kv_load, pos, cells]; K and V are the layer's
/// regions. With `cells` the regions hold several sequences: each run of tokens of one
/// sequence (same `cells[t] - pos[t]`, where the sequence's cells start) attends the regions
/// from that cell on, exactly as the sequence alone in regions of its own.
pub fn attention(node: &CNode, cx: &KernelCtx, (q, pos, cells): (&[u8], &[u8], Option<&[u8]>), (k, v): (&[u8], &[u8]), dst: &mut [u8]) -> Result<(), GraphError> {
    let NodeMeta::Attn(m) = &node.meta else { return Err(wrong_meta(node, "attn")) };
    let positions = i32s(node, pos)?;
    let Some(cells) = cells else {
        return attention_run(node, cx, (f32s(node, q)?, positions), (k, v), f32s_mut(node, dst)?);
    };
    let cells = i32s(node, cells)?;
    let nt = positions.len();
    if cells.len() != nt {
        return Err(GraphError::OperandLength { node: node.name.clone(), operand: 3, expected: nt, got: cells.len() });
    }
    let (q, mut out) = (f32s(node, q)?, f32s_mut(node, dst)?);
    let width = m.n_head * m.head_dim;
    let rb = m.kv_type.row_bytes(m.n_embd_kv());
    let bad_cell = |t: usize| {
        let source = format!("token {t}: cell {} at position {} is not inside 0..{}", cells[t], positions[t], m.n_ctx).into();
        GraphError::Kernel { node: node.name.clone(), source }
    };
    let too_short = || GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: nt * width, got: q.len() };
    let mut runs: Vec<SeqRun> = Vec::new();
    let mut t0 = 0;
    while t0 < nt {
        let start = cells[t0] - positions[t0];
        if start < 0 || cells[t0] < 0 || cells[t0] as usize >= m.n_ctx {
            return Err(bad_cell(t0));
        }
        let t1 = (t0 + 1..nt).find(|&t| cells[t] - positions[t] != start).unwrap_or(nt);
        let from = start as usize * rb;
        let n = (t1 - t0) * width;
        let (Some(qs), Some(ks), Some(vs)) = (q.get(t0 * width..t1 * width), k.get(from..), v.get(from..)) else {
            return Err(too_short());
        };
        if out.len() < n {
            return Err(too_short());
        }
        let (os, rest) = std::mem::take(&mut out).split_at_mut(n);
        out = rest;
        runs.push(SeqRun { q: qs, positions: &positions[t0..t1], kv: (ks, vs), out: os });
        t0 = t1;
    }
    if m.kv_type == KvType::F32 {
        // Every sequence's tiles in one hand-off to the workers (see `attention_runs`).
        let mut f32_runs = Vec::with_capacity(runs.len());
        for r in runs {
            let kv = (f32s(node, r.kv.0)?, f32s(node, r.kv.1)?);
            f32_runs.push(kernels::AttnRun { args: attn_args(m, r.q, r.positions, kv), out: r.out });
        }
        return f32_attention(node, cx, &mut f32_runs);
    }
    for r in runs {
        attention_run(node, cx, (r.q, r.positions), r.kv, r.out)?;
    }
    Ok(())
}

/// The tokens of one sequence in a batched attention node: their queries and positions, the
/// K and V regions from the sequence's first cell on, and their rows of the result.
struct SeqRun<'a> {
    q: &'a [f32],
    positions: &'a [i32],
    kv: (&'a [u8], &'a [u8]),
    out: &'a mut [f32],
}

/// Attention of `runs` over f32 KV regions, with the kernels `cx` asks for.
fn f32_attention(node: &CNode, cx: &KernelCtx, runs: &mut [kernels::AttnRun]) -> Result<(), GraphError> {
    let pool = cx.pool(node)?;
    match cx.isa {
        KernelIsa::Detected => kernels::attention_runs(pool, runs),
        KernelIsa::Scalar => kernels::attention_runs_with(Isa::Scalar, pool, runs),
    }
    .map_err(kernel(node))
}

/// The kernel's arguments for the queries `q` at `positions` over the regions `k`, `v`.
fn attn_args<'a>(m: &AttnMeta, q: &'a [f32], positions: &'a [i32], (k, v): (&'a [f32], &'a [f32])) -> AttnArgs<'a> {
    AttnArgs { q, k_cache: k, v_cache: v, positions, n_head: m.n_head, n_head_kv: m.n_head_kv, head_dim: m.head_dim, scale: m.scale, window: m.window }
}

/// Attention of tokens of one sequence whose cells start at the first row of `k` and `v`.
fn attention_run(node: &CNode, cx: &KernelCtx, (q, positions): (&[f32], &[i32]), (k, v): (&[u8], &[u8]), out: &mut [f32]) -> Result<(), GraphError> {
    let NodeMeta::Attn(m) = &node.meta else { return Err(wrong_meta(node, "attn")) };
    let (k, v) = (f32s(node, k)?, f32s(node, v)?);
    let args = attn_args(m, q, positions, (k, v));
    if m.kv_type == KvType::F32 {
        return f32_attention(node, cx, &mut [kernels::AttnRun { args, out }]);
    }
    let pool = cx.pool(node)?;
    match m.kv_type {
        KvType::Q8_0 if fused_q8_kv() => {
            let kv = PackedKv { k: bytemuck::cast_slice(k), v: bytemuck::cast_slice(v) };
            kernels::attention_q8::attention_q8(pool, &args, kv, out).map_err(kernel(node))
        }
        // f16, and q8_0 with MINFER_NO_FUSED_Q8_KV=1: dequantize the cells in use, then the
        // f32 path.
        t => attention_dequantized(pool, t, &args, (k, v), out).map_err(kernel(node)),
    }
}

/// The packed Q8_0 KV read of attention, unless `MINFER_NO_FUSED_Q8_KV=1` asks for the
/// dequantizing read (for A/B measurements). Read once.
fn fused_q8_kv() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FUSED.get_or_init(|| std::env::var("MINFER_NO_FUSED_Q8_KV").map_or(true, |v| v != "1"))
}

/// KV store: src = [k, v, pos]; writes rows `pos[t]` of the layer's K and V regions.
pub fn kv_store(node: &CNode, (k, v, pos): (&[u8], &[u8], &[u8]), (kr, vr): (&mut [u8], &mut [u8])) -> Result<(), GraphError> {
    let NodeMeta::Kvcache(m) = &node.meta else { return Err(wrong_meta(node, "kvcache")) };
    let (kr, vr) = (f32s_mut(node, kr)?, f32s_mut(node, vr)?);
    kv_store_typed((m.kv_type, m.head_dim), f32s(node, k)?, f32s(node, v)?, i32s(node, pos)?, m.n_ctx, kr, vr).map_err(kernel(node))
}

/// K-shift: src = [deltas]; every cell with a non-zero delta has its K row decoded, rotated by
/// the delta and encoded again (rotations compose: position `p` becomes `p + delta`).
pub fn kv_shift(node: &CNode, isa: Isa, deltas: &[u8], kr: &mut [u8]) -> Result<(), GraphError> {
    let NodeMeta::KvShift(m) = &node.meta else { return Err(wrong_meta(node, "kv_shift")) };
    let deltas = i32s(node, deltas)?;
    let (t, width, hd) = (m.kv.kv_type, m.kv.n_embd_kv, m.kv.head_dim);
    let rb = t.row_bytes(width);
    if deltas.len() != m.kv.n_ctx || kr.len() < rb * m.kv.n_ctx {
        return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: m.kv.n_ctx, got: deltas.len() });
    }
    let mut plain = vec![0.0f32; width];
    for (cell, &delta) in deltas.iter().enumerate().filter(|(_, d)| **d != 0) {
        let row = &mut kr[cell * rb..(cell + 1) * rb];
        decode_row(t, hd, row, &mut plain).map_err(kernel(node))?;
        // One cos/sin table for the delta, every style through the graph's own RoPE.
        rope_in_place(node, &mut plain, &[delta], (&m.rope, m.style), (None, isa))?;
        encode_row(t, hd, &plain, row).map_err(kernel(node))?;
    }
    Ok(())
}
