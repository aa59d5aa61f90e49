//! Grouped-query attention over an f32 KV region, and the store of new K/V rows into it.
//!
//! Mirrors llama.cpp's non-flash attention in its single-token (decode) path, the one the
//! reference data comes from, for query token `t` (position `p`) and head `h` (KV head
//! `h / (n_head / n_head_kv)`):
//!
//! 1. `kq = mul_mat(k, q)`: score `j` (for cells `0..=p`) is `ggml_vec_dot_f32(head_dim, k_j,
//!    q)`, see [`dot_f32`](super::dot::dot_f32);
//! 2. `soft_max_ext(kq, mask, scale)`: the row of scores times `scale`, cells past `p` masked,
//!    see [`softmax`](super::softmax) (llama.cpp's row is the 256-padded KV window; its
//!    masked tail adds only exact zeros, so a row padded to 16 gives the same bits);
//! 3. `kqv = mul_mat(v, kq)` with V stored transposed (flash attention off): output dim `d`
//!    is `ggml_vec_dot_f32(n_kv, v[.., d], probs)`. `n_kv` is a multiple of 64 there, so all of
//!    it goes through the four 16-lane accumulators: cell `j` lands in accumulator
//!    `(j/16) % 4`, lane `j % 16`. Here the 64 (accumulator, lane) slots are rows of
//!    `head_dim` accumulators, one per output dim, filled by FMA in cell order from the
//!    token-major V rows, then reduced with the same tree for every dim at once.
//!
//! The masked cells of llama.cpp's window contribute `0 * v`, which leaves an accumulator
//! unchanged except that it would turn a -0 into +0; minfer skips them, so a zero output may
//! differ from llama.cpp's in its sign only.
//!
//! Every (token, head) is computed whole by one worker with the same code, whatever the batch
//! and the thread count: a token's result is bit-identical in a prefill and in a decode step.
//! (llama.cpp's own batched path runs `kqv` through llamafile's sgemm and is not batch
//! invariant; minfer follows its single-token path for every batch size.)

use super::dot::{DOT_STEP, dot_rows_k, fma_rows_k};
use super::error::{OpsError, check_len, rows_of};
use super::isa::{Isa, Kernels};
use crate::workers::Pool;
use super::softmax::{mask_scale, normalize_k};

/// The inputs of [`attention`].
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs<'a> {
    /// `[nt][n_head * head_dim]`, already normed and rotated.
    pub q: &'a [f32],
    /// `[n_ctx][n_head_kv * head_dim]`, token-major: cell `j` holds the key of position `j`.
    pub k_cache: &'a [f32],
    /// `[n_ctx][n_head_kv * head_dim]`, token-major, as `k_cache`.
    pub v_cache: &'a [f32],
    /// `[nt]`: token `t` attends cells `0..=positions[t]`.
    pub positions: &'a [i32],
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Score scale, `1/sqrt(head_dim)` for Qwen.
    pub scale: f32,
    /// Sliding window: token `t` attends only cells `positions[t] - window < j <= positions[t]`;
    /// `None` attends all of `0..=positions[t]`.
    pub window: Option<usize>,
}

impl AttnArgs<'_> {
    /// The cells token `t` (at a validated position) attends: `first..n`.
    pub(crate) fn span(&self, t: usize) -> (usize, usize) {
        let n = self.positions[t] as usize + 1;
        let first = match self.window {
            Some(w) => n.saturating_sub(w),
            None => 0,
        };
        (first, n)
    }
}

/// The cell a windowed row starts at: the window's first cell rounded down to a multiple of
/// 64. llama.cpp's row starts at cell 0 with the cells before the window masked; those add
/// exact zeros to the softmax's 16-value blocks and to the 64 slots of the V sum, so a row
/// that starts at a multiple of 64 (16 and 64 both divide it) gives the same bits.
pub(crate) const fn row_base(first: usize) -> usize {
    first / DOT_STEP * DOT_STEP
}

