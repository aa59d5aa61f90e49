//! The CUDA backend's node kernels: one function per op, mapping a node (its meta, its
//! operand addresses) onto launches of the kernels in `kernels/*.cu`. Activations are
//! token-major `[nt][d]` f32, ids and positions i32, KV regions rows of their `KvType`: the
//! same layouts as the CPU backend, so a split can move between them by plain copies.
//!
//! Launch shapes (why):
//! * element-wise, RoPE, KV store/shift: one thread per element (pair, chunk, head), 256 per
//!   block, grid-stride with at most [`MAX_GRID`] blocks;
//! * RMS norm / q-k norm: one block of 256 threads per row (a block-wide sum);
//! * matmul: the activations quantized first (one thread per block), then one warp per
//!   (row, tile of 8 tokens), 4 warps per block: each weight block is decoded once per tile;
//!   float weights skip the quantization (generic kernel, one warp per (row, token));
//! * get_rows: one block per output row;
//! * attention: one warp per (token, head, split of the cells), 4 warps per block, then one warp
//!   per (token, head) merging the splits: a long context spreads one query over the GPU.

use std::collections::HashMap;

use super::device::{Arg, DevPtr, Device, DeviceError, FuncId, Launch};
use super::kernels;
use crate::graph::{CNode, GraphError, KvType, NodeMeta, Op, RopeStyle};
use crate::quants::GgmlType;

/// The most blocks a grid-stride launch uses.
pub const MAX_GRID: u64 = 65_535;
/// Threads per block of the element-wise launches.
const BLOCK: u32 = 256;
/// Warps per block of the matmuls.
const MATMUL_WARPS: u32 = 4;
/// Tokens per warp of the 8-bit matmul (`TILE_T` in matmul_q8.cu).
const Q8_TILE_TOKENS: usize = 8;
/// Warps per block of the attention kernels (`ATTN_WARPS` in attention.cu).
const ATTN_WARPS: u32 = 4;
/// Tokens per attention launch pair (bounds the partials' scratch; results do not depend on it).
pub const ATTN_TOKEN_GROUP: usize = 64;
/// The most splits of a token's cells.
const MAX_SPLITS: usize = 64;

/// `(chunk, n_splits)` of an attention over `n_ctx` cells: splits of at least 128 cells, at most
/// [`MAX_SPLITS`] of them, a function of `n_ctx` alone (so a token's result is the same however
/// many tokens run together).
pub fn attn_split(n_ctx: usize) -> (usize, usize) {
    let chunk = n_ctx.div_ceil(MAX_SPLITS).next_multiple_of(32).max(128);
    (chunk, n_ctx.div_ceil(chunk).max(1))
}

/// Scratch bytes of the attention partials for `nt` tokens.
pub fn attn_scratch_bytes(m: &crate::graph::AttnMeta, nt: usize) -> usize {
    let (_, n_splits) = attn_split(m.n_ctx);
    nt.min(ATTN_TOKEN_GROUP) * m.n_head * n_splits * (m.head_dim + 2) * 4
}

/// The widest head the attention and K-shift kernels hold (`MAX_HD` in the sources).
pub const MAX_HEAD_DIM: usize = 256;

/// The kernel-name suffix of a storage type (`matmul_q4_k`), for every type the sources have.
pub const fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_1 => "q5_1",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q2K => "q2_k",
        GgmlType::Q3K => "q3_k",
        GgmlType::Q4K => "q4_k",
        GgmlType::Q5K => "q5_k",
        GgmlType::Q6K => "q6_k",
        GgmlType::Q8_1 | GgmlType::Q8K => return None,
    })
}

/// The activation block a quantized weight type is multiplied with (ggml's `vec_dot_type`):
/// 32 values for the 32-element types, 256 for the K-quants; `None` for the float types, which
/// run the generic matmul.
pub const fn q8_block(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => Some(32),
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => Some(256),
        _ => None,
    }
}

/// Scratch bytes for `nt` tokens of `cols` activations quantized for `ty`: the i8 values, then
/// an f32 pair `(d, s)` per block (16-byte aligned between the two).
pub fn q8_scratch_bytes(ty: GgmlType, cols: usize, nt: usize) -> Option<usize> {
    q8_block(ty).map(|b| (nt * cols).next_multiple_of(16) + nt * (cols / b) * 8)
}

