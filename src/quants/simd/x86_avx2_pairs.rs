//! x86-64 AVX2 few-token kernels of the 32-value-block types (Q5_0, Q8_0; see
//! [`gemm_pairs`](crate::quants::gemm_pairs)): each weight block unpacked once into a register
//! and met by every token of a [`B32Pairs`] (up to 8), each token with its own 256-bit
//! accumulator. AVX2 has no room for two tokens' 8 lanes in one register, so the pairs of the
//! layout are only where the tokens' quants are read from (`y[b * pairs + t / 2]`, half
//! `t % 2`); the offset corrections are not used: the integers come from ggml's `sign_epi8`
//! trick, exactly as [`q5_0`](super::x86_avx2) / `q8_0` compute them.
//!
//! Per token and block the single dot's steps: `lanes = madd(maddubs(|x|, sign(y, x)), 1)`,
//! `acc = fma(d_w * d_a, f32(lanes), acc)`, then `hsum_float_8`: every element bit-identical to
//! the AVX2 dot (twin: [`b32_cell_scalar`](crate::quants::gemm::b32_cell_scalar)).
//!
//! The scales: the weight scales of 8 blocks converted by one `vcvtph2ps`, times each token's
//! scales of those blocks (`B32Pairs::da_by_token`, one rounding each, as `f16_mul`), stored,
//! and read back per token and block by a broadcast load. A scale extracted from a register
//! took two shuffles per token and block, which on AVX2 are a sixth of a token's work; a
//! conversion per block (broadcast, `vcvtph2ps`, multiply, store, load) put a store-to-load
//! round trip in front of every block's first FMA and cost a sixth of the block's vector
//! slots.

use std::arch::x86_64::*;

use super::x86_avx2::{Avx2, hsum_float_8, ld256, q5_0_quants};
use crate::quants::blocks::{BlockQ5_0, BlockQ8_0};
use crate::quants::dequant::WeightBlock;
use crate::quants::gemm::Block32Gemm;
use crate::quants::gemm_pairs::{B32Pairs, B32Rows, SCALE_BLOCKS};
use crate::quants::packed_b32::Block32Pack;

/// How far ahead of the block being multiplied the weights are prefetched.
const PREFETCH_BYTES: usize = 1024;

/// Token `t`'s 32 quants of block `b` in the pair layout.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn token_quants(g: &B32Pairs, b: usize, t: usize) -> __m256i {
    let (pair, half) = (&g.y[b * g.pairs + t / 2], t % 2);
    let (halves, _) = pair.as_chunks::<32>();
    ld256(&halves[half])
}

/// The `T` tokens' scale products of a group of [`SCALE_BLOCKS`] blocks, a row of 8 per token,
/// on a 32-byte boundary: they are stored as registers and read back one by one, and a store
/// that crossed a cache line (the stack slot's alignment otherwise depends on the callers'
/// frames) would keep the loads from being forwarded from it.
#[repr(C, align(32))]
struct GroupScales<const T: usize>([[f32; SCALE_BLOCKS]; T]);

/// The scale products `f16(d_w[b]) * da[b][t]` (read from `da_by_token[t * stride + b]`) of
/// the blocks `group` (at most [`SCALE_BLOCKS`], the first being block `b0` of its row) for the
/// `T` tokens: one rounding each, as `f16_mul`. The weight scales are converted by one `vcvtph2ps` for the group and
/// each token's products are one multiplication, ahead of the blocks' integer work, so no
/// block waits on a conversion of its own.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_scales<W: Block32Pack, const T: usize>(group: &[W], g: &B32Pairs, b0: usize) -> GroupScales<T> {
    let mut halves = [0u16; SCALE_BLOCKS];
    for (h, x) in halves.iter_mut().zip(group) {
        *h = x.scale().to_bits();
    }
    // SAFETY: `halves` is 8 readable u16; loadu needs no alignment.
    let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(halves.as_ptr().cast()) });
    let stride = g.da_stride();
    let mut out = GroupScales([[0.0f32; SCALE_BLOCKS]; T]);
    for (t, o) in out.0.iter_mut().enumerate() {
        // `B32Pairs::fits` holds `da_by_token` at PAIR_TOKENS >= T rows of `stride`, a whole
        // number of groups, so a group's 8 scales are always there.
        let da = &g.da_by_token[t * stride + b0..][..SCALE_BLOCKS];
        // SAFETY: `da` is 8 readable and `o` 8 writable f32; loadu/storeu need no alignment.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(dw, _mm256_loadu_ps(da.as_ptr()))) };
    }
    out
}

