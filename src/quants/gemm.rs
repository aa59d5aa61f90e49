//! Many-token matrix products (prefill) that give, for every output element, the bits of the
//! single-token dot of the x86 kernels ([`Kernels::dot`](super::simd::Kernels::dot)).
//!
//! # Why the bits can be the same
//!
//! ggml's x86 `vec_dot` for a 32-value block type (Q4_0, Q5_0, Q8_0 · Q8_0; Q4_1 · Q8_1) sums, per block,
//! the products of values `4k..4k+4` into i32 lane `k` of 8, converts the lanes to f32 and
//! accumulates `acc[k] = fma(d_w * d_a, lane[k], acc[k])`; the row's result is
//! `hsum_float_8(acc)`. The lane integers are exact, so *how* they are computed is free; only
//! the float steps fix the result. The GEMM here computes the same lane integers another way
//! and runs the same float steps, so prefill (many tokens) equals decode (one token) bit for
//! bit while doing far less work per multiply-add:
//!
//! * **row lanes**: each weight block is unpacked once per tile of rows (not once per token)
//!   into registers of 16 rows, 4 bytes per row: ggml's lane `k` of 16 rows side by side. One
//!   `vpdpbusd` with the token's 4 activation bytes broadcast yields lane `k` of 16 rows, and
//!   the scale product `d_w * d_a` is one multiply for 16 rows and all 8 lanes;
//! * the quants are stored **unsigned**, `u = q + off` (`off` = 16 for Q5_0, 128 for
//!   Q8_0, 0 for Q4_1, whose nibbles are unsigned already), as `vpdpbusd` multiplies u8 by i8; the offset comes back through the
//!   activations' per-lane correction `corr[k] = -off * Σ a[4k..4k+4]`, the register's start
//!   value: `Σ (u - off)·a = corr + Σ u·a`, exactly.
//!
//! ggml's `sign_epi8` trick computes `x · -128` wrong for `x < 0`; minfer's exact integers
//! differ from ggml's only there, and ggml's x86 activation quantizers never produce -128.
//!
//! # Map
//!
//! * [`Block32Gemm`]: the weight types this GEMM takes (Q5_0, Q8_0, and Q4_1 with its mins:
//!   `Σ m·s` over the blocks added after `hsum_float_8`, as ggml's `q4_1_q8_1`; a Q4_0 matrix of
//!   16k rows is one llama.cpp repacks, whose gemv order this lane order is not), their offset
//!   and unpacking.
//! * [`B32Tile`]: unpacked weight rows in row lanes; [`B32Panel`]: the tokens' corrections
//!   and scales.
//! * [`b32_cell_scalar`] with [`tile_scalar`]: the scalar twin of the SIMD kernels (same lane
//!   integers, same float order), which the tests compare them with.

use super::F16Le;
use super::blocks::{BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};

/// A weight type of 32-value blocks multiplied with Q8_0 activations (Q8_1 for Q4_1) by
/// `vec_dot`'s lane order.
pub trait Block32Gemm: Copy {
    /// `u = q + OFFSET` is the unsigned byte the kernels multiply.
    const OFFSET: i32;
    /// Whether the type has a min (Q4_1: `x = d·q + m`, dotted with Q8_1 activations, whose
    /// `m·s` per block ggml sums beside the lanes and adds after `hsum_float_8`).
    const HAS_MIN: bool = false;
    /// The block's 32 unsigned quants in value order, and its scale as f32.
    fn unpack(&self) -> ([u8; 32], f32);
    /// The block's min as stored (zero for types without one).
    fn min(&self) -> F16Le {
        F16Le([0, 0])
    }
}

/// The 32 nibbles of `qs` in value order (low nibbles, then high), plus bit `i` of `high`
/// shifted to bit 4 of value `i` (one pass the compiler vectorizes).
#[inline]
fn nibbles_with_bit(qs: &[u8; 16], high: u32) -> [u8; 32] {
    let mut u = [0u8; 32];
    for j in 0..16 {
        u[j] = (qs[j] & 0x0f) | ((((high >> j) & 1) as u8) << 4);
        u[j + 16] = (qs[j] >> 4) | ((((high >> (j + 16)) & 1) as u8) << 4);
    }
    u
}

impl Block32Gemm for BlockQ5_0 {
    const OFFSET: i32 = 16;
    fn unpack(&self) -> ([u8; 32], f32) {
        (nibbles_with_bit(&self.qs, u32::from_le_bytes(self.qh)), self.d.to_f32())
    }
}

impl Block32Gemm for BlockQ4_1 {
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    fn unpack(&self) -> ([u8; 32], f32) {
        (nibbles_with_bit(&self.qs, 0), self.d.to_f32())
    }
    fn min(&self) -> F16Le {
        self.m
    }
}

impl Block32Gemm for BlockQ8_0 {
    const OFFSET: i32 = 128;
    fn unpack(&self) -> ([u8; 32], f32) {
        (self.qs.map(|q| (q as u8) ^ 0x80), self.d.to_f32())
    }
}

