//! aarch64 NEON kernels, with `SDOT` when the CPU has `dotprod`.
//!
//! Kept small and obviously correct rather than tuned: the quantized kernels compute each
//! block's exact integer sums with NEON (`SDOT`, or `vmull_s8` + `vpadalq_s16` without it) and
//! then do *exactly* the f32 arithmetic of the scalar reference dots (`quants/dot.rs`, ggml's
//! generic order): same products in the same order, same running sum, same 8 lane sums for
//! Q3_K…Q6_K (lane `l` takes the values `i ≡ l mod 8`, which `vmull_s8` on 8 consecutive values
//! keeps apart). They are therefore bit-identical to [`Isa::Scalar`](super::Isa::Scalar), not to
//! ggml's ARM kernels (which sum in yet another order). Quants whose unpacking is fiddly (Q5_0,
//! Q5_1, the K-quants) are unpacked with the scalar helpers of `blocks.rs`.
//!
//! The float rows use 4×4 f32 lanes (`GGML_F32_STEP = 16` of ggml's NEON build: FMA, then
//! `(s0+s2)+(s1+s3)` and a pairwise add), F16 converted in software (exact), BF16 by shifting;
//! these differ from the scalar f64 sums in the last bits.
//!
//! `vdotq_s32` is not stable in Rust 1.95, so `SDOT` is issued with `asm!`.

use std::arch::aarch64::*;

use crate::quants::blocks::*;
use crate::quants::scalars::{Bf16Le, F16Le, F32Le};

/// Proof that this CPU runs NEON (and `SDOT` when `dotprod` is set): only [`Neon::detect`]
/// makes one.
#[derive(Debug, Clone, Copy)]
pub struct Neon {
    dotprod: bool,
}

impl Neon {
    /// `Some` if the CPU has NEON, and `dotprod` when asked for.
    pub(super) fn detect(dotprod: bool) -> Option<Neon> {
        let ok = std::arch::is_aarch64_feature_detected!("neon")
            && (!dotprod || std::arch::is_aarch64_feature_detected!("dotprod"));
        ok.then_some(Neon { dotprod })
    }
}

/// Safe entry points: the `dotprod` or the plain copy of each kernel.
macro_rules! entries {
    ($($name:ident: ($w:ty, $a:ty);)*) => {
        impl Neon {$(
            #[inline]
            pub fn $name(self, w: &[$w], a: &[$a]) -> f32 {
                if self.dotprod {
                    // SAFETY: `dotprod` is set only where detection found NEON and dotprod,
                    // the features of the `sdot` kernels.
                    unsafe { sdot::$name(w, a) }
                } else {
                    // SAFETY: a `Neon` exists only where detection found NEON.
                    unsafe { plain::$name(w, a) }
                }
            }
        )*}
    };
}

entries! {
    f32: (F32Le, f32); f16: (F16Le, F16Le); bf16: (Bf16Le, Bf16Le);
    q4_0: (BlockQ4_0, BlockQ8_0); q4_1: (BlockQ4_1, BlockQ8_1); q5_0: (BlockQ5_0, BlockQ8_0);
    q5_1: (BlockQ5_1, BlockQ8_1); q8_0: (BlockQ8_0, BlockQ8_0);
    q2_k: (BlockQ2K, BlockQ8K); q3_k: (BlockQ3K, BlockQ8K); q4_k: (BlockQ4K, BlockQ8K);
    q5_k: (BlockQ5K, BlockQ8K); q6_k: (BlockQ6K, BlockQ8K);
}

/// One-byte element types: an array of 16 of them is 16 readable bytes.
trait Byte: Copy {}
impl Byte for u8 {}
impl Byte for i8 {}

/// 16 bytes as signed lanes (quants are at most 63 in magnitude or i8 already).
#[inline]
#[target_feature(enable = "neon")]
fn ld16<T: Byte>(b: &[T; 16]) -> int8x16_t {
    // SAFETY: `T` is `u8` or `i8` (the trait is private and implemented for those only), so `b`
    // is 16 readable bytes; `ld1` needs no alignment.
    unsafe { vld1q_s8(b.as_ptr().cast()) }
}

/// 4 f32.
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32x4(b: &[f32; 4]) -> float32x4_t {
    // SAFETY: `b` is 4 readable f32; `ld1` needs no alignment.
    unsafe { vld1q_f32(b.as_ptr()) }
}

/// 4 little-endian f32 from 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32le4(b: &[F32Le; 4]) -> float32x4_t {
    // SAFETY: `b` is 16 readable bytes; aarch64 Linux is little-endian; `ld1` needs no alignment.
    unsafe { vld1q_f32(b.as_ptr().cast()) }
}