/// Bytes of one row of `cols` values of `ty` (whole blocks).
pub fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_size() * ty.type_size()
}

const fn kv_suffix(t: KvType) -> &'static str {
    match t {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Q8_0 => "q8_0",
    }
}

/// Are rows of this KV type stored rotated (the CPU's rule: Q8_0, heads a multiple of 64)?
pub const fn kv_rotated(t: KvType, head_dim: usize) -> bool {
    matches!(t, KvType::Q8_0) && head_dim > 0 && head_dim.is_multiple_of(64)
}

/// ggml's `theta_scale = freq_base^(-2 / n_rot)`.
fn theta_scale(freq_base: f32, n_rot: usize) -> f32 {
    freq_base.powf(-2.0 / n_rot as f32)
}

/// A weight as the device holds it.
#[derive(Debug, Clone, Copy)]
pub enum DevWeight {
    /// `rows` rows of `cols` values of `ty`, `row_bytes` apart.
    Matrix { ptr: DevPtr, ty: GgmlType, rows: usize, cols: usize },
    /// f32 values (norm weights, biases).
    Vector { ptr: DevPtr, len: usize },
}

/// One node's resolved operands: device addresses and byte sizes.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub ptr: DevPtr,
    pub bytes: usize,
}

impl Region {
    fn f32s(&self) -> usize {
        self.bytes / 4
    }
}

/// The functions loaded so far, by kernel name, over one device.
pub struct Launcher<'d> {
    pub dev: &'d mut dyn Device,
    pub funcs: &'d mut HashMap<String, FuncId>,
    /// Device scratch for quantized activations, at least [`q8_scratch_bytes`] of the node.
    pub scratch: Option<Region>,
}

fn launch_err(node: &CNode, e: DeviceError) -> GraphError {
    GraphError::Kernel { node: node.name.clone(), source: Box::new(e) }
}

fn wrong_meta(node: &CNode, expected: &'static str) -> GraphError {
    GraphError::WrongMeta { node: node.name.clone(), expected, found: node.meta.kind_name() }
}

fn grid_for(n: u64) -> u32 {
    n.div_ceil(BLOCK as u64).clamp(1, MAX_GRID) as u32
}

