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

use super::dot::{DOT_STEP, SlotSum, dot_rows_k, fma_rows_group_k, reduce_slots, v_sums_reduced_k};
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
///
/// Work is split into tiles of queries that share their KV head: `tokens` consecutive tokens
/// times `heads` query heads of one KV group (see [`Tiling`]). A tile reads each chunk of K
/// and V cells once for all its queries, while it is in the core's cache, instead of once
/// per query; every query is still computed whole, by the same operations in the same order,
/// whatever tile it falls in.
pub fn attention_with(
    isa: Isa,
    pool: &Pool,
    args: &AttnArgs,
    out: &mut [f32],
) -> Result<(), OpsError> {
    attention_runs_with(isa, pool, &mut [AttnRun { args: *args, out }])
}

/// One sequence's share of a batch's attention: its tokens' queries, positions and KV regions
/// ([`AttnArgs`]) and where their results go (`[nt][n_head * head_dim]`).
pub struct AttnRun<'a> {
    pub args: AttnArgs<'a>,
    pub out: &'a mut [f32],
}

/// [`attention`] of several runs (the sequences of a batched pass) as one piece of parallel
/// work: every run's tiles go to the pool together, so a decode step of B sequences hands the
/// workers B runs' tiles at once instead of waking them B times for a few tiles each. Each
/// run is tiled as it would be alone, and every query is computed whole by the same code, so
/// the bits are those of [`attention`] run by run.
pub fn attention_runs(pool: &Pool, runs: &mut [AttnRun]) -> Result<(), OpsError> {
    attention_runs_with(Isa::detected(), pool, runs)
}

/// One run's arguments and how it is cut into tiles.
struct RunPlan<'a> {
    args: AttnArgs<'a>,
    g: Geometry,
    tiling: Tiling,
    /// Values per tile.
    item_len: usize,
}

impl RunPlan<'_> {
    /// Whether the run's tiles are written to a staging buffer and then moved to their rows
    /// (several tokens per tile) rather than straight into `out` (one token per tile: tiles are
    /// laid out as `out` is, `[t][kv head][sub-group][head]`).
    fn staged(&self) -> bool {
        self.tiling.tokens > 1
    }
}