/// 4 halves (f16 or bf16 bits) widened to u32 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn ld_half4(b: &[[u8; 2]; 4]) -> uint32x4_t {
    // SAFETY: `b` is 8 readable bytes; `ld1` needs no alignment; little-endian.
    vmovl_u16(unsafe { vld1_u16(b.as_ptr().cast()) })
}

/// `acc + Σ a_i b_i` over 16 byte pairs, 4 neighbours per lane, without `SDOT`.
#[inline]
#[target_feature(enable = "neon")]
fn dot16_plain(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// `acc + Σ a_i b_i` over 16 byte pairs with `SDOT`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot16_sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` only reads the three vector registers and writes `acc`; the enclosing
    // function enables `dotprod`, so the instruction exists on every CPU that can call it.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Exact per-lane scaled products of 8 quants with 8 Q8 values into lanes `i mod 8`:
/// `lanes[0..4] += sc * q[0..4] * y[0..4]`, `lanes[4..8] += sc * q[4..8] * y[4..8]`.
#[inline]
#[target_feature(enable = "neon")]
fn lanes8_add(lanes: &mut [int32x4_t; 2], q: int8x8_t, y: int8x8_t, sc: i16) {
    let p = vmull_s8(q, y);
    lanes[0] = vmlal_n_s16(lanes[0], vget_low_s16(p), sc);
    lanes[1] = vmlal_high_n_s16(lanes[1], p, sc);
}

/// ggml's generic Q3_K…Q6_K float loop, as in `dot.rs`: `sums[l] += d * lanes[l]` per block,
/// `sumf -= min_term`, lanes added to `sumf` in order at the end.
struct LaneSum {
    sums: [f32; 8],
    sumf: f32,
}

impl LaneSum {
    fn new() -> Self {
        LaneSum {
            sums: [0.0; 8],
            sumf: 0.0,
        }
    }
    fn add(&mut self, d: f32, lanes: [i32; 8], min_term: Option<f32>) {
        for (s, l) in self.sums.iter_mut().zip(lanes) {
            *s += d * l as f32;
        }
        if let Some(m) = min_term {
            self.sumf -= m;
        }
    }
    fn finish(self) -> f32 {
        self.sums.iter().fold(self.sumf, |s, &l| s + l)
    }
}

/// The kernels, expanded once per flavour (`plain`, `sdot`) with that flavour's target features
/// and 16-byte integer dot.
macro_rules! kernels {
    ($features:literal, $dot16:ident) => {
        use super::*;

        /// Exact `Σ q_i y_i` over a 32-value block.
        #[inline]
        #[target_feature(enable = $features)]
        fn isum32(lo: int8x16_t, hi: int8x16_t, y: &[i8; 32]) -> i32 {
            let (y, _) = y.as_chunks::<16>();
            let acc = $dot16(vdupq_n_s32(0), lo, ld16(&y[0]));
            vaddvq_s32($dot16(acc, hi, ld16(&y[1])))
        }

        /// Exact `Σ q_i y_i` over 32 quants given in value order.
        #[inline]
        #[target_feature(enable = $features)]
        fn isum32_of<T: Byte>(q: &[T; 32], y: &[i8; 32]) -> i32 {
            let (q, _) = q.as_chunks::<16>();
            isum32(ld16(&q[0]), ld16(&q[1]), y)
        }

        /// Q4_0/Q4_1 nibbles in value order, offset by `off`.
        #[inline]
        #[target_feature(enable = $features)]
        fn nibbles(qs: &[u8; 16], off: i8) -> (int8x16_t, int8x16_t) {
            let v = vreinterpretq_u8_s8(ld16(qs));
            let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
            let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
            (vsubq_s8(lo, vdupq_n_s8(off)), vsubq_s8(hi, vdupq_n_s8(off)))
        }

        #[target_feature(enable = $features)]
        pub(super) fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                let (lo, hi) = nibbles(&x.qs, 8);
                s + isum32(lo, hi, &y.qs) as f32 * x.d.to_f32() * y.d.to_f32()
            })
        }

        /// Q4_1 / Q5_1: `(d_x * d_y) * sumi + m_x * s_y` per block.
        #[inline]
        #[target_feature(enable = $features)]
        fn affine(d: F16Le, m: F16Le, sumi: i32, y: &BlockQ8_1) -> f32 {
            (d.to_f32() * y.d.to_f32()) * sumi as f32 + m.to_f32() * y.s.to_f32()
        }

        #[target_feature(enable = $features)]
        pub(super) fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                let (lo, hi) = nibbles(&x.qs, 0);
                s + affine(x.d, x.m, isum32(lo, hi, &y.qs), y)
            })
        }

        #[target_feature(enable = $features)]
        pub(super) fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                let sumi = isum32_of(&x.quants(), &y.qs);
                s + (x.d.to_f32() * y.d.to_f32()) * sumi as f32
            })
        }

        #[target_feature(enable = $features)]
        pub(super) fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                s + affine(x.d, x.m, isum32_of(&x.quants(), &y.qs), y)
            })
        }

        #[target_feature(enable = $features)]
        pub(super) fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                s + isum32_of(&x.qs, &y.qs) as f32 * (x.d.to_f32() * y.d.to_f32())
            })
        }

        #[target_feature(enable = $features)]
        pub(super) fn q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
            w.iter().zip(a).fold(0.0f32, |s, (x, y)| {
                let summs: i32 = (0..16)
                    .map(|k| i32::from(y.bsums[k]) * i32::from(x.min(k)))
                    .sum();
                let dall = y.d * x.d.to_f32();
                let dmin = y.d * x.dmin.to_f32();
                let q = x.quants();
                let (q, _) = q.as_chunks::<16>();
                let (yq, _) = y.qs.as_chunks::<16>();
                let isum: i32 = (0..16)
                    .map(|k| {
                        let isuml = vaddvq_s32($dot16(vdupq_n_s32(0), ld16(&q[k]), ld16(&yq[k])));
                        i32::from(x.scale(k)) * isuml
                    })
                    .sum();
                s + (dall * isum as f32 - dmin * summs as f32)
            })
        }

        /// The 8 lanes `Σ_{i ≡ l mod 8} scale(i / SUB) q_i y_i` of one 256-value block.
        #[inline]
        #[target_feature(enable = $features)]
        fn lanes<const SUB: usize, T: Byte>(
            q: &[T; QK_K],
            y: &[i8; QK_K],
            scale: impl Fn(usize) -> i16,
        ) -> [i32; 8] {
            let mut acc = [vdupq_n_s32(0); 2];
            let (q, _) = q.as_chunks::<16>();
            let (y, _) = y.as_chunks::<16>();
            for (c, (q, y)) in q.iter().zip(y).enumerate() {
                let sc = scale(16 * c / SUB);
                let (q, y) = (ld16(q), ld16(y));
                lanes8_add(&mut acc, vget_low_s8(q), vget_low_s8(y), sc);
                lanes8_add(&mut acc, vget_high_s8(q), vget_high_s8(y), sc);
            }
            let mut out = [0i32; 8];
            let (lo, hi) = out.split_at_mut(4);
            // SAFETY: `lo` and `hi` are 4 writable i32 each; `st1` needs no alignment.
            unsafe {
                vst1q_s32(lo.as_mut_ptr(), acc[0]);
                vst1q_s32(hi.as_mut_ptr(), acc[1]);
            }
            out
        }

        #[target_feature(enable = $features)]
        pub(super) fn q3_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
            let mut sum = LaneSum::new();
            for (x, y) in w.iter().zip(a) {
                let sc = x.scales();
                let l = lanes::<16, i8>(&x.quants(), &y.qs, |s| i16::from(sc[s]));
                sum.add(x.d.to_f32() * y.d, l, None);
            }
            sum.finish()
        }

        /// Q4_K / Q5_K: 6-bit scales and mins, mins meeting the activations through `bsums`.
        #[inline]
        #[target_feature(enable = $features)]
        fn k4(
            sum: &mut LaneSum,
            d: F16Le,
            dmin: F16Le,
            s: &[u8; 12],
            q: &[u8; QK_K],
            y: &BlockQ8K,
        ) {
            let (sc, m) = k4_scales_mins(s);
            let sumi: i32 = (0..16)
                .map(|j| i32::from(y.bsums[j]) * i32::from(m[j / 2]))
                .sum();
            let l = lanes::<32, u8>(q, &y.qs, |s| i16::from(sc[s]));
            sum.add(d.to_f32() * y.d, l, Some(dmin.to_f32() * y.d * sumi as f32));
        }

        #[target_feature(enable = $features)]
        pub(super) fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
            let mut sum = LaneSum::new();
            for (x, y) in w.iter().zip(a) {
                k4(&mut sum, x.d, x.dmin, &x.scales, &x.quants(), y);
            }
            sum.finish()
        }

        #[target_feature(enable = $features)]
        pub(super) fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
            let mut sum = LaneSum::new();
            for (x, y) in w.iter().zip(a) {
                k4(&mut sum, x.d, x.dmin, &x.scales, &x.quants(), y);
            }
            sum.finish()
        }

        #[target_feature(enable = $features)]
        pub(super) fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
            let mut sum = LaneSum::new();
            for (x, y) in w.iter().zip(a) {
                let l = lanes::<16, i8>(&x.quants(), &y.qs, |s| i16::from(x.scales[s]));
                sum.add(x.d.to_f32() * y.d, l, None);
            }
            sum.finish()
        }

        #[target_feature(enable = $features)]
        pub(super) fn f32(x: &[F32Le], y: &[f32]) -> f32 {
            float_dot(
                x,
                y,
                |v| ld_f32le4(v),
                |v| ld_f32x4(v),
                |a, b| f64::from(a.to_f32() * *b),
            )
        }

        #[target_feature(enable = $features)]
        pub(super) fn f16(x: &[F16Le], y: &[F16Le]) -> f32 {
            let conv = |h: &[F16Le; 4]| f16x4(ld_half4(bytemuck::cast_ref(h)));
            float_dot(x, y, conv, conv, |a, b| f64::from(a.to_f32() * b.to_f32()))
        }

        #[target_feature(enable = $features)]
        pub(super) fn bf16(x: &[Bf16Le], y: &[Bf16Le]) -> f32 {
            let conv = |h: &[Bf16Le; 4]| {
                vreinterpretq_f32_u32(vshlq_n_u32::<16>(ld_half4(bytemuck::cast_ref(h))))
            };
            float_dot(x, y, conv, conv, |a, b| f64::from(a.to_f32() * b.to_f32()))
        }
    };
}