/// Rows per register of the row-lane layout.
pub const LANES: usize = 16;

/// A weight tile in row lanes, filled from `[rows][per_row]` blocks of `B` (`rows` a multiple
/// of [`LANES`], `per_row > 0`), reusing its memory.
pub trait RowLaneTile<B>: Default {
    fn fill(&mut self, blocks: &[B], per_row: usize);
}

/// The row-lane geometry of `n_blocks` blocks in rows of `per_row`: `(vecs, vecs * per_row)`,
/// the number of 16-row groups and of (group, block) slots.
pub fn lane_groups(n_blocks: usize, per_row: usize) -> (usize, usize) {
    let vecs = n_blocks.checked_div(per_row).unwrap_or(0) / LANES;
    (vecs, vecs * per_row)
}

/// The row-lane walk every tile's `fill` shares: `f(vb, lane, block)` for every block of
/// `blocks` (`[rows][per_row]`) in whole row groups, `vb = v * per_row + b` the slot of block
/// `b` of row group `v` and `lane` the row's place in its group.
pub fn for_each_lane_block<B>(blocks: &[B], per_row: usize, mut f: impl FnMut(usize, usize, &B)) {
    let (vecs, _) = lane_groups(blocks.len(), per_row);
    for v in 0..vecs {
        for lane in 0..LANES {
            let row = &blocks[(v * LANES + lane) * per_row..][..per_row];
            for (b, blk) in row.iter().enumerate() {
                f(v * per_row + b, lane, blk);
            }
        }
    }
}

/// `v` with `n` elements, keeping its allocation and, where the length already was `n`, its
/// old contents: a tile's `fill` overwrites every element, so a buffer reused for the next rows
/// of the same matrix is not cleared first.
pub fn reset<T: Clone>(v: &mut Vec<T>, n: usize, x: T) {
    v.resize(n, x);
}

/// Writes values `4i..4i+4` of `q` into bytes `4*lane..4*lane+4` of `groups[i]`, for every `i`.
pub fn put_lane_groups(groups: &mut [[u8; 64]], lane: usize, q: &[u8]) {
    for (g, four) in groups.iter_mut().zip(q.chunks_exact(4)) {
        g[4 * lane..4 * lane + 4].copy_from_slice(four);
    }
}

/// 32-value-block rows unpacked into row lanes, `vecs` groups of [`LANES`] rows, `per_row`
/// blocks each. With `vb = v * per_row + b` (row group `v`, block `b`): `q[vb * 8 + k]` holds
/// the unsigned quants of values `4k..4k+4` of each of the 16 rows (4 bytes per row, rows in
/// order), `d[vb]` the 16 rows' scales, and for a type with a min (Q4_1) `m[vb]` their mins
/// (else `m` is empty).
#[derive(Debug, Clone, Default)]
pub struct B32Tile {
    pub q: Vec<[u8; 64]>,
    pub d: Vec<[f32; LANES]>,
    pub m: Vec<[f32; LANES]>,
    pub vecs: usize,
    pub per_row: usize,
    /// The weight type's [`Block32Gemm::OFFSET`] (kernels without VNNI read Q8_0 as signed).
    pub offset: i32,
}

impl<W: Block32Gemm> RowLaneTile<W> for B32Tile {
    fn fill(&mut self, blocks: &[W], per_row: usize) {
        let (vecs, n) = lane_groups(blocks.len(), per_row);
        reset(&mut self.q, n * 8, [0; 64]);
        reset(&mut self.d, n, [0.0; LANES]);
        reset(&mut self.m, if W::HAS_MIN { n } else { 0 }, [0.0; LANES]);
        for_each_lane_block(blocks, per_row, |vb, lane, blk| {
            let (q, d) = blk.unpack();
            put_lane_groups(&mut self.q[vb * 8..][..8], lane, &q);
            self.d[vb][lane] = d;
            if W::HAS_MIN {
                self.m[vb][lane] = blk.min().to_f32();
            }
        });
        (self.vecs, self.per_row, self.offset) = (vecs, per_row, W::OFFSET);
    }
}

/// Tokens quantized to Q8_0, with what the kernels add per block: `corr[t][b]`, the 8 lanes'
/// `-off * Σ a[4k..4k+4]`, and `da[t][b]`, the scale as f32. For weights with a min (Q4_1,
/// whose activations are Q8_1), `sa[t][b]` is the block's `s` as f32; else `sa` is empty.
#[derive(Debug, Clone, Default)]
pub struct B32Panel<'a> {
    pub acts: Vec<&'a [BlockQ8_0]>,
    pub corr: Vec<Vec<[i32; 8]>>,
    pub da: Vec<Vec<f32>>,
    pub sa: Vec<Vec<f32>>,
}

