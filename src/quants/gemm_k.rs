//! Many-token products of K-quant matrices (Q8_K activations), bit-identical per element to the
//! single-token x86 kernels, in a **row-lane** layout: each 512-bit register holds one value
//! slot of 16 weight rows, and a token's 4 activation bytes are broadcast against it.
//!
//! # Q4_K, repacked (llama.cpp's `ggml_gemv_q4_K_8x8_q8_K` order, see [`gemv`](super::gemv))
//!
//! Per super-block and (row, token) the result needs two exact integers,
//! `dot = Σ_j sc_j Σ_{i in j} q_i a_i` and `min = Σ_j m_j bsum_j`, then
//! `acc = fma(dot, d_w * d_a, acc)`, `acc_min = fma(min, dmin_w * d_a, acc_min)`, result
//! `acc - acc_min`. With rows in lanes each lane *is* one row's integer, so no horizontal sum is
//! needed: `vpdpbusd` of 4 unsigned nibbles × 4 activation bytes per lane, 8 of them per
//! 32-value sub-block, times the lane's `sc_j` (`vpmulld`); the mins by `vpdpwssd` of
//! `(m_{2k}, m_{2k+1})` with the token's `(bsum_{2k}, bsum_{2k+1})`.
//!
//! # Q6_K (`ggml_vec_dot_q6_K_q8_K`'s AVX2 order)
//!
//! ggml keeps 8 i32 lanes per (row, token): lane `k` sums, over the 8 chunks of 32 values, the
//! products of values `4k..4k+4` of the chunk (unsigned 6-bit quants) times their 16-value
//! scale, minus `32 (sc_{2k} bsum_{2k} + sc_{2k+1} bsum_{2k+1})`; then
//! `acc_k = fma(d_a * d_w, f32(lane_k), acc_k)` per super-block and `hsum_float_8` at the end.
//! Here each of those 8 lanes is one register of 16 rows: per 4-value group `vpdpbusd` into a
//! zero register (at most 4·63·128 in magnitude, so it fits an i16), then `vpdpwssd` with the
//! row's `(sc, 0)` adds it times the scale into lane register `k`.
//!
//! # Map
//!
//! * [`K4Tile`]: 16·v weight rows of Q4_K unpacked into row lanes.
//! * [`K8Panel`]: the tokens' Q8_K rows and their 32-value `bsum` pairs.
//! * [`K6Tile`]: Q6_K rows in row lanes; [`q6k_cell_scalar`] the twin of its kernel.
//! * Scalar twins: [`tile_scalar`](super::gemm::tile_scalar) with `gemv::gemv_q4_k` (ggml's
//!   gemv order per element) for Q4_K, with [`q6k_cell_scalar`] for Q6_K.

use super::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};
use super::gemm::{
    RowLaneTile, for_each_lane_block, hsum_float_8, lane_groups, put_lane_groups, reset, shapes_fit,
};

pub use super::gemm::LANES;

/// Q4_K rows unpacked into row lanes, `vecs` groups of [`LANES`] rows, `per_row` super-blocks
/// each. With `vs = v * per_row + s` (row group `v`, super-block `s`):
///
/// * `q[vs * 64 + i]`: values `4i..4i+4` of the super-block, 4 bytes per row, rows in order;
/// * `sc[vs * 8 + j]`: sub-block `j`'s scale per row;
/// * `mp[vs * 4 + k]`: `m_{2k} | m_{2k+1} << 16` per row (two i16 for `vpdpwssd`);
/// * `d[vs]`, `dmin[vs]`: the super-block scales per row, as f32.
#[derive(Debug, Clone, Default)]
pub struct K4Tile {
    pub q: Vec<[u8; 64]>,
    pub sc: Vec<[i32; LANES]>,
    pub mp: Vec<[u32; LANES]>,
    pub d: Vec<[f32; LANES]>,
    pub dmin: Vec<[f32; LANES]>,
    pub vecs: usize,
    pub per_row: usize,
}

impl RowLaneTile<BlockQ4K> for K4Tile {
    fn fill(&mut self, blocks: &[BlockQ4K], per_row: usize) {
        let (vecs, n) = lane_groups(blocks.len(), per_row);
        reset(&mut self.q, n * 64, [0; 64]);
        reset(&mut self.sc, n * 8, [0; LANES]);
        reset(&mut self.mp, n * 4, [0; LANES]);
        reset(&mut self.d, n, [0.0; LANES]);
        reset(&mut self.dmin, n, [0.0; LANES]);
        for_each_lane_block(blocks, per_row, |vs, lane, b| {
            put_lane_groups(&mut self.q[vs * 64..][..64], lane, &b.quants());
            let (sc, m) = b.scales_mins();
            for j in 0..8 {
                self.sc[vs * 8 + j][lane] = i32::from(sc[j]);
            }
            for k in 0..4 {
                self.mp[vs * 4 + k][lane] = u32::from(m[2 * k]) | u32::from(m[2 * k + 1]) << 16;
            }
            self.d[vs][lane] = b.d.to_f32();
            self.dmin[vs][lane] = b.dmin.to_f32();
        });
        (self.vecs, self.per_row) = (vecs, per_row);
    }
}