/// [`attention_runs`] with the kernels of `isa` (or the best supported below it).
pub fn attention_runs_with(isa: Isa, pool: &Pool, runs: &mut [AttnRun]) -> Result<(), OpsError> {
    let k = isa.kernels();
    let plans = runs
        .iter()
        .map(|r| {
            let g = Geometry::check(&r.args)?;
            check_len("attention output", r.args.q.len(), r.out.len())?;
            let tiling = Tiling::new(r.args.positions.len(), &g, r.args.n_head_kv, pool.n_threads());
            Ok(RunPlan { args: r.args, item_len: tiling.tokens * tiling.heads * g.hd, g, tiling })
        })
        .collect::<Result<Vec<_>, OpsError>>()?;
    // Several tokens per tile: tiles write [block][kv head][sub-group][token][head][hd], then
    // their rows go to their places in `out`.
    let mut staging: Vec<Vec<f32>> = plans
        .iter()
        .map(|p| if p.staged() { vec![0.0; p.tiling.n_items(p.args.positions.len(), p.args.n_head_kv) * p.item_len] } else { Vec::new() })
        .collect();
    {
        // Every run's tiles: (run, tile, where it is written).
        let mut tiles: Vec<(usize, usize, &mut [f32])> = Vec::new();
        for (r, ((run, plan), stage)) in runs.iter_mut().zip(&plans).zip(staging.iter_mut()).enumerate() {
            let dst: &mut [f32] = if plan.staged() { stage } else { &mut *run.out };
            tiles.extend(dst.chunks_mut(plan.item_len.max(1)).enumerate().map(|(i, piece)| (r, i, piece)));
        }
        pool.for_each_item_mut_with(&mut tiles, 1, TileScratch::default, |scratch, _, t| {
            for (r, item, piece) in t.iter_mut() {
                let plan = &plans[*r];
                tile(k, &plan.args, &plan.g, &plan.tiling, *item, piece, scratch);
            }
        });
    }
    for ((run, plan), stage) in runs.iter_mut().zip(&plans).zip(&staging) {
        if !plan.staged() {
            continue;
        }
        let (a, g) = (&plan.args, &plan.g);
        let (nt, width) = (a.positions.len(), a.n_head * g.hd);
        for (item, piece) in stage.chunks_exact(plan.item_len).enumerate() {
            let (t0, h0) = plan.tiling.origin(item, a.n_head_kv, g.group);
            for (tt, rows) in piece.chunks_exact(plan.tiling.heads * g.hd).enumerate().take(nt.saturating_sub(t0)) {
                run.out[(t0 + tt) * width + h0 * g.hd..][..rows.len()].copy_from_slice(rows);
            }
        }
    }
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

/// How [`attention_with`] groups queries into tiles: `tokens` consecutive tokens times `heads`
/// consecutive query heads of one KV group (`heads` divides the group). Items run
/// block-major: item `i` is token block `i / (n_head_kv * subs)`, KV head
/// `(i / subs) % n_head_kv`, sub-group `i % subs`.
struct Tiling {
    tokens: usize,
    heads: usize,
    /// `group / heads`.
    subs: usize,
}

/// About how many queries a tile holds: enough to read each K and V chunk once for many of
/// them, few enough that their score rows and slot sums stay near the core.
const TILE_QUERIES: usize = 24;

impl Tiling {
    fn new(nt: usize, g: &Geometry, n_head_kv: usize, threads: usize) -> Tiling {
        // The largest divisor of the group that still gives every thread a tile.
        let heads = (1..=g.group)
            .rev()
            .find(|&h| g.group.is_multiple_of(h) && nt * n_head_kv * (g.group / h) >= threads)
            .unwrap_or(1);
        let subs = g.group / heads;
        // Tokens per tile: up to TILE_QUERIES queries, but at least 4 tiles per thread.
        let mut tokens = (TILE_QUERIES / heads).clamp(1, nt.max(1));
        while tokens > 1 && nt.div_ceil(tokens) * n_head_kv * subs < 4 * threads {
            tokens /= 2;
        }
        Tiling { tokens, heads, subs }
    }

    fn n_items(&self, nt: usize, n_head_kv: usize) -> usize {
        nt.div_ceil(self.tokens) * n_head_kv * self.subs
    }

    /// The first token and the first query head of tile `item`.
    fn origin(&self, item: usize, n_head_kv: usize, group: usize) -> (usize, usize) {
        let block = item / (n_head_kv * self.subs);
        let kv = (item / self.subs) % n_head_kv;
        let sub = item % self.subs;
        (block * self.tokens, kv * group + sub * self.heads)
    }
}

/// Cells of K a tile scores for all its queries before moving on (one chunk stays in L1).
const K_CHUNK: usize = 64;
/// Bytes of K rows a chunk holds at most: [`K_CHUNK`] cells of a 64-wide head (16 KiB), fewer
/// cells of wider heads (a chunk larger than L1 is read again from L2 for every query).
const K_CHUNK_BYTES: usize = 16 << 10;

/// Cells per K chunk for heads of `hd` values: a multiple of 16 (the score kernel's keys per
/// pass), from 16 to [`K_CHUNK`].
fn k_chunk(hd: usize) -> usize {
    (K_CHUNK_BYTES / (4 * hd.max(1)) / 16 * 16).clamp(16, K_CHUNK)
}

/// Cells of V a tile adds for all its queries before moving on (a multiple of 64).
const V_CHUNK: usize = 256;

/// Up to this many cells, the queries of a tile that share their cells (a decode token's
/// heads) take [`v_sums_reduced_k`]: every slot summed in registers and reduced at once, with
/// no slot rows (`64 * head_dim` values a query, 112 KiB for the 7 heads of 64 of a Qwen2.5-0.5B
/// token) to zero, fill and read back. It reads each V row once per 16 output dims, 64 rows
/// apart; past about 2000 cells the chunked slot rows are faster (`examples/attn_probe`, AMD
/// EPYC Zen 5, one thread, one token: 160 cells 25.4 -> 13.4 µs, 1000 cells 107 -> 86 µs,
/// 2000 cells 212 -> 214 µs, 4000 cells 403 -> 444 µs).
const REDUCED_MAX_CELLS: usize = 2048;


/// A worker's buffers, reused from tile to tile.
#[derive(Default)]
struct TileScratch {
    /// Per query, its row of scores, then of probabilities: `[query][row_cap]`.
    rows: Vec<f32>,
    /// The masked, scaled row of one query.
    w: Vec<f32>,
    /// Per query, its 64 slot accumulators: `[query][64][hd]`.
    acc: Vec<f32>,
}

/// One query of a tile: its values and the cells it attends.
struct Query<'a> {
    q: &'a [f32],
    /// Cells `first..n` are attended; its row runs from `base` (see [`row_base`]).
    first: usize,
    n: usize,
    base: usize,
}

