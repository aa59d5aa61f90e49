//! Few-token products of 32-value-block weight rows (Q5_0, Q8_0): batched decoding, where a
//! pass holds one token of each of 2–8 sequences.
//!
//! The row-lane tiles of [`gemm`](super::gemm) unpack their weight rows into memory once per
//! call, which only pays off over many tokens. Here each weight block is unpacked into a
//! register once and met by the tokens two at a time: a 512-bit register holds two tokens'
//! quants ([`B32Pairs::y`]), the unsigned weight quants are broadcast to both halves, and one
//! `vpdpbusd` gives both tokens' 8 lanes. What the tokens need per block is laid out once per
//! matrix product, in the order the kernel reads it:
//!
//! * `y[b * pairs + p]`: the Q8_0 quants of tokens `2p` and `2p + 1` of block `b`;
//! * `corr[b * pairs + p]`: their lanes' offset corrections `-OFFSET * Σ y[4k..4k+4]`, so that
//!   `corr + Σ u * y = Σ (u - OFFSET) * y = Σ q * y` exactly (as [`B32Panel`](super::gemm::B32Panel));
//! * `da[b]`: the tokens' scales as f32 (the product with the weight scale is rounded once, as
//!   `f16_mul` in the dots);
//! * `da_by_token[t * da_stride() + b]`: the same scales by token, [`SCALE_BLOCKS`] blocks of
//!   one token side by side, for a kernel that multiplies a row's weight scales by a token's
//!   eight at a time.
//!
//! Each token's 8 lanes then take `fma(d_w * d_a, lane, acc)` block after block and end in
//! `hsum_float_8`: the single dot's order, so every element has its bits. A token count that is
//! odd leaves the second half of the last pair zero (its sums are computed and dropped).
//!
//! AVX2 has no `vpdpbusd` and no room for two tokens' lanes in a register: its kernel
//! (`x86_avx2_pairs.rs`) reads each token's quants from the same layout and keeps one 256-bit
//! accumulator per token, with ggml's `sign_epi8` integers (no corrections).
//!
//! The K-quants (Q8_K activations, [`K8Pairs`]) pair the tokens the same way, chunk by chunk of
//! 32 values: Q6_K keeps `ggml_vec_dot_q6_K_q8_K`'s 8 lanes per token, Q4_K's repacked gemv
//! order needs each token's two integers per super-block (see
//! [`gemm_k`](super::gemm_k)), summed across the lanes (exact, so in any order) and then
//! scaled for all tokens at once.

use super::dequant::WeightBlock;
use super::{BlockQ5_0, BlockQ8_0, BlockQ8K, GgmlType};

/// Most tokens one [`B32Pairs`] holds (4 registers of two).
pub const PAIR_TOKENS: usize = 8;

/// Blocks per group of [`B32Pairs::da_by_token`]: one 256-bit register of f32.
pub const SCALE_BLOCKS: usize = 8;

/// The activations of up to [`PAIR_TOKENS`] tokens laid out for the pair kernels (see the
/// module documentation).
#[derive(Debug, Clone, Default)]
pub struct B32Pairs {
    /// Blocks per token row.
    pub per_row: usize,
    /// Tokens held, `1..=PAIR_TOKENS`.
    pub tokens: usize,
    /// `tokens.div_ceil(2)`.
    pub pairs: usize,
    /// `[per_row][pairs]`: two tokens' 32 quants each.
    pub y: Vec<[i8; 64]>,
    /// `[per_row][pairs]`: two tokens' 8 lane corrections each.
    pub corr: Vec<[i32; 16]>,
    /// `[per_row]`: every token's scale (0 past `tokens`).
    pub da: Vec<[f32; PAIR_TOKENS]>,
    /// `[PAIR_TOKENS][da_stride()]`: `da` transposed, each token's scales of consecutive blocks
    /// side by side (0 past `per_row` and past `tokens`).
    pub da_by_token: Vec<f32>,
}

