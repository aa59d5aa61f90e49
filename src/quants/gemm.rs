//! Many-token matrix products (prefill) that give, for every output element, the bits of the
//! single-token dot of the x86 kernels ([`Kernels::dot`](super::simd::Kernels::dot)).
//!
//! # Why the bits can be the same
//!
//! ggml's x86 `vec_dot` for a 32-value block type (Q4_0, Q5_0, Q8_0 · Q8_0) sums, per block,
//! the products of values `4k..4k+4` into i32 lane `k` of 8, converts the lanes to f32 and
//! accumulates `acc[k] = fma(d_w * d_a, lane[k], acc[k])`; the row's result is
//! `hsum_float_8(acc)`. The lane integers are exact, so *how* they are computed is free; only
//! the float steps fix the result. The GEMM here computes the same lane integers another way
//! and runs the same float steps, so prefill (many tokens) equals decode (one token) bit for
//! bit while doing far less work per multiply-add:
//!
//! * each weight block is unpacked once per row tile (not once per token) to **unsigned**
//!   bytes `u = q + off` (`off` = 8 for Q4_0, 16 for Q5_0, 128 for Q8_0), so `vpdpbusd`
//!   (u8 × i8) multiplies it with activations without ggml's `sign_epi8` trick;
//! * the offset comes back through a per-lane correction of the activations,
//!   `corr[k] = -off * Σ a[4k..4k+4]`, computed once per token and block:
//!   `Σ (u - off)·a = corr + Σ u·a`, exactly;
//! * two tokens share one 512-bit register ([`PairBlock`]): lanes 0..8 are token `2p`'s 8
//!   lanes, lanes 8..16 token `2p + 1`'s.
//!
//! ggml's `sign_epi8` trick computes `x · -128` wrong for `x < 0`; minfer's exact integers
//! differ from ggml's only there, and ggml's x86 activation quantizers never produce -128.
//!
//! # Map
//!
//! * [`Block32Gemm`]: the weight types this GEMM takes, their offset and unpacking.
//! * [`B32Tile`]: unpacked weight rows; [`B32Panel`]: quantized tokens in pairs.
//! * [`b32_tile_scalar`]: the scalar twin of the SIMD tile kernels (same lane integers, same
//!   float order), which the tests compare them with.

use super::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};

/// The activations of two tokens for one 32-value block, as the GEMM kernels read them.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
pub struct PairBlock {
    /// Token `2p`'s 32 quants, then token `2p + 1`'s.
    pub qs: [i8; 64],
    /// `-off * Σ qs[4k..4k+4]` per lane, 8 lanes per token (lanes 0..8 token `2p`).
    pub corr: [i32; 16],
    /// Each token's activation scale, 8 copies each.
    pub da: [f32; 16],
}
const _: () = assert!(size_of::<PairBlock>() == 192);

impl Default for PairBlock {
    fn default() -> Self {
        PairBlock {
            qs: [0; 64],
            corr: [0; 16],
            da: [0.0; 16],
        }
    }
}

/// A weight type of 32-value blocks multiplied with Q8_0 activations by `vec_dot`'s lane order.
pub trait Block32Gemm: Copy {
    /// `u = q + OFFSET` is the unsigned byte the kernels multiply.
    const OFFSET: i32;
    /// The block's 32 unsigned quants in value order, and its scale as f32.
    fn unpack(&self) -> ([u8; 32], f32);
}

impl Block32Gemm for BlockQ4_0 {
    const OFFSET: i32 = 8;
    fn unpack(&self) -> ([u8; 32], f32) {
        (self.quants().map(|q| (q + 8) as u8), self.d.to_f32())
    }
}

impl Block32Gemm for BlockQ5_0 {
    const OFFSET: i32 = 16;
    fn unpack(&self) -> ([u8; 32], f32) {
        (self.quants().map(|q| (q + 16) as u8), self.d.to_f32())
    }
}

impl Block32Gemm for BlockQ8_0 {
    const OFFSET: i32 = 128;
    fn unpack(&self) -> ([u8; 32], f32) {
        (self.qs.map(|q| (i32::from(q) + 128) as u8), self.d.to_f32())
    }
}

/// Weight rows unpacked for the kernels: row `r`'s block `b` is `q[r * per_row + b]` with scale
/// `d[r * per_row + b]`.
#[derive(Debug, Clone, Default)]
pub struct B32Tile {
    pub q: Vec<[u8; 32]>,
    pub d: Vec<f32>,
    pub rows: usize,
    pub per_row: usize,
}