impl Launcher<'_> {
    fn func(&mut self, source: &'static str, name: &str) -> Result<FuncId, DeviceError> {
        if let Some(&f) = self.funcs.get(name) {
            return Ok(f);
        }
        let src = kernels::source(source).ok_or_else(|| DeviceError::new(format!("kernel {name}"), format!("no source {source}")))?;
        let f = self.dev.function(src, name)?;
        self.funcs.insert(name.to_string(), f);
        Ok(f)
    }

    fn go(&mut self, node: &CNode, source: &'static str, name: &str, shape: Launch, args: &[Arg]) -> Result<(), GraphError> {
        let f = self.func(source, name).map_err(|e| launch_err(node, e))?;
        self.dev.launch(f, shape, args).map_err(|e| launch_err(node, e))
    }

    fn flat(n: u64) -> Launch {
        Launch { grid: grid_for(n), block: BLOCK, shared: 0 }
    }

    /// Ops whose output is a function of their operands (and weights): everything but the
    /// KV ops and attention.
    pub fn run(&mut self, node: &CNode, weight: &dyn Fn(crate::graph::WeightId) -> Result<DevWeight, GraphError>, srcs: &[Region], out: Region) -> Result<(), GraphError> {
        let src = |i: usize| srcs.get(i).copied().ok_or(GraphError::OperandCount { node: node.name.clone(), expected: i + 1, got: srcs.len() });
        let n = out.f32s() as u64;
        let d = node.out_shape[0];
        let same_len = |r: Region, i: usize| -> Result<(), GraphError> {
            match r.bytes == out.bytes {
                true => Ok(()),
                false => Err(GraphError::OperandLength { node: node.name.clone(), operand: i, expected: out.f32s(), got: r.f32s() }),
            }
        };
        // An optional 1-D weight of `len` values (a norm weight, a bias): its address, or 0.
        let vector = |id: Option<crate::graph::WeightId>, len: usize, what: &'static str| match id.map(weight).transpose()? {
            None => Ok(0),
            Some(DevWeight::Vector { ptr, len: got }) if got == len => Ok(ptr),
            Some(DevWeight::Vector { len: got, .. }) => Err(GraphError::DimMismatch { node: node.name.clone(), what, expected: len, got }),
            Some(DevWeight::Matrix { .. }) => Err(wrong_meta(node, "a 1-D weight")),
        };
        match &node.op {
            Op::Add | Op::Mul => {
                let (a, b) = (src(0)?, src(1)?);
                same_len(a, 0)?;
                let nb = b.f32s() as i64;
                if nb == 0 || out.f32s() as i64 % nb != 0 {
                    return Err(GraphError::OperandLength { node: node.name.clone(), operand: 1, expected: out.f32s(), got: b.f32s() });
                }
                let name = if matches!(node.op, Op::Add) { "add_f32" } else { "mul_f32" };
                self.go(node, "elementwise.cu", name, Self::flat(n), &[Arg::Ptr(a.ptr), Arg::Ptr(b.ptr), Arg::Ptr(out.ptr), Arg::I64(n as i64), Arg::I64(nb)])
            }
            Op::Silu => {
                let x = src(0)?;
                same_len(x, 0)?;
                self.go(node, "elementwise.cu", "silu_f32", Self::flat(n), &[Arg::Ptr(x.ptr), Arg::Ptr(out.ptr), Arg::I64(n as i64)])
            }
            Op::Scale { s } => {
                let x = src(0)?;
                same_len(x, 0)?;
                self.go(node, "elementwise.cu", "scale_f32", Self::flat(n), &[Arg::Ptr(x.ptr), Arg::Ptr(out.ptr), Arg::F32(*s), Arg::I64(n as i64)])
            }
            Op::Gelu => {
                let x = src(0)?;
                same_len(x, 0)?;
                self.go(node, "elementwise.cu", "gelu_f32", Self::flat(n), &[Arg::Ptr(x.ptr), Arg::Ptr(out.ptr), Arg::I64(n as i64)])
            }
            Op::GeGLU => {
                let (g, u) = (src(0)?, src(1)?);
                same_len(g, 0)?;
                same_len(u, 1)?;
                self.go(node, "elementwise.cu", "geglu_f32", Self::flat(n), &[Arg::Ptr(g.ptr), Arg::Ptr(u.ptr), Arg::Ptr(out.ptr), Arg::I64(n as i64)])
            }
            Op::SwiGLU => {
                let (g, u) = (src(0)?, src(1)?);
                same_len(g, 0)?;
                same_len(u, 1)?;
                self.go(node, "elementwise.cu", "swiglu_f32", Self::flat(n), &[Arg::Ptr(g.ptr), Arg::Ptr(u.ptr), Arg::Ptr(out.ptr), Arg::I64(n as i64)])
            }
            Op::RmsNorm { eps } | Op::QkNorm { eps, .. } => {
                let x = src(0)?;
                same_len(x, 0)?;
                let row = match node.op {
                    Op::QkNorm { hd, .. } => hd,
                    _ => d,
                };
                let NodeMeta::Norm(m) = &node.meta else { return Err(wrong_meta(node, "norm")) };
                if m.weight.is_none() && matches!(node.op, Op::QkNorm { .. }) {
                    return Err(wrong_meta(node, "a q/k norm weight"));
                }
                let w = vector(m.weight, row, "norm weight")?;
                if row == 0 || !out.f32s().is_multiple_of(row) {
                    return Err(GraphError::DimMismatch { node: node.name.clone(), what: "norm rows", expected: row, got: out.f32s() });
                }
                let rows = (out.f32s() / row) as u32;
                if rows == 0 {
                    return Ok(());
                }
                let shape = Launch { grid: rows, block: BLOCK, shared: 0 };
                self.go(node, "norm.cu", "rms_norm_f32", shape, &[Arg::Ptr(x.ptr), Arg::Ptr(w), Arg::Ptr(out.ptr), Arg::I32(row as i32), Arg::F32(*eps)])
            }
            Op::MatMul => {
                let NodeMeta::MatMul(m) = &node.meta else { return Err(wrong_meta(node, "matmul")) };
                let DevWeight::Matrix { ptr: w, ty, rows, cols } = weight(m.weight)? else { return Err(wrong_meta(node, "a 2-D weight")) };
                let x = src(0)?;
                if cols == 0 || x.f32s() % cols != 0 {
                    return Err(GraphError::DimMismatch { node: node.name.clone(), what: "matmul input width", expected: cols, got: x.f32s() });
                }
                let nt = x.f32s() / cols;
                if out.f32s() != nt * rows {
                    return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: nt * rows, got: out.f32s() });
                }
                let bias = vector(m.bias, rows, "bias")?;
                let suffix = type_suffix(ty).ok_or_else(|| GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() })?;
                let items = (rows * nt) as u64;
                let shape = Launch { grid: items.div_ceil(MATMUL_WARPS as u64).max(1) as u32, block: MATMUL_WARPS * 32, shared: 0 };
                let rb = Arg::I64(row_bytes(ty, cols) as i64);
                let dims = [Arg::I32(rows as i32), Arg::I32(cols as i32), Arg::I32(nt as i32), rb];
                match (q8_block(ty), q8_scratch_bytes(ty, cols, nt)) {
                    (Some(block), Some(need)) if nt > 0 => {
                        let scratch = self.scratch.filter(|r| r.bytes >= need).ok_or_else(|| launch_err(node, DeviceError::new("matmul", format!("no scratch of {need} bytes for the quantized activations"))))?;
                        let (qs, ds) = (scratch.ptr, scratch.ptr + (nt * cols).next_multiple_of(16) as u64);
                        let quantize = if block == 32 { "quantize_q8_32" } else { "quantize_q8_k" };
                        let blocks = (nt * cols / block) as u64;
                        self.go(node, "matmul_q8.cu", quantize, Self::flat(blocks.max(1)), &[Arg::Ptr(x.ptr), Arg::Ptr(qs), Arg::Ptr(ds), Arg::I32(cols as i32), Arg::I32(nt as i32)])?;
                        let mut args = vec![Arg::Ptr(w), Arg::Ptr(qs), Arg::Ptr(ds), Arg::Ptr(bias), Arg::Ptr(out.ptr)];
                        args.extend(dims);
                        let tiles = (rows * nt.div_ceil(Q8_TILE_TOKENS)) as u64;
                        let shape = Launch { grid: tiles.div_ceil(MATMUL_WARPS as u64).max(1) as u32, block: MATMUL_WARPS * 32, shared: 0 };
                        self.go(node, "matmul_q8.cu", &format!("matmul_q8_{suffix}"), shape, &args)
                    }
                    _ => {
                        let mut args = vec![Arg::Ptr(w), Arg::Ptr(x.ptr), Arg::Ptr(bias), Arg::Ptr(out.ptr)];
                        args.extend(dims);
                        self.go(node, "matmul.cu", &format!("matmul_{suffix}"), shape, &args)
                    }
                }
            }
            Op::GetRows => match &node.meta {
                NodeMeta::Embed(m) => {
                    let DevWeight::Matrix { ptr, ty, rows, cols } = weight(m.weight)? else { return Err(wrong_meta(node, "a 2-D weight")) };
                    let ids = src(0)?;
                    let n_ids = ids.bytes / 4;
                    if out.f32s() != n_ids * cols {
                        return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: out.f32s() / cols.max(1), got: n_ids });
                    }
                    let suffix = type_suffix(ty).ok_or_else(|| GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() })?;
                    self.get_rows(node, suffix, (ptr, rows, cols, row_bytes(ty, cols)), ids, n_ids, out)
                }
                _ => {
                    let (x, ids) = (src(0)?, src(1)?);
                    let n_ids = ids.bytes / 4;
                    if d == 0 || out.f32s() != n_ids * d || x.f32s() % d != 0 {
                        return Err(GraphError::OperandLength { node: node.name.clone(), operand: 1, expected: out.f32s() / d.max(1), got: n_ids });
                    }
                    self.get_rows(node, "f32", (x.ptr, x.f32s() / d, d, 4 * d), ids, n_ids, out)
                }
            },
            Op::RoPE { style } => {
                let NodeMeta::Rope(m) = &node.meta else { return Err(wrong_meta(node, "rope")) };
                let (x, pos) = (src(0)?, src(1)?);
                same_len(x, 0)?;
                let width = m.n_head * m.head_dim;
                if width == 0 || !out.f32s().is_multiple_of(width) {
                    return Err(GraphError::DimMismatch { node: node.name.clone(), what: "rope width", expected: width, got: out.f32s() });
                }
                let nt = out.f32s() / width;
                if pos.bytes / 4 != nt {
                    return Err(GraphError::OperandLength { node: node.name.clone(), operand: 1, expected: nt, got: pos.bytes / 4 });
                }
                let pairs = (nt * m.n_head * (m.n_rot / 2)).max(nt * m.n_head * (m.head_dim - m.n_rot)) as u64;
                let neox = matches!(style, RopeStyle::NonInterleaved) as i32;
                let args = [
                    Arg::Ptr(x.ptr),
                    Arg::Ptr(out.ptr),
                    Arg::Ptr(pos.ptr),
                    Arg::I32(nt as i32),
                    Arg::I32(m.n_head as i32),
                    Arg::I32(m.head_dim as i32),
                    Arg::I32(m.n_rot as i32),
                    Arg::F32(theta_scale(m.freq_base, m.n_rot)),
                    Arg::I32(neox),
                ];
                self.go(node, "rope.cu", "rope_f32", Self::flat(pairs.max(1)), &args)
            }
            _ => Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() }),
        }
    }

    /// Rows `ids` of a `[n_rows][n_cols]` matrix (`row_bytes` apart) of the type `suffix` names.
    fn get_rows(&mut self, node: &CNode, suffix: &str, (src, n_rows, n_cols, row_bytes): (DevPtr, usize, usize, usize), ids: Region, n_ids: usize, out: Region) -> Result<(), GraphError> {
        if n_ids == 0 {
            return Ok(());
        }
        let shape = Launch { grid: n_ids as u32, block: BLOCK, shared: 0 };
        let args = [Arg::Ptr(src), Arg::Ptr(ids.ptr), Arg::Ptr(out.ptr), Arg::I32(n_cols as i32), Arg::I64(row_bytes as i64), Arg::I32(n_rows as i32)];
        self.go(node, "get_rows.cu", &format!("get_rows_{suffix}"), shape, &args)
    }

    /// Attention: `q` `[nt][n_head * head_dim]`, positions `[nt]`, the layer's K and V regions;
    /// split over the cells ([`attn_split`]) into the scratch, then combined, for tokens in
    /// groups of [`ATTN_TOKEN_GROUP`].
    /// With `cells` (regions several sequences share) token `t` attends its own sequence's
    /// cells, which start at `cells[t] - pos[t]`.
    pub fn attention(&mut self, node: &CNode, (q, pos, cells): (Region, Region, Option<Region>), (k, v): (Region, Region), out: Region) -> Result<(), GraphError> {
        let NodeMeta::Attn(m) = &node.meta else { return Err(wrong_meta(node, "attn")) };
        let width = m.n_head * m.head_dim;
        let nt = pos.bytes / 4;
        let cells = cells.unwrap_or(pos);
        if cells.bytes != pos.bytes {
            return Err(GraphError::OperandLength { node: node.name.clone(), operand: 3, expected: nt, got: cells.bytes / 4 });
        }
        if out.f32s() != nt * width || q.f32s() != nt * width {
            return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: nt * width, got: q.f32s() });
        }
        let region = m.kv_type.region_bytes(m.n_embd_kv(), m.n_ctx);
        if k.bytes < region || v.bytes < region {
            return Err(GraphError::KvRegionSize { layer: m.layer, have: k.bytes.min(v.bytes), want: region });
        }
        if nt == 0 {
            return Ok(());
        }
        let (chunk, n_splits) = attn_split(m.n_ctx);
        let need = attn_scratch_bytes(m, nt);
        let part = self.scratch.filter(|r| r.bytes >= need).ok_or_else(|| launch_err(node, DeviceError::new("attention", format!("no scratch of {need} bytes for the split partials"))))?;
        let rotate = Arg::I32(kv_rotated(m.kv_type, m.head_dim) as i32);
        let split = format!("attn_split_{}", kv_suffix(m.kv_type));
        for t0 in (0..nt).step_by(ATTN_TOKEN_GROUP) {
            let g = ATTN_TOKEN_GROUP.min(nt - t0);
            let (q_at, out_at, pos_at) = (q.ptr + (t0 * width * 4) as u64, out.ptr + (t0 * width * 4) as u64, pos.ptr + (t0 * 4) as u64);
            let cells_at = cells.ptr + (t0 * 4) as u64;
            let warps = (g * m.n_head * n_splits) as u64;
            let shape = Launch { grid: warps.div_ceil(ATTN_WARPS as u64) as u32, block: ATTN_WARPS * 32, shared: 0 };
            let args = [
                Arg::Ptr(q_at),
                Arg::Ptr(k.ptr),
                Arg::Ptr(v.ptr),
                Arg::Ptr(pos_at),
                Arg::Ptr(cells_at),
                Arg::Ptr(part.ptr),
                Arg::I32(g as i32),
                Arg::I32(m.n_head as i32),
                Arg::I32(m.n_head_kv as i32),
                Arg::I32(m.head_dim as i32),
                Arg::F32(m.scale),
                Arg::I64(width as i64),
                rotate,
                Arg::I32(m.n_ctx as i32),
                Arg::I32(chunk as i32),
                Arg::I32(n_splits as i32),
                Arg::I32(m.window.map_or(0, |w| i32::try_from(w).unwrap_or(i32::MAX))),
            ];
            self.go(node, "attention.cu", &split, shape, &args)?;
            let heads = (g * m.n_head) as u64;
            let shape = Launch { grid: heads.div_ceil(ATTN_WARPS as u64) as u32, block: ATTN_WARPS * 32, shared: 0 };
            let args = [Arg::Ptr(part.ptr), Arg::Ptr(out_at), Arg::I32(g as i32), Arg::I32(m.n_head as i32), Arg::I32(m.head_dim as i32), Arg::I32(n_splits as i32), rotate];
            self.go(node, "attention.cu", "attn_combine", shape, &args)?;
        }
        Ok(())
    }

    /// KV store: rows `pos[t]` of the layer's K and V regions get this step's `k[t]`, `v[t]`.
    pub fn kv_store(&mut self, node: &CNode, (k, v, pos): (Region, Region, Region), (kr, vr): (Region, Region)) -> Result<(), GraphError> {
        let NodeMeta::Kvcache(m) = &node.meta else { return Err(wrong_meta(node, "kvcache")) };
        let nt = pos.bytes / 4;
        let width = m.n_embd_kv;
        if k.f32s() != nt * width || v.f32s() != nt * width {
            return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: nt * width, got: k.f32s().min(v.f32s()) });
        }
        if kr.bytes < m.region_bytes() || vr.bytes < m.region_bytes() {
            return Err(GraphError::KvRegionSize { layer: m.layer, have: kr.bytes.min(vr.bytes), want: m.region_bytes() });
        }
        if nt == 0 {
            return Ok(());
        }
        let name = format!("kv_store_{}", kv_suffix(m.kv_type));
        for (x, region) in [(k, kr), (v, vr)] {
            let mut args = vec![Arg::Ptr(x.ptr), Arg::Ptr(pos.ptr), Arg::Ptr(region.ptr), Arg::I32(nt as i32), Arg::I32(width as i32), Arg::I32(m.n_ctx as i32)];
            let items = match m.kv_type {
                KvType::Q8_0 => {
                    args.push(Arg::I32(kv_rotated(m.kv_type, m.head_dim) as i32));
                    (nt * width / 64) as u64
                }
                _ => (nt * width) as u64,
            };
            self.go(node, "kv.cu", &name, Self::flat(items.max(1)), &args)?;
        }
        Ok(())
    }

    /// K-shift: cells with a non-zero delta have their K rows rotated by it.
    pub fn kv_shift(&mut self, node: &CNode, deltas: Region, kr: Region) -> Result<(), GraphError> {
        let NodeMeta::KvShift(m) = &node.meta else { return Err(wrong_meta(node, "kv_shift")) };
        let n_cells = deltas.bytes / 4;
        if n_cells != m.kv.n_ctx || kr.bytes < m.kv.region_bytes() {
            return Err(GraphError::OperandLength { node: node.name.clone(), operand: 0, expected: m.kv.n_ctx, got: n_cells });
        }
        let hd = m.kv.head_dim;
        let n_head = m.kv.n_embd_kv / hd.max(1);
        let neox = matches!(m.style, RopeStyle::NonInterleaved) as i32;
        let args = [
            Arg::Ptr(kr.ptr),
            Arg::Ptr(deltas.ptr),
            Arg::I32(n_cells as i32),
            Arg::I32(n_head as i32),
            Arg::I32(hd as i32),
            Arg::I32(m.rope.n_rot as i32),
            Arg::F32(theta_scale(m.rope.freq_base, m.rope.n_rot)),
            Arg::I32(neox),
            Arg::I32(kv_rotated(m.kv.kv_type, hd) as i32),
        ];
        self.go(node, "kv.cu", &format!("kv_shift_{}", kv_suffix(m.kv.kv_type)), Self::flat(((n_cells * n_head) as u64).max(1)), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split-KV partition covers every cell once, in whole chunks of at least 128 cells
    /// (a multiple of 32), at most 64 splits, and depends on n_ctx alone.
    #[test]
    fn attention_splits_cover_the_context() {
        for n_ctx in [1, 64, 127, 128, 129, 1100, 4096, 8191, 32768, 100_000, 131_072] {
            let (chunk, n) = attn_split(n_ctx);
            assert!(chunk >= 128 && chunk.is_multiple_of(32), "n_ctx {n_ctx}: chunk {chunk}");
            assert!((1..=MAX_SPLITS).contains(&n), "n_ctx {n_ctx}: {n} splits");
            assert!(chunk * n >= n_ctx && chunk * (n - 1) < n_ctx, "n_ctx {n_ctx}: {n} x {chunk} is not a tight cover");
        }
        assert_eq!(attn_split(64), (128, 1));
        assert_eq!(attn_split(1100), (128, 9));
        assert_eq!(attn_split(4096), (128, 32));
        assert_eq!(attn_split(32768), (512, 64));
    }

    /// The q8 scratch holds the i8 values of every token, then a (d, s) f32 pair per block, the
    /// pairs 16-byte aligned; the K-quants pair with 256-value blocks, the rest with 32.
    #[test]
    fn quantized_activation_layout() {
        assert_eq!(q8_block(GgmlType::Q4K), Some(256));
        assert_eq!(q8_block(GgmlType::Q5_0), Some(32));
        assert_eq!(q8_block(GgmlType::F16), None);
        // 896 values x 3 tokens of Q8_0: 2688 bytes of values, 28 blocks x 3 x 8 bytes.
        assert_eq!(q8_scratch_bytes(GgmlType::Q8_0, 896, 3), Some(2688 + 28 * 3 * 8));
        // 4864 x 1 of Q6_K: 4864 bytes (a multiple of 16), 19 blocks x 8.
        assert_eq!(q8_scratch_bytes(GgmlType::Q6K, 4864, 1), Some(4864 + 19 * 8));
        // 7 tokens of 32: 224 -> 224 (aligned), 7 blocks.
        assert_eq!(q8_scratch_bytes(GgmlType::Q4_0, 32, 7), Some(224 + 7 * 8));
        assert_eq!(q8_scratch_bytes(GgmlType::Q4_0, 32, 1), Some(32 + 8));
        assert_eq!(q8_scratch_bytes(GgmlType::BF16, 32, 1), None);
    }

    #[test]
    fn every_weight_type_has_a_kernel_suffix_and_whole_rows() {
        for ty in GgmlType::WEIGHT_TYPES {
            assert!(type_suffix(ty).is_some(), "{ty:?}");
            let cols = 256 * 3;
            assert_eq!(row_bytes(ty, cols), cols / ty.block_size() * ty.type_size());
        }
        assert!(kv_rotated(KvType::Q8_0, 128) && !kv_rotated(KvType::Q8_0, 96) && !kv_rotated(KvType::F16, 128));
    }
}