impl B32Pairs {
    /// The layout of `acts` (1 to [`PAIR_TOKENS`] rows of Q8_0 blocks, all of the same length)
    /// for weights of offset `off`; `None` for any other count or unequal rows.
    pub fn new(acts: &[&[BlockQ8_0]], off: i32) -> Option<B32Pairs> {
        let (tokens, per_row, pairs) = group_shape(acts)?;
        let mut g = B32Pairs {
            per_row,
            tokens,
            pairs,
            y: vec![[0; 64]; per_row * pairs],
            corr: vec![[0; 16]; per_row * pairs],
            da: vec![[0.0; PAIR_TOKENS]; per_row],
            da_by_token: Vec::new(),
        };
        let stride = g.da_stride();
        g.da_by_token = vec![0.0; PAIR_TOKENS * stride];
        for (t, row) in acts.iter().enumerate() {
            let (p, half) = (t / 2, t % 2);
            for (b, blk) in row.iter().enumerate() {
                let slot = b * pairs + p;
                g.y[slot][32 * half..32 * half + 32].copy_from_slice(&blk.qs);
                for k in 0..8 {
                    let sum: i32 = blk.qs[4 * k..4 * k + 4].iter().map(|&q| i32::from(q)).sum();
                    g.corr[slot][8 * half + k] = -off * sum;
                }
                g.da[b][t] = blk.d.to_f32();
                g.da_by_token[t * stride + b] = g.da[b][t];
            }
        }
        Some(g)
    }

    /// Length of one token's row of [`B32Pairs::da_by_token`]: `per_row` rounded up to whole
    /// groups of [`SCALE_BLOCKS`].
    pub fn da_stride(&self) -> usize {
        self.per_row.next_multiple_of(SCALE_BLOCKS)
    }

    /// Whether a pair kernel may run `n_rows` weight rows of `blocks` (`[n_rows][per_row]`)
    /// against these tokens into `out`: a piece of at least `n_rows` values for every token,
    /// rows as long as the tokens', and the layout's vectors of their stated sizes.
    pub fn fits<B>(&self, blocks: &[B], n_rows: usize, out: &[&mut [f32]]) -> bool {
        let slots = self.per_row * self.pairs;
        self.y.len() == slots
            && self.corr.len() == slots
            && self.da.len() == self.per_row
            && self.da_by_token.len() == PAIR_TOKENS * self.da_stride()
            && group_fits((self.tokens, self.per_row, self.pairs), blocks.len(), n_rows, out)
    }
}

/// The weight rows a 32-value pair kernel runs, as their own block type.
pub enum B32Rows<'a> {
    Q5_0(&'a [BlockQ5_0]),
    Q8_0(&'a [BlockQ8_0]),
}

impl B32Pairs {
    /// `blocks` as the type a pair kernel has (Q5_0, Q8_0) where the kernel may run them
    /// ([`B32Pairs::fits`], at least one block per row); `None` otherwise, and the kernel
    /// writes nothing. The one entry check of every ISA's kernel.
    pub fn rows<'a, W: WeightBlock>(&self, blocks: &'a [W], n_rows: usize, out: &[&mut [f32]]) -> Option<B32Rows<'a>> {
        if !self.fits(blocks, n_rows, out) || self.per_row == 0 {
            return None;
        }
        match W::TYPE {
            GgmlType::Q5_0 => bytemuck::try_cast_slice(blocks).ok().map(B32Rows::Q5_0),
            GgmlType::Q8_0 => bytemuck::try_cast_slice(blocks).ok().map(B32Rows::Q8_0),
            _ => None,
        }
    }
}

/// `(tokens, per_row, pairs)` of a group of activation rows: `None` unless there are 1 to
/// [`PAIR_TOKENS`] rows, all of the same length.
fn group_shape<A>(acts: &[&[A]]) -> Option<(usize, usize, usize)> {
    let (tokens, per_row) = (acts.len(), acts.first()?.len());
    (tokens <= PAIR_TOKENS && acts.iter().all(|a| a.len() == per_row)).then_some((tokens, per_row, tokens.div_ceil(2)))
}

/// What every pair layout checks before a kernel writes: a shape [`group_shape`] gives,
/// `n_blocks` weight blocks making `n_rows` rows of `per_row`, and a piece of at least `n_rows`
/// values for every token.
fn group_fits((tokens, per_row, pairs): (usize, usize, usize), n_blocks: usize, n_rows: usize, out: &[&mut [f32]]) -> bool {
    (1..=PAIR_TOKENS).contains(&tokens)
        && pairs == tokens.div_ceil(2)
        && n_rows.checked_mul(per_row) == Some(n_blocks)
        && out.len() >= tokens
        && out[..tokens].iter().all(|o| o.len() >= n_rows)
}

