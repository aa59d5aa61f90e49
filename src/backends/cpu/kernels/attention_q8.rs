//! Attention read straight out of a packed Q8_0 KV region (no dequantized copy).
//!
//! For query token `t`, head `h`:
//! 1. the head's query (`head_dim` values, a multiple of 32) is rotated as the cells are
//!    (llama.cpp's Hadamard rotation, see [`hadamard`](super::hadamard)) and quantized to
//!    Q8_0, as ggml quantizes the activation of a Q8_0 `mul_mat`;
//! 2. score `j` is the Q8_0 x Q8_0 dot of cell `j`'s key blocks with it, ggml's `vec_dot_q8_0`
//!    order: per block `isum * (d_k * d_q)`, summed over the head's blocks;
//! 3. scale, mask and softmax as in the f32 path;
//! 4. the output accumulates `p_j * d_v * q_v[i]` cell by cell, out of the packed V rows,
//!    and is rotated back.
//!
//! The f32 path on dequantized rows (`MINFER_NO_FUSED_Q8_KV=1`) quantizes nothing in step 1
//! and so differs from this one by the query's rounding: both are within the q8_0 tolerance
//! of the f32 cache, not bitwise equal.

use super::attention::{AttnArgs, row_base};
use super::error::{OpsError, check_len};
use super::hadamard::rotate_heads;
use super::isa::{Isa, Kernels};
use super::kv_cache::q8_blocks;
use crate::workers::Pool;
use super::softmax::{mask_scale, normalize_k};
use crate::tensor::KvType;
use crate::quants::{BlockQ8_0, quantize_row_q8_0};

/// Packed regions: `[n_ctx]` rows of `row_bytes` bytes, Q8_0 blocks.
#[derive(Debug, Clone, Copy)]
pub struct PackedKv<'a> {
    pub k: &'a [u8],
    pub v: &'a [u8],
}

/// `i8 x i8` dot of one block (32 products summed in i32: exact; each product fits i16).
fn isum(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| i32::from(i16::from(x) * i16::from(y))).sum()
}

/// Attention of every (token, head) of `args` (whose `k_cache` / `v_cache` are ignored) over
/// the packed regions, into `out`.
pub fn attention_q8(pool: &Pool, args: &AttnArgs, kv: PackedKv, out: &mut [f32]) -> Result<(), OpsError> {
    let hd = args.head_dim;
    if hd == 0 || !hd.is_multiple_of(32) {
        return Err(OpsError::BadDim { what: "q8_0 attention head_dim", value: hd, why: "must be a multiple of 32" });
    }
    if args.n_head == 0 || args.n_head_kv == 0 || !args.n_head.is_multiple_of(args.n_head_kv) {
        return Err(OpsError::HeadGroups { n_head: args.n_head, n_head_kv: args.n_head_kv });
    }
    let nt = args.positions.len();
    check_len("attention q", nt * args.n_head * hd, args.q.len())?;
    check_len("attention output", args.q.len(), out.len())?;
    let width = args.n_head_kv * hd;
    let rb = KvType::Q8_0.row_bytes(width);
    let n_ctx = kv.k.len() / rb;
    check_len("attention v region", kv.k.len(), kv.v.len())?;
    for (token, &pos) in args.positions.iter().enumerate() {
        if pos < 0 || pos as usize >= n_ctx {
            return Err(OpsError::Position { token, pos, n_ctx });
        }
    }
    let k = Isa::detected().kernels();
    let group = args.n_head / args.n_head_kv;
    // One item per (token, KV head): the group's query heads share every block read.
    pool.for_each_item_mut(out, group * hd, |item, piece| {
        let (t, kvh) = (item / args.n_head_kv, item % args.n_head_kv);
        kv_head(k, args, kv, (rb, group), t, kvh, piece);
    });
    Ok(())
}

/// Blocks `blocks` of cell `j`'s row.
fn cell(region: &[u8], j: usize, rb: usize, blocks: std::ops::Range<usize>) -> &[BlockQ8_0] {
    &q8_blocks(&region[j * rb..(j + 1) * rb])[blocks]
}

/// The `group` query heads of KV head `kvh` for token `t`, into `out` (`group * head_dim`).
fn kv_head(k: Kernels, a: &AttnArgs, kv: PackedKv, (rb, group): (usize, usize), t: usize, kvh: usize, out: &mut [f32]) {
    let hd = a.head_dim;
    let nb = hd / 32;
    // Cells `first..n` are attended; the rows run from `base` (see `row_base`).
    let (first, n) = a.span(t);
    let base = row_base(first);
    let (lo, len) = (first - base, n - base);
    // The cells hold H·k: each query is rotated the same way (see `hadamard`), then quantized.
    let mut qb = vec![BlockQ8_0::default(); group * nb];
    for (g, blocks) in qb.chunks_exact_mut(nb).enumerate() {
        let mut q = a.q[(t * a.n_head + kvh * group + g) * hd..][..hd].to_vec();
        rotate_heads(&mut q, hd);
        // hd is a multiple of 32 (checked), so this cannot fail.
        let _ = quantize_row_q8_0(&q, blocks);
    }
    let dq: Vec<f32> = qb.iter().map(|b| b.d.to_f32()).collect();
    let blk = kvh * nb; // the KV head's first block in a row

    // Scores: per query head, per block `isum * (d_k * d_q)` summed in block order.
    let padded = len.div_ceil(16) * 16;
    let mut kq = vec![0.0f32; group * padded];
    for j in lo..len {
        for (b, kb) in cell(kv.k, base + j, rb, blk..blk + nb).iter().enumerate() {
            let dk = kb.d.to_f32();
            for g in 0..group {
                kq[g * padded + j] += isum(&kb.qs, &qb[g * nb + b].qs) as f32 * (dk * dq[g * nb + b]);
            }
        }
    }
    let mut w = vec![0.0f32; padded];
    for g in 0..group {
        let row = &mut kq[g * padded..(g + 1) * padded];
        mask_scale(row, a.scale, lo..len, &mut w);
        normalize_k(k, &w, row);
    }

    // Σ p·(H v), out of the packed V rows, each block decoded once for the whole group.
    out.iter_mut().for_each(|o| *o = 0.0);
    let mut vals = [0.0f32; 32];
    for j in lo..len {
        for (b, vb) in cell(kv.v, base + j, rb, blk..blk + nb).iter().enumerate() {
            let dv = vb.d.to_f32();
            for (x, &q) in vals.iter_mut().zip(&vb.qs) {
                *x = f32::from(q);
            }
            for g in 0..group {
                let s = kq[g * padded + j] * dv;
                let o = &mut out[g * hd + b * 32..][..32];
                for (x, v) in o.iter_mut().zip(&vals) {
                    *x += s * v;
                }
            }
        }
    }
    // H (Σ p·H v) = Σ p·v: rotate back.
    rotate_heads(out, hd);
}