/// Attention of every (token, head) into `out`, `[nt][n_head * head_dim]`.
pub fn attention(pool: &Pool, args: &AttnArgs, out: &mut [f32]) -> Result<(), OpsError> {
    attention_with(Isa::detected(), pool, args, out)
}

/// [`attention`] with the kernels of `isa` (or the best supported below it); same result.
pub fn attention_with(
    isa: Isa,
    pool: &Pool,
    args: &AttnArgs,
    out: &mut [f32],
) -> Result<(), OpsError> {
    let g = Geometry::check(args)?;
    check_len("attention output", args.q.len(), out.len())?;
    let k = isa.kernels();
    pool.for_each_item_mut(out, g.hd, |item, piece| {
        let (t, h) = (item / args.n_head, item % args.n_head);
        head(k, args, &g, t, h, piece);
    });
    Ok(())
}

/// Validated shapes.
struct Geometry {
    hd: usize,
    /// `n_head / n_head_kv`.
    group: usize,
    /// `n_head_kv * head_dim`, the width of a cache row.
    kv_width: usize,
}

impl Geometry {
    fn check(a: &AttnArgs) -> Result<Geometry, OpsError> {
        let hd = a.head_dim;
        if hd == 0 {
            return Err(OpsError::BadDim {
                what: "head_dim",
                value: 0,
                why: "heads must have values",
            });
        }
        if a.n_head == 0 || a.n_head_kv == 0 || !a.n_head.is_multiple_of(a.n_head_kv) {
            return Err(OpsError::HeadGroups {
                n_head: a.n_head,
                n_head_kv: a.n_head_kv,
            });
        }
        let nt = a.positions.len();
        check_len("attention q", nt * a.n_head * hd, a.q.len())?;
        let kv_width = a.n_head_kv * hd;
        let n_ctx = rows_of("attention k_cache", a.k_cache.len(), kv_width)?;
        check_len("attention v_cache", a.k_cache.len(), a.v_cache.len())?;
        for (token, &pos) in a.positions.iter().enumerate() {
            if pos < 0 || pos as usize >= n_ctx {
                return Err(OpsError::Position { token, pos, n_ctx });
            }
        }
        Ok(Geometry {
            hd,
            group: a.n_head / a.n_head_kv,
            kv_width,
        })
    }
}

/// One (token, head): scores, softmax, weighted sum of V, into `out` (`head_dim` values).
fn head(k: Kernels, a: &AttnArgs, g: &Geometry, t: usize, h: usize, out: &mut [f32]) {
    let hd = g.hd;
    // Validated: 0 <= positions[t] < n_ctx. Cells `first..n` are attended; the row runs from
    // `base`, cell `base + i` being entry `i`.
    let (first, n) = a.span(t);
    let base = row_base(first);
    let (lo, len) = (first - base, n - base);
    let q = &a.q[(t * a.n_head + h) * hd..][..hd];
    let kv_off = base * g.kv_width + (h / g.group) * hd;
    // Row i of these is cell (base + i)'s head: `[i * kv_width..][..hd]`.
    let (k_rows, v_rows) = (&a.k_cache[kv_off..], &a.v_cache[kv_off..]);

    // Scores, padded with masked entries to a multiple of 16 (see the module docs).
    let padded = len.div_ceil(16) * 16;
    let mut kq = vec![0.0f32; padded];
    dot_rows_k(k, q, &k_rows[lo * g.kv_width..], g.kv_width, &mut kq[lo..len]);
    let mut w = vec![0.0f32; padded];
    mask_scale(&kq, a.scale, lo..len, &mut w);
    let probs = &mut kq;
    normalize_k(k, &w, probs);

    // kqv: slot (base + i) % 64 = i % 64 accumulates cell base + i, for all head_dim output
    // dims at once (the masked cells before the window add exact zeros).
    let slots = len.min(DOT_STEP);
    let mut acc = vec![0.0f32; slots * hd];
    fma_rows_k(k, &mut acc, hd, &probs[..len], v_rows, g.kv_width);
    reduce_slots(&acc, hd, out);
}