/// The tokens of a product with K-quant weights: each token's Q8_K row, and per super-block the
/// 32-value activation sums as i16 pairs, `bs[t][s][k] = bsum_{2k} | bsum_{2k+1} << 16` with
/// `bsum_j = bsums[2j] + bsums[2j+1]`.
#[derive(Debug, Clone)]
pub struct K8Panel<'a> {
    pub acts: Vec<&'a [BlockQ8K]>,
    pub bs: Vec<Vec<[u32; 4]>>,
}

impl<'a> K8Panel<'a> {
    pub fn new(acts: Vec<&'a [BlockQ8K]>) -> K8Panel<'a> {
        let bs = acts
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| {
                        let s = |j: usize| (b.bsums[2 * j].wrapping_add(b.bsums[2 * j + 1])) as u16;
                        std::array::from_fn(|k| u32::from(s(2 * k)) | u32::from(s(2 * k + 1)) << 16)
                    })
                    .collect()
            })
            .collect();
        K8Panel { acts, bs }
    }
}

impl K8Panel<'_> {
    /// Whether a tile kernel may run a tile of `vecs` row groups of `per_row` super-blocks
    /// against this panel into `out` (a piece of every row for each token, rows of `per_row`
    /// blocks and `bsum` pairs).
    pub fn fits(&self, (vecs, per_row): (usize, usize), out: &[&mut [f32]]) -> bool {
        let lens = self.acts.iter().map(|a| a.len()).chain(self.bs.iter().map(|b| b.len()));
        out.len() >= self.acts.len() && shapes_fit(out, vecs * LANES, per_row, lens)
    }
}

/// Q6_K rows unpacked into row lanes (layout as [`K4Tile`], `vs = v * per_row + s`):
///
/// * `q[vs * 64 + i]`: unsigned quants (0..=63) of values `4i..4i+4`, 4 bytes per row;
/// * `scp[vs * 16 + j]`: `(sc_j as i16, 0)` per row, the `vpdpwssd` multiplier of 16-value
///   sub-block `j`;
/// * `sp[vs * 8 + k]`: `(sc_{2k}, sc_{2k+1})` as two i16 per row, for the `bsums` correction;
/// * `d[vs]`: the super-block scale per row, as f32.
#[derive(Debug, Clone, Default)]
pub struct K6Tile {
    pub q: Vec<[u8; 64]>,
    pub scp: Vec<[u32; LANES]>,
    pub sp: Vec<[u32; LANES]>,
    pub d: Vec<[f32; LANES]>,
    pub vecs: usize,
    pub per_row: usize,
}

impl RowLaneTile<BlockQ6K> for K6Tile {
    fn fill(&mut self, blocks: &[BlockQ6K], per_row: usize) {
        let (vecs, n) = lane_groups(blocks.len(), per_row);
        reset(&mut self.q, n * 64, [0; 64]);
        reset(&mut self.scp, n * 16, [0; LANES]);
        reset(&mut self.sp, n * 8, [0; LANES]);
        reset(&mut self.d, n, [0.0; LANES]);
        let pair = |a: i8, b: i8| u32::from(a as i16 as u16) | u32::from(b as i16 as u16) << 16;
        for_each_lane_block(blocks, per_row, |vs, lane, b| {
            put_lane_groups(&mut self.q[vs * 64..][..64], lane, &b.quants().map(|q| (q + 32) as u8));
            for j in 0..16 {
                self.scp[vs * 16 + j][lane] = pair(b.scales[j], 0);
            }
            for k in 0..8 {
                self.sp[vs * 8 + k][lane] = pair(b.scales[2 * k], b.scales[2 * k + 1]);
            }
            self.d[vs][lane] = b.d.to_f32();
        });
        (self.vecs, self.per_row) = (vecs, per_row);
    }
}

/// One (row, token) of Q6_K in `ggml_vec_dot_q6_K_q8_K`'s AVX2 lane order, in scalar code: the
/// twin of the row-lane kernel and of the single-token x86 kernels.
pub fn q6k_cell_scalar(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let q = x.quants().map(|q| i32::from(q) + 32);
        let sc = x.scales.map(i32::from);
        let mut lanes = [0i32; 8];
        for (k, lane) in lanes.iter_mut().enumerate() {
            for c in 0..8 {
                let first = 32 * c + 4 * k;
                let dot: i32 = (first..first + 4).map(|i| q[i] * i32::from(y.qs[i])).sum();
                *lane += sc[first / 16] * dot;
            }
            let b = |j: usize| sc[j] * i32::from(y.bsums[j]);
            *lane -= 32 * (b(2 * k) + b(2 * k + 1));
        }
        let d = y.d * x.d.to_f32();
        for (acc, lane) in acc.iter_mut().zip(lanes) {
            *acc = d.mul_add(lane as f32, *acc);
        }
    }
    hsum_float_8(&acc)
}

/// Writes row group `v` of a Q6_K tile product: `out[t][16v + lane] = hsum_float_8` of the
/// token's 8 lane accumulators (`acc[t][k][lane]`), the last step of every ISA's kernel.
pub fn k6_write(out: &mut [&mut [f32]], acc: &[[[f32; LANES]; 8]], v: usize) {
    for (o, a) in out.iter_mut().zip(acc) {
        let rows = &mut o[v * LANES..(v + 1) * LANES];
        for (lane, o) in rows.iter_mut().enumerate() {
            let l: [f32; 8] = std::array::from_fn(|k| a[k][lane]);
            *o = hsum_float_8(&l);
        }
    }
}
