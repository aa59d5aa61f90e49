//! The CPU backend's node kernels: one function per op, mapping a node (its meta, its operand
//! buffers) onto the `crate::vec_ops` kernels. Buffers are token-major `[nt][d]` f32; I32 inputs
//! (ids, positions) are f32 bit patterns.

use super::backend::KvPair;
use super::error::GraphError;
use super::ops::{NodeMeta, Op};
use super::weights::WeightStore;
use super::{CNode, KvType};
use crate::vec_ops::attention_q8::PackedKv;
use crate::vec_ops::kv_cache::{attention_dequantized, kv_store_typed};
use crate::vec_ops::matmul::{WeightMatrix, matmul};
use crate::vec_ops::{self, AttnArgs, OpsError, Pool};

/// What kernels may need besides operands.
pub struct KernelCtx<'a> {
    pub weights: Option<&'a WeightStore>,
    pub pool: Option<&'a Pool>,
}

impl<'a> KernelCtx<'a> {
    fn weights(&self, node: &CNode) -> Result<&'a WeightStore, GraphError> {
        self.weights.ok_or_else(|| GraphError::NoModel { node: node.name.clone(), what: "the model's weights" })
    }

    fn pool(&self, node: &CNode) -> Result<&'a Pool, GraphError> {
        self.pool.ok_or_else(|| GraphError::NoModel { node: node.name.clone(), what: "worker threads" })
    }
}

/// I32 values stored as f32 bit patterns.
pub fn i32s(buf: &[f32]) -> Vec<i32> {
    buf.iter().map(|v| v.to_bits() as i32).collect()
}

fn kernel(node: &CNode) -> impl Fn(OpsError) -> GraphError + '_ {
    move |source| GraphError::Kernel { node: node.name.clone(), source }
}

fn wrong_meta(node: &CNode, expected: &'static str) -> GraphError {
    GraphError::WrongMeta { node: node.name.clone(), expected, found: node.meta.kind_name() }
}

fn norm_weight<'a>(node: &CNode, cx: &KernelCtx<'a>) -> Result<Option<&'a [f32]>, GraphError> {
    match &node.meta {
        NodeMeta::Norm(m) => match &m.weight_name {
            Some(name) => Ok(Some(cx.weights(node)?.vector(name)?)),
            None => Ok(None),
        },
        _ => Err(wrong_meta(node, "norm")),
    }
}

/// Row width of the node's output (`out_shape[0]`).
fn width(node: &CNode) -> usize {
    node.out_shape[0]
}

/// An operand: its own buffer, or `Aliased` when the allocator made it the output buffer itself
/// (Silu and RoPE in place).
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Buf(&'a [f32]),
    Aliased,
}