impl B32Tile {
    /// Unpacks `blocks` (`[rows][per_row]`, `per_row > 0`) into `self`, reusing its memory.
    pub fn fill<W: Block32Gemm>(&mut self, blocks: &[W], per_row: usize) {
        self.q.clear();
        self.d.clear();
        for b in blocks {
            let (q, d) = b.unpack();
            self.q.push(q);
            self.d.push(d);
        }
        self.per_row = per_row;
        self.rows = blocks.len().checked_div(per_row).unwrap_or(0);
    }

    /// Row `r`'s unsigned quants and scales.
    pub fn row(&self, r: usize) -> (&[[u8; 32]], &[f32]) {
        let range = r * self.per_row..(r + 1) * self.per_row;
        (&self.q[range.clone()], &self.d[range])
    }
}

/// Tokens quantized to Q8_0 and laid out in pairs: pair `p`'s block `b` is
/// `blocks[p * per_row + b]`. An odd last token is paired with zeros.
#[derive(Debug, Clone, Default)]
pub struct B32Panel {
    pub blocks: Vec<PairBlock>,
    pub per_row: usize,
    pub tokens: usize,
}

impl B32Panel {
    /// The panel of `tokens` (each `per_row` Q8_0 blocks) for weights of offset `off`.
    pub fn new(tokens: &[&[BlockQ8_0]], off: i32) -> B32Panel {
        let per_row = tokens.first().map_or(0, |t| t.len());
        let mut blocks = Vec::with_capacity(tokens.len().div_ceil(2) * per_row);
        for pair in tokens.chunks(2) {
            for b in 0..per_row {
                let mut pb = PairBlock::default();
                for (h, tok) in pair.iter().enumerate() {
                    let blk = &tok[b];
                    pb.qs[32 * h..32 * h + 32].copy_from_slice(&blk.qs);
                    for k in 0..8 {
                        let s: i32 = blk.qs[4 * k..4 * k + 4].iter().map(|&q| i32::from(q)).sum();
                        pb.corr[8 * h + k] = -off * s;
                    }
                    pb.da[8 * h..8 * h + 8].fill(blk.d.to_f32());
                }
                blocks.push(pb);
            }
        }
        B32Panel {
            blocks,
            per_row,
            tokens: tokens.len(),
        }
    }

    /// Number of token pairs.
    pub fn pairs(&self) -> usize {
        self.tokens.div_ceil(2)
    }

    /// Pair `p`'s blocks.
    pub fn pair(&self, p: usize) -> &[PairBlock] {
        &self.blocks[p * self.per_row..(p + 1) * self.per_row]
    }
}

/// ggml's `hsum_float_8`: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
pub fn hsum_float_8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// One (row, token pair) cell: the two tokens' dots with row `(q, d)`, in `vec_dot`'s order.
pub fn b32_cell_scalar(q: &[[u8; 32]], d: &[f32], pair: &[PairBlock]) -> [f32; 2] {
    let mut acc = [[0.0f32; 8]; 2];
    for ((wq, &wd), pb) in q.iter().zip(d).zip(pair) {
        for (h, acc) in acc.iter_mut().enumerate() {
            let dd = wd * pb.da[8 * h];
            for (k, lane) in acc.iter_mut().enumerate() {
                let isum: i32 = (0..4)
                    .map(|i| i32::from(wq[4 * k + i]) * i32::from(pb.qs[32 * h + 4 * k + i]))
                    .sum::<i32>()
                    + pb.corr[8 * h + k];
                *lane = dd.mul_add(isum as f32, *lane);
            }
        }
    }
    [hsum_float_8(&acc[0]), hsum_float_8(&acc[1])]
}

/// `out[t][r] = dot(row r, token t)` for every row of `tile` and token of `panel`
/// (`out[t]` holds at least `tile.rows` values), one cell at a time: the scalar twin of the
/// SIMD tile kernels.
pub fn b32_tile_scalar(tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) {
    for p in 0..panel.pairs() {
        for r in 0..tile.rows {
            let (q, d) = tile.row(r);
            let cell = b32_cell_scalar(q, d, panel.pair(p));
            for (h, v) in cell.into_iter().enumerate() {
                if let Some(o) = out.get_mut(2 * p + h) {
                    o[r] = v;
                }
            }
        }
    }
}