/// A row of Q8_1 blocks as a [`B32Panel`] reads it: the same quants and scales as Q8_0 blocks,
/// and the blocks' `s` as f32 (for [`B32Panel::sa`]).
pub fn split_q8_1(acts: &[BlockQ8_1]) -> (Vec<BlockQ8_0>, Vec<f32>) {
    acts.iter().map(|b| (BlockQ8_0 { d: b.d, qs: b.qs }, b.s.to_f32())).unzip()
}

impl<'a> B32Panel<'a> {
    /// The panel of `acts` (each a row of Q8_0 blocks) for weights of offset `off`.
    pub fn new(acts: Vec<&'a [BlockQ8_0]>, off: i32) -> B32Panel<'a> {
        let corr = acts
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| {
                        std::array::from_fn(|k| {
                            -off * b.qs[4 * k..4 * k + 4].iter().map(|&q| i32::from(q)).sum::<i32>()
                        })
                    })
                    .collect()
            })
            .collect();
        let da = acts
            .iter()
            .map(|row| row.iter().map(|b| b.d.to_f32()).collect())
            .collect();
        B32Panel { acts, corr, da, sa: Vec::new() }
    }
}

/// Whether `out` has a piece of at least `rows` values for each of `tokens` tokens, and each
/// token's activation row `lens` holds `n` blocks: the shapes every tile kernel checks before
/// it writes anything.
pub fn shapes_fit(out: &[&mut [f32]], rows: usize, n: usize, mut lens: impl Iterator<Item = usize>) -> bool {
    out.iter().all(|o| o.len() >= rows) && lens.all(|l| l == n)
}

impl<'a> B32Panel<'a> {
    /// The panel of Q8_1 tokens for Q4_1 weights (offset 0): `acts` and `sa` are the tokens'
    /// Q8_0 parts and sums, as [`split_q8_1`] gives them.
    pub fn with_sums(acts: Vec<&'a [BlockQ8_0]>, sa: Vec<Vec<f32>>) -> B32Panel<'a> {
        B32Panel { sa, ..B32Panel::new(acts, BlockQ4_1::OFFSET) }
    }

    /// Whether a tile kernel may run `tile` against this panel into `out`: a piece of every
    /// tile row for each token, each token's rows of `tile.per_row` blocks, and for a tile
    /// with mins, the tokens' sums (`sa`) and a min per slot.
    pub fn fits(&self, tile: &B32Tile, out: &[&mut [f32]]) -> bool {
        let lens = self.acts.iter().map(|a| a.len());
        let lens = lens.chain(self.corr.iter().map(|c| c.len())).chain(self.da.iter().map(|d| d.len()));
        let mins = tile.m.is_empty()
            || (tile.m.len() == tile.d.len() && self.sa.len() == self.acts.len() && self.sa.iter().all(|s| s.len() == tile.per_row));
        let slots = tile.vecs * tile.per_row;
        let tokens = self.acts.len();
        mins && tile.d.len() == slots
            && tile.q.len() == 8 * slots
            && self.corr.len() == tokens
            && self.da.len() == tokens
            && out.len() >= tokens
            && shapes_fit(out, tile.vecs * LANES, tile.per_row, lens)
    }
}

/// ggml's `hsum_float_8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
pub fn hsum_float_8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// One (row, token): the dot of weight row `w` with activation row `a` in `vec_dot`'s x86 lane
/// order, computed as the kernels do (unsigned quants plus the offset correction). For types
/// without a min (Q5_0, Q8_0): a Q4_1 row's `m·s` sums need the Q8_1 sums, which `a` lacks; its
/// tiles are checked against the x86 dot instead.
pub fn b32_cell_scalar<W: Block32Gemm>(w: &[W], a: &[BlockQ8_0]) -> f32 {
    debug_assert!(!W::HAS_MIN, "b32_cell_scalar has no Q8_1 sums for a type with a min");
    let mut acc = [0.0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let (u, dw) = x.unpack();
        let dd = dw * y.d.to_f32();
        for (k, lane) in acc.iter_mut().enumerate() {
            let isum: i32 = (4 * k..4 * k + 4)
                .map(|i| (i32::from(u[i]) - W::OFFSET) * i32::from(y.qs[i]))
                .sum();
            *lane = dd.mul_add(isum as f32, *lane);
        }
    }
    hsum_float_8(&acc)
}

/// `out[t][r] = cell(row r of blocks, acts[t])` for every row of `blocks` (`[rows][per_row]`)
/// and every token, one element at a time: with a `*_cell_scalar` (or `gemv::gemv_q4_k`) as
/// `cell`, the scalar twin of a SIMD tile kernel.
pub fn tile_scalar<B, A>(
    blocks: &[B],
    per_row: usize,
    acts: &[&[A]],
    out: &mut [&mut [f32]],
    cell: impl Fn(&[B], &[A]) -> f32,
) {
    for (o, a) in out.iter_mut().zip(acts) {
        for (r, row) in blocks.chunks(per_row).enumerate() {
            o[r] = cell(row, a);
        }
    }
}