impl Query<'_> {
    /// Row length, padded with masked entries to a multiple of 16 (see the module docs).
    fn padded(&self) -> usize {
        (self.n - self.base).div_ceil(16) * 16
    }
}

/// Tile `item` of `tiling` into `out` (`[token][head][hd]` for its tokens and heads).
fn tile(
    k: Kernels,
    a: &AttnArgs,
    g: &Geometry,
    tiling: &Tiling,
    item: usize,
    out: &mut [f32],
    scratch: &mut TileScratch,
) {
    let hd = g.hd;
    let nt = a.positions.len();
    let (t0, h0) = tiling.origin(item, a.n_head_kv, g.group);
    let kv_head = h0 / g.group;
    // The tile's queries, token-major: query `tt * heads + i` is token t0 + tt, head h0 + i.
    let queries: Vec<Query> = (t0..(t0 + tiling.tokens).min(nt))
        .flat_map(|t| {
            let (first, n) = a.span(t);
            (h0..h0 + tiling.heads).map(move |h| Query {
                q: &a.q[(t * a.n_head + h) * hd..][..hd],
                first,
                n,
                base: row_base(first),
            })
        })
        .collect();
    let nq = queries.len();
    // Row `j` of these is cell j's head: `[j * kv_width..][..hd]`.
    let (k_rows, v_rows) = (&a.k_cache[kv_head * hd..], &a.v_cache[kv_head * hd..]);
    let row_cap = queries.iter().map(Query::padded).max().unwrap_or(0);
    let start = queries.iter().map(|q| q.base).min().unwrap_or(0);
    let end = queries.iter().map(|q| q.n).max().unwrap_or(0);
    scratch.rows.clear();
    scratch.rows.resize(nq * row_cap, 0.0);
    scratch.w.resize(row_cap, 0.0);

    // Scores, a chunk of K cells at a time for every query: entry `j - base` of a row is
    // cell j's score (the masked entries stay 0 and are masked below).
    let k_cells = k_chunk(hd);
    for c0 in (start..end).step_by(k_cells) {
        let c1 = (c0 + k_cells).min(end);
        for (qr, row) in queries.iter().zip(scratch.rows.chunks_exact_mut(row_cap.max(1))) {
            let (lo, hi) = (c0.max(qr.first), c1.min(qr.n));
            if lo < hi {
                dot_rows_k(k, qr.q, &k_rows[lo * g.kv_width..], g.kv_width, &mut row[lo - qr.base..hi - qr.base]);
            }
        }
    }
    // Softmax of each row, in place.
    for (qr, row) in queries.iter().zip(scratch.rows.chunks_exact_mut(row_cap.max(1))) {
        let (padded, w) = (qr.padded(), &mut scratch.w[..qr.padded()]);
        mask_scale(&row[..padded], a.scale, qr.first - qr.base..qr.n - qr.base, w);
        normalize_k(k, w, &mut row[..padded]);
    }
    // kqv: slot j % 64 of a query accumulates its cells j (from its base: the masked cells
    // before the window add exact zeros), for all head_dim output dims at once.
    // A decode token's heads (one span for every query): each query's slots summed and
    // reduced in registers, straight into `out`.
    if end - start <= REDUCED_MAX_CELLS && queries.iter().all(|qr| (qr.base, qr.n) == (start, end)) {
        // By index: with no cell attended (a window of 0 at a multiple of 64) the rows are
        // empty, and every query still gets its (zero) result.
        let probs: Vec<&[f32]> = (0..nq).map(|i| &scratch.rows[i * row_cap..][..end - start]).collect();
        if v_sums_reduced_k(k, hd, &probs, &v_rows[start * g.kv_width..], g.kv_width, out) {
            return;
        }
    }
    scratch.acc.clear();
    scratch.acc.resize(nq * DOT_STEP * hd, 0.0);
    let mut sums: Vec<SlotSum> = queries
        .iter()
        .zip(scratch.rows.chunks_exact(row_cap.max(1)))
        .zip(scratch.acc.chunks_exact_mut(DOT_STEP * hd))
        .map(|((qr, row), acc)| SlotSum { acc, probs: &row[..qr.n - qr.base], from: qr.base })
        .collect();
    for c0 in (start..end).step_by(V_CHUNK) {
        let c1 = (c0 + V_CHUNK).min(end);
        fma_rows_group_k(k, hd, &mut sums, v_rows, g.kv_width, c0..c1);
    }
    drop(sums);
    for (acc, o) in scratch.acc.chunks_exact(DOT_STEP * hd).zip(out.chunks_exact_mut(hd)) {
        reduce_slots(acc, hd, o);
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