/// The reduction of ggml_vec_dot_f32 applied to `head_dim` dot products at once: slot `s`
/// (`s < 64`; absent slots are +0, what an accumulator lane holds when no cell reached it)
/// is lane `s % 16` of accumulator `s / 16`; the accumulators combine as
/// `(a0 + a2) + (a1 + a3)`, then the 16 lanes by the `_mm512_reduce_add_ps` tree. Every step
/// is an element-wise sum of rows, the same additions per output dim as ggml's.
fn reduce_slots(acc: &[f32], hd: usize, out: &mut [f32]) {
    let zero = vec![0.0f32; hd];
    let slot = |s: usize| acc.get(s * hd..(s + 1) * hd).unwrap_or(&zero);
    let mut lanes = vec![0.0f32; 16 * hd];
    for (l, lane) in lanes.chunks_exact_mut(hd).enumerate() {
        let (a0, a1, a2, a3) = (slot(l), slot(16 + l), slot(32 + l), slot(48 + l));
        for d in 0..hd {
            lane[d] = (a0[d] + a2[d]) + (a1[d] + a3[d]);
        }
    }
    // 16 -> 8 -> 4 -> 2 lanes: lane l += lane l + half, in place (IEEE addition commutes, so
    // GCC's `high + low` is the same sum).
    for half in [8, 4, 2] {
        let (lo, hi) = lanes.split_at_mut(half * hd);
        for (x, y) in lo.iter_mut().zip(&hi[..half * hd]) {
            *x += *y;
        }
    }
    for ((o, x), y) in out.iter_mut().zip(&lanes[..hd]).zip(&lanes[hd..2 * hd]) {
        *o = x + y;
    }
}

/// The checks of a KV store, for any cell format: one K and one V row per cell, regions of
/// `region_len(width)` f32 slots, every cell inside `0..n_ctx`. Returns the row width, or
/// `None` when there is nothing to store.
pub(crate) fn check_store(
    k: &[f32],
    v: &[f32],
    cells: &[i32],
    n_ctx: usize,
    (k_region, v_region): (usize, usize),
    region_len: impl Fn(usize) -> usize,
) -> Result<Option<usize>, OpsError> {
    let nt = cells.len();
    check_len("kv_store v", k.len(), v.len())?;
    if nt == 0 {
        return check_len("kv_store k (no cells)", 0, k.len()).map(|_| None);
    }
    let width = rows_of("kv_store k (one row per cell)", k.len(), nt)?;
    if width == 0 {
        return Err(OpsError::BadDim {
            what: "kv_store row width",
            value: 0,
            why: "rows must have values",
        });
    }
    check_len("kv_store k region", region_len(width), k_region)?;
    check_len("kv_store v region", region_len(width), v_region)?;
    for (token, &cell) in cells.iter().enumerate() {
        if cell < 0 || cell as usize >= n_ctx {
            return Err(OpsError::Cell { token, cell, n_ctx });
        }
    }
    Ok(Some(width))
}

/// Stores the K and V rows of `cells.len()` tokens, `[nt][n_head_kv * head_dim]` each, into
/// rows `cells[t]` of the caches, `[n_ctx][n_head_kv * head_dim]`. Checks every cell before
/// writing anything.
pub fn kv_store(
    k: &[f32],
    v: &[f32],
    cells: &[i32],
    n_ctx: usize,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Result<(), OpsError> {
    let Some(width) = check_store(k, v, cells, n_ctx, (k_cache.len(), v_cache.len()), |w| n_ctx * w)? else {
        return Ok(());
    };
    for ((&cell, kr), vr) in cells
        .iter()
        .zip(k.chunks_exact(width))
        .zip(v.chunks_exact(width))
    {
        let c = cell as usize * width;
        k_cache[c..c + width].copy_from_slice(kr);
        v_cache[c..c + width].copy_from_slice(vr);
    }
    Ok(())
}