/// The Q8_K activations of up to [`PAIR_TOKENS`] tokens laid out for the K-quant pair
/// kernels: with `s` a super-block, `c` one of its 8 chunks of 32 values and `p` a pair,
///
/// * `y[(s * 8 + c) * pairs + p]`: chunk `c` of tokens `2p` and `2p + 1`;
/// * `bsums[s * pairs + p]`: the two tokens' 16 sums of 16 values (Q6_K's correction);
/// * `bs32[s]`: every token's 8 sums of 32 values, token `t` at `8t..8t + 8` (Q4_K's mins;
///   i16 pairs added wrapping, as ggml's `hadd_epi16`);
/// * `da[s]`: every token's scale (0 past `tokens`).
#[derive(Debug, Clone, Default)]
pub struct K8Pairs {
    pub per_row: usize,
    pub tokens: usize,
    pub pairs: usize,
    pub y: Vec<[i8; 64]>,
    pub bsums: Vec<[i16; 32]>,
    pub bs32: Vec<[i16; 8 * PAIR_TOKENS]>,
    pub da: Vec<[f32; PAIR_TOKENS]>,
}

impl K8Pairs {
    /// The layout of `acts` (1 to [`PAIR_TOKENS`] rows of Q8_K blocks, all of the same length);
    /// `None` for any other count or unequal rows.
    pub fn new(acts: &[&[BlockQ8K]]) -> Option<K8Pairs> {
        let (tokens, per_row, pairs) = group_shape(acts)?;
        let mut g = K8Pairs {
            per_row,
            tokens,
            pairs,
            y: vec![[0; 64]; per_row * 8 * pairs],
            bsums: vec![[0; 32]; per_row * pairs],
            bs32: vec![[0; 8 * PAIR_TOKENS]; per_row],
            da: vec![[0.0; PAIR_TOKENS]; per_row],
        };
        for (t, row) in acts.iter().enumerate() {
            let (p, half) = (t / 2, t % 2);
            for (s, blk) in row.iter().enumerate() {
                for (c, chunk) in blk.qs.chunks_exact(32).enumerate() {
                    g.y[(s * 8 + c) * pairs + p][32 * half..32 * half + 32].copy_from_slice(chunk);
                }
                g.bsums[s * pairs + p][16 * half..16 * half + 16].copy_from_slice(&blk.bsums);
                for j in 0..8 {
                    g.bs32[s][8 * t + j] = blk.bsums[2 * j].wrapping_add(blk.bsums[2 * j + 1]);
                }
                g.da[s][t] = blk.d;
            }
        }
        Some(g)
    }