/// 4 f16 bit patterns (in u32 lanes) to f32, exactly: exponent and mantissa moved into place
/// and scaled by 2^112 (subnormals included), infinities and NaNs (made quiet) by select.
#[inline]
#[target_feature(enable = "neon")]
fn f16x4(h: uint32x4_t) -> float32x4_t {
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let em = vandq_u32(h, vdupq_n_u32(0x7fff));
    let finite = vmulq_f32(
        vreinterpretq_f32_u32(vshlq_n_u32::<13>(em)),
        vdupq_n_f32(f32::from_bits(0x7780_0000)),
    );
    let mant = vshlq_n_u32::<13>(vandq_u32(em, vdupq_n_u32(0x3ff)));
    let inf_nan = vorrq_u32(vdupq_n_u32(0x7f80_0000), mant);
    let nan_quiet = vandq_u32(vcgtq_u32(em, vdupq_n_u32(0x7c00)), vdupq_n_u32(0x0040_0000));
    let special = vcgeq_u32(em, vdupq_n_u32(0x7c00));
    let bits = vbslq_u32(
        special,
        vorrq_u32(inf_nan, nan_quiet),
        vreinterpretq_u32_f32(finite),
    );
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// Float rows: 4×4 f32 FMA lanes over steps of 16, `(s0+s2)+(s1+s3)`, pairwise add, then the
/// tail in f64 (`tail(a, b)` is one product).
#[inline]
#[target_feature(enable = "neon")]
fn float_dot<X: Copy, Y: Copy>(
    x: &[X],
    y: &[Y],
    lx: impl Fn(&[X; 4]) -> float32x4_t,
    ly: impl Fn(&[Y; 4]) -> float32x4_t,
    tail: impl Fn(&X, &Y) -> f64,
) -> f32 {
    let n = x.len().min(y.len());
    let (xs, xt) = x[..n].as_chunks::<16>();
    let (ys, yt) = y[..n].as_chunks::<16>();
    let mut s = [vdupq_n_f32(0.0); 4];
    for (xc, yc) in xs.iter().zip(ys) {
        let (xv, _) = xc.as_chunks::<4>();
        let (yv, _) = yc.as_chunks::<4>();
        for j in 0..4 {
            s[j] = vfmaq_f32(s[j], lx(&xv[j]), ly(&yv[j]));
        }
    }
    let v = vaddq_f32(vaddq_f32(s[0], s[2]), vaddq_f32(s[1], s[3]));
    let mut sumf = f64::from(vaddvq_f32(v));
    for (a, b) in xt.iter().zip(yt) {
        sumf += tail(a, b);
    }
    sumf as f32
}

mod plain {
    kernels!("neon", dot16_plain);
}

mod sdot {
    kernels!("neon,dotprod", dot16_sdot);
}