/// `*p` in all 8 lanes, loaded by `vbroadcastss` from memory (a load, no shuffle): written as
/// `_mm256_broadcast_ss` of a value just stored, LLVM forwards the store and shuffles the
/// register instead, two shuffles per token and block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn broadcast_load(p: &f32) -> __m256 {
    let r: __m256;
    // SAFETY: `p` is a valid, aligned f32 reference; the instruction reads those 4 bytes only
    // and writes nothing but `r`.
    unsafe {
        std::arch::asm!("vbroadcastss {r}, dword ptr [{p}]", p = in(reg) p, r = out(ymm_reg) r,
            options(pure, readonly, nostack, preserves_flags));
    }
    r
}

/// Every row of `blocks` (`[rows][g.per_row]`, shapes checked by the caller) against the `T`
/// tokens of `g`: `out[t][r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn b32_tokens<W: Block32Pack, const T: usize>(blocks: &[W], g: &B32Pairs, out: &mut [&mut [f32]], unpack: impl Fn(&W) -> __m256i) {
    let n = g.per_row;
    let ones = _mm256_set1_epi16(1);
    for (r, row) in blocks.chunks_exact(n).enumerate() {
        let mut acc = [_mm256_setzero_ps(); T];
        for (group, b0) in row.chunks(SCALE_BLOCKS).zip((0..).step_by(SCALE_BLOCKS)) {
            let d = group_scales::<W, T>(group, g, b0);
            for (i, x) in group.iter().enumerate() {
                _mm_prefetch::<_MM_HINT_T0>((x as *const W).cast::<i8>().wrapping_add(PREFETCH_BYTES));
                let qx = unpack(x);
                let ax = _mm256_sign_epi8(qx, qx);
                for (t, (acc, d)) in acc.iter_mut().zip(&d.0).enumerate() {
                    let sy = _mm256_sign_epi8(token_quants(g, b0 + i, t), qx);
                    let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                    *acc = _mm256_fmadd_ps(broadcast_load(&d[i]), _mm256_cvtepi32_ps(lanes), *acc);
                }
            }
        }
        for (o, &a) in out.iter_mut().zip(&acc) {
            o[r] = hsum_float_8(a);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_tokens<const T: usize>(blocks: &[BlockQ5_0], g: &B32Pairs, out: &mut [&mut [f32]]) {
    b32_tokens::<_, T>(blocks, g, out, |x| q5_0_quants(x));
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_tokens<const T: usize>(blocks: &[BlockQ8_0], g: &B32Pairs, out: &mut [&mut [f32]]) {
    b32_tokens::<_, T>(blocks, g, out, |x| ld256(&x.qs));
}

/// `$kernel` for `g.tokens` tokens.
macro_rules! by_tokens {
    ($kernel:ident, $blocks:expr, $g:expr, $out:expr) => {
        // SAFETY: an Avx2 token exists only where detection found AVX2, FMA and F16C.
        unsafe {
            match $g.tokens {
                1 => $kernel::<1>($blocks, $g, $out),
                2 => $kernel::<2>($blocks, $g, $out),
                3 => $kernel::<3>($blocks, $g, $out),
                4 => $kernel::<4>($blocks, $g, $out),
                5 => $kernel::<5>($blocks, $g, $out),
                6 => $kernel::<6>($blocks, $g, $out),
                7 => $kernel::<7>($blocks, $g, $out),
                _ => $kernel::<8>($blocks, $g, $out),
            }
        }
    };
}

impl Avx2 {
    /// `out[t][r] = dot(row r of blocks, token t of g)` for the `n_rows` rows of `blocks`
    /// (`[n_rows][g.per_row]`), bit-identical to the AVX2 dot. `false`, writing nothing,
    /// where the shapes do not fit or `W` has no such kernel (Q5_0 and Q8_0 do).
    pub fn b32_pairs<W: Block32Gemm + WeightBlock>(
        self,
        blocks: &[W],
        n_rows: usize,
        g: &B32Pairs,
        out: &mut [&mut [f32]],
    ) -> bool {
        match g.rows(blocks, n_rows, out) {
            Some(B32Rows::Q5_0(b)) => by_tokens!(q5_0_tokens, b, g, out),
            Some(B32Rows::Q8_0(b)) => by_tokens!(q8_0_tokens, b, g, out),
            None => return false,
        }
        true
    }
}