    /// As [`B32Pairs::fits`], for super-blocks.
    pub fn fits<B>(&self, blocks: &[B], n_rows: usize, out: &[&mut [f32]]) -> bool {
        let slots = self.per_row * self.pairs;
        self.y.len() == 8 * slots
            && self.bsums.len() == slots
            && self.bs32.len() == self.per_row
            && self.da.len() == self.per_row
            && group_fits((self.tokens, self.per_row, self.pairs), blocks.len(), n_rows, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quants::F16Le;

    fn block(seed: i32) -> BlockQ8_0 {
        BlockQ8_0 {
            d: F16Le::from_f32(0.25 * (seed + 1) as f32),
            qs: std::array::from_fn(|i| ((seed * 37 + i as i32 * 11) % 255 - 127) as i8),
        }
    }

    #[test]
    fn layout_pairs_tokens_and_zeroes_the_odd_half() {
        let rows: Vec<Vec<BlockQ8_0>> = (0..3).map(|t| (0..2).map(|b| block(10 * t + b)).collect()).collect();
        let acts: Vec<&[BlockQ8_0]> = rows.iter().map(|r| r.as_slice()).collect();
        let g = B32Pairs::new(&acts, 16).unwrap();
        assert_eq!((g.tokens, g.pairs, g.per_row), (3, 2, 2));
        // block 1, pair 1: token 2 in the low half, nothing in the high half
        let slot = 2 + 1;
        assert_eq!(&g.y[slot][..32], &rows[2][1].qs[..]);
        assert_eq!(&g.y[slot][32..], &[0i8; 32][..]);
        let q = &rows[2][1].qs;
        assert_eq!(g.corr[slot][5], -16 * (i32::from(q[20]) + i32::from(q[21]) + i32::from(q[22]) + i32::from(q[23])));
        assert_eq!(&g.corr[slot][8..], &[0; 8][..]);
        // block 0, pair 0: token 1 in the high half
        assert_eq!(&g.y[0][32..], &rows[1][0].qs[..]);
        assert_eq!(g.da[1][..4], [rows[0][1].d.to_f32(), rows[1][1].d.to_f32(), rows[2][1].d.to_f32(), 0.0]);
        // by token: 8 blocks a group, token 2's two scales then zeros, nothing for token 3
        assert_eq!(g.da_stride(), 8);
        assert_eq!(g.da_by_token[16..24], [rows[2][0].d.to_f32(), rows[2][1].d.to_f32(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(g.da_by_token[24..], [0.0; 40]);
        // 9 blocks: two groups a token, the second holding block 8 alone
        let long: Vec<Vec<BlockQ8_0>> = (0..2).map(|t| (0..9).map(|b| block(10 * t + b)).collect()).collect();
        let acts: Vec<&[BlockQ8_0]> = long.iter().map(|r| r.as_slice()).collect();
        let g = B32Pairs::new(&acts, 16).unwrap();
        assert_eq!((g.da_stride(), g.da_by_token.len()), (16, 8 * 16));
        assert_eq!(g.da_by_token[16 + 8..16 + 10], [long[1][8].d.to_f32(), 0.0]);
        assert_eq!(g.da_by_token[7], long[0][7].d.to_f32());
    }

    #[test]
    fn k8_layout_pairs_chunks_and_sums() {
        let blk = |seed: i32| {
            let qs: [i8; 256] = std::array::from_fn(|i| ((seed * 53 + i as i32 * 7) % 255 - 127) as i8);
            let bsums = std::array::from_fn(|k| qs[16 * k..16 * k + 16].iter().map(|&q| i16::from(q)).sum());
            BlockQ8K { d: 0.5 + seed as f32, qs, bsums }
        };
        let rows: Vec<Vec<BlockQ8K>> = (0..3).map(|t| (0..2).map(|s| blk(10 * t + s)).collect()).collect();
        let acts: Vec<&[BlockQ8K]> = rows.iter().map(|r| r.as_slice()).collect();
        let g = K8Pairs::new(&acts).unwrap();
        assert_eq!((g.tokens, g.pairs, g.per_row, g.y.len()), (3, 2, 2, 2 * 8 * 2));
        // super-block 1, chunk 5, pair 0: token 1 in the high half
        assert_eq!(&g.y[(8 + 5) * 2][32..], &rows[1][1].qs[160..192]);
        // super-block 1, pair 1: token 2's bsums low, nothing high
        assert_eq!(&g.bsums[2 + 1][..16], &rows[2][1].bsums[..]);
        assert_eq!(&g.bsums[2 + 1][16..], &[0i16; 16][..]);
        let b = &rows[2][0].bsums;
        assert_eq!(g.bs32[0][8 * 2 + 3], b[6] + b[7]);
        assert_eq!(&g.bs32[0][24..], &[0i16; 40][..]);
        assert_eq!(g.da[1][..4], [rows[0][1].d, rows[1][1].d, rows[2][1].d, 0.0]);
        assert!(K8Pairs::new(&[&rows[0][..], &rows[1][..1]]).is_none());
    }

    #[test]
    fn counts_outside_one_to_eight_or_ragged_rows_are_refused() {
        let row = vec![block(1); 3];
        assert!(B32Pairs::new(&[], 16).is_none());
        assert!(B32Pairs::new(&[row.as_slice(); 9], 16).is_none());
        assert!(B32Pairs::new(&[row.as_slice(), &row[..2]], 16).is_none());
        assert!(B32Pairs::new(&[row.as_slice(); 8], 128).is_some());
    }
}