/// Ops whose output is a function of the operand buffers alone.
pub fn run(node: &CNode, cx: &KernelCtx, ins: &[Operand], dst: &mut [f32]) -> Result<(), GraphError> {
    let d = width(node);
    let count = || GraphError::OperandCount { node: node.name.clone(), expected: ins.len() + 1, got: ins.len() };
    // In-place RoPE rotates the output buffer as it stands; any other op reads a snapshot.
    if let (Op::RoPE { .. }, Some(Operand::Aliased)) = (&node.op, ins.first()) {
        let NodeMeta::Rope(m) = &node.meta else { return Err(wrong_meta(node, "rope")) };
        let Some(Operand::Buf(pos)) = ins.get(1) else { return Err(count()) };
        return vec_ops::rope_neox(dst, &i32s(pos), m.n_head, m.head_dim, m.freq_base).map_err(kernel(node));
    }
    let snapshot: Option<Vec<f32>> = ins.iter().any(|o| matches!(o, Operand::Aliased)).then(|| dst.to_vec());
    let operand = |i: usize| -> Result<&[f32], GraphError> {
        match ins.get(i) {
            Some(Operand::Buf(b)) => Ok(b),
            Some(Operand::Aliased) => Ok(snapshot.as_deref().unwrap_or(&[])),
            None => Err(count()),
        }
    };
    match &node.op {
        Op::Add => vec_ops::add(operand(0)?, operand(1)?, dst).map_err(kernel(node)),
        Op::Mul => vec_ops::mul(operand(0)?, operand(1)?, dst).map_err(kernel(node)),
        Op::Silu => vec_ops::silu(operand(0)?, d, dst).map_err(kernel(node)),
        Op::SwiGLU => vec_ops::swiglu(operand(0)?, operand(1)?, d, dst).map_err(kernel(node)),
        Op::RmsNorm { eps } => {
            let w = norm_weight(node, cx)?;
            vec_ops::rms_norm(operand(0)?, w, d, *eps, dst).map_err(kernel(node))
        }
        Op::QkNorm { hd, eps, .. } => {
            let w = norm_weight(node, cx)?.ok_or_else(|| wrong_meta(node, "a q/k norm weight"))?;
            vec_ops::qk_norm(operand(0)?, w, *hd, *eps, dst).map_err(kernel(node))
        }
        Op::MatMul { .. } => {
            let NodeMeta::MatMul(m) = &node.meta else { return Err(wrong_meta(node, "matmul")) };
            let weights = cx.weights(node)?;
            let w = weights.matrix(&m.weight_name)?;
            let bias = m.bias_name.as_deref().map(|b| weights.vector(b)).transpose()?;
            let w = WeightMatrix { ty: w.ty, data: w.data, rows: w.rows, cols: w.cols };
            matmul(cx.pool(node)?, &w, operand(0)?, bias, dst)
                .map_err(|source| GraphError::Matmul { node: node.name.clone(), source })
        }
        Op::GetRows => match &node.meta {
            // Embedding: src = [ids]; rows dequantized from the named weight.
            NodeMeta::Embed(m) => {
                let w = cx.weights(node)?.matrix(&m.weight_name)?;
                vec_ops::get_rows(w.ty, w.data, w.cols, &i32s(operand(0)?), dst).map_err(kernel(node))
            }
            // Tail rows: src = [x, ids].
            _ => vec_ops::select_rows(operand(0)?, d, &i32s(operand(1)?), dst).map_err(kernel(node)),
        },
        Op::RoPE { .. } => {
            let NodeMeta::Rope(m) = &node.meta else { return Err(wrong_meta(node, "rope")) };
            let x = operand(0)?;
            if x.len() != dst.len() {
                return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: dst.len(), got: x.len() });
            }
            dst.copy_from_slice(x);
            vec_ops::rope_neox(dst, &i32s(operand(1)?), m.n_head, m.head_dim, m.freq_base).map_err(kernel(node))
        }
        _ => Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() }),
    }
}

/// Attention: src = [q, kv_load, pos]; K and V come from the layer's persistent pair.
pub fn attention(node: &CNode, cx: &KernelCtx, q: &[f32], pos: &[f32], k: &[f32], v: &[f32], dst: &mut [f32]) -> Result<(), GraphError> {
    let NodeMeta::Attn(m) = &node.meta else { return Err(wrong_meta(node, "attn")) };
    let positions = i32s(pos);
    let args = AttnArgs {
        q,
        k_cache: k,
        v_cache: v,
        positions: &positions,
        n_head: m.n_head,
        n_head_kv: m.n_head_kv,
        head_dim: m.head_dim,
        scale: m.scale,
    };
    let pool = cx.pool(node)?;
    match m.kv_type {
        KvType::F32 => vec_ops::attention(pool, &args, dst).map_err(kernel(node)),
        KvType::Q8_0 if fused_q8_kv() => {
            let kv = PackedKv { k: bytemuck::cast_slice(k), v: bytemuck::cast_slice(v) };
            vec_ops::attention_q8::attention_q8(pool, &args, kv, dst).map_err(kernel(node))
        }
        // f16, and q8_0 with MINFER_NO_FUSED_Q8_KV=1: dequantize the cells in use, then the
        // f32 path.
        t => attention_dequantized(pool, t, &args, (k, v), dst).map_err(kernel(node)),
    }
}

/// The packed Q8_0 KV read of attention, unless `MINFER_NO_FUSED_Q8_KV=1` asks for the
/// dequantizing read (for A/B measurements). Read once.
fn fused_q8_kv() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FUSED.get_or_init(|| std::env::var("MINFER_NO_FUSED_Q8_KV").map_or(true, |v| v != "1"))
}

/// KV store: src = [k, v, pos]; writes rows `pos[t]` of the layer's K and V regions.
pub fn kv_store(node: &CNode, k: &[f32], v: &[f32], pos: &[f32], kv: (&mut [f32], &mut [f32]), n_ctx: usize) -> Result<(), GraphError> {
    let layout = match &node.meta {
        NodeMeta::Kvcache(m) => (m.kv_type, m.head_dim),
        _ => (KvType::F32, 0),
    };
    kv_store_typed(layout, k, v, &i32s(pos), n_ctx, kv.0, kv.1).map_err(kernel(node))
}

/// The pair a KV node needs, or an error naming the node.
pub fn require_kv(node: &CNode, kv: Option<KvPair>) -> Result<KvPair, GraphError> {
    let layer = node.kv_layer().unwrap_or(0);
    kv.ok_or_else(|| GraphError::KvMissing { node: node.name.clone(), layer })
}
