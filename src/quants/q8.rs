//! Activation quantizers: f32 activations → Q8_0, Q8_1, Q8_K blocks (and the F16 / BF16 / F32
//! "activation types" of float weights), exactly as ggml's CPU backend computes them.
//!
//! # Which ggml function each mirrors
//!
//! llama.cpp quantizes the activation row of a matrix product with
//! `type_traits_cpu[vec_dot_type].from_float`. On an x86 build with AVX/AVX2 (every build the
//! reference data came from) that is, per type:
//!
//! | type | ggml function (x86 build) | here |
//! | --- | --- | --- |
//! | Q8_0 | `quantize_row_q8_0` in `ggml-cpu/arch/x86/quants.c` (AVX path) | [`quantize_row_q8_0`] |
//! | Q8_1 | `quantize_row_q8_1` in `ggml-cpu/arch/x86/quants.c` (AVX2 path) | [`quantize_row_q8_1`] |
//! | Q8_K | `quantize_row_q8_K` (x86) = `quantize_row_q8_K_ref` in `ggml-quants.c` (`ggml-base`, no FMA in the reference build) | [`quantize_row_q8_k`] |
//! | F16 | `ggml_cpu_fp32_to_fp16` (F16C, round to nearest even) | [`F16Le::from_f32`] |
//! | BF16 | `ggml_cpu_fp32_to_bf16` = `ggml_compute_fp32_to_bf16` | [`Bf16Le::from_f32`] |
//!
//! The portable `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref` (what a non-x86 or non-AVX
//! build uses, and what model files are written with) differ from the x86 path in two ways:
//!
//! * **scale**: x86 multiplies by `id = 127 / amax`; ref by `id = 1 / (amax / 127)`. The two
//!   f32 values differ in the last bit for some `amax`, which moves values lying near a rounding
//!   boundary;
//! * **rounding**: x86 uses `_mm256_round_ps(_, _MM_ROUND_NEAREST)`, ties to even
//!   (`2.5 → 2`); ref uses `roundf`, ties away from zero (`2.5 → 3`).
//!
//! Both store `d = amax / 127` as f16, and both compute Q8_1's `s` as `f16(d * Σ qs)` from the
//! *integer* quants (x86 sums the int32 lanes before packing, ref the stored int8s; they only
//! differ where packing saturates, i.e. for non-finite input). They are provided as
//! [`quantize_row_q8_0_ref`] and [`quantize_row_q8_1_ref`].
//!
//! Q8_K has a single C definition, but its arithmetic depends on the compiler flags of the
//! file it lives in, `ggml-quants.c`, which belongs to `ggml-base`, not to the CPU backend.
//! llama.cpp's CMake gives `ggml-base` no instruction-set flags unless `GGML_NATIVE=ON` (the
//! CPU variant flags `-mavx2 -mfma ...` of `GGML_NATIVE=OFF` builds apply to `ggml-cpu` only),
//! so in the reference build (`GGML_NATIVE=OFF`, SSE2 baseline) `nearest_int(iscale * x)`
//! rounds the f32 product and then adds `1.5*2^23` (`mulps` + `addps` in its disassembly):
//! [`quantize_row_q8_k`]. A `-march=native` GCC build (`-std=gnu11`, hence
//! `-ffp-contract=fast`, plus FMA) fuses the two into one `vfmadd`, which rounds the exact
//! product instead: [`quantize_row_q8_k_fma`]. The Q8_0/Q8_1 paths are intrinsics with no add
//! to fuse, and the dequantizers are immune too (wherever they add, the product before it is
//! exact in f32), so nothing else here depends on contraction.
//!
//! Degenerate input is mirrored too: NaN compares like x86 `maxps`; a value out of int32 range
//! (from an `amax` so small that `127 / amax` overflows, or from inf/NaN) converts to
//! `i32::MIN`, which the x86 path saturates to -128 and the ref path (where C leaves the
//! float→int8 conversion undefined) truncates to 0 as GCC's x86 code does.

use bytemuck::Pod;

use super::act::ActRow;
use super::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK32};
use super::scalars::{Bf16Le, F16Le};
use super::{GgmlType, QuantError};

/// A block of an activation type (ggml's `vec_dot_type`): what a weight row is dotted with.
pub trait ActBlock: Pod + Default {
    /// The ggml type of this activation block.
    const TYPE: GgmlType;
    /// Values per block.
    const N: usize = Self::TYPE.block_size();

    /// Quantizes `x[..N]` into one block, as ggml's x86 CPU backend does. Panics if `x` holds
    /// fewer than `N` values (the row functions check lengths and return errors instead).
    fn quantize(x: &[f32]) -> Self;

    /// Writes the block's `N` values to `out[..N]`.
    fn dequantize(&self, out: &mut [f32]);

    /// This type's blocks inside an [`ActRow`], if the row holds this type.
    fn blocks_in(row: &ActRow) -> Option<&[Self]>;
}

/// x86 `maxps` on one lane: `a` if `a > b`, else `b` (so a NaN in either operand yields `b`).
#[inline]
fn maxps(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `max |x[i]|` of a 32-value block, reduced in the exact lane order of ggml's AVX code (which
/// only matters for NaN inputs): 8 lanes over 4 registers, then hi/lo halves, `movehl`,
/// `movehdup`.
fn x86_absmax32(x: &[f32; 32]) -> f32 {
    let lanes: [f32; 8] =
        std::array::from_fn(|k| (1..4).fold(x[k].abs(), |m, r| maxps(m, x[8 * r + k].abs())));
    let m4: [f32; 4] = std::array::from_fn(|k| maxps(lanes[4 + k], lanes[k]));
    maxps(maxps(m4[0], m4[2]), maxps(m4[1], m4[3]))
}

/// 1.5 * 2^23: adding it to an f32 of magnitude below 2^22 rounds to an integer, ties to even.
const MAGIC: f32 = 12_582_912.0;
/// 1.5 * 2^52: the same for f64 values of magnitude below 2^51.
const MAGIC64: f64 = 6_755_399_441_055_744.0;

/// Round to nearest, ties to even (`_mm256_round_ps(_, _MM_ROUND_NEAREST)`). Same result as
/// `f32::round_ties_even` (up to the sign of a zero), without the libm call that baseline x86-64
/// makes for it.
#[inline]
fn round_even(v: f32) -> f32 {
    if v.abs() < 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v.round_ties_even()
    }
}

/// `_mm256_cvtps_epi32` of an already integral value: out of range or NaN gives `i32::MIN`.
#[inline]
fn cvtps_epi32(r: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&r) {
        r as i32
    } else {
        i32::MIN
    }
}

/// The first 32 values of `x`, which the block quantizers' contract requires.
#[inline]
fn block32(x: &[f32]) -> &[f32; 32] {
    match x.first_chunk() {
        Some(b) => b,
        None => panic!(
            "a 32-value activation block needs 32 values, got {}",
            x.len()
        ),
    }
}

/// ggml's x86 Q8 core: returns `(d, qs as int32 before packing)`.
fn x86_q8_block(x: &[f32; 32]) -> (f32, [i32; 32]) {
    let amax = x86_absmax32(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, x.map(|v| cvtps_epi32(round_even(v * id))))
}

/// `packs_epi32` then `packs_epi16`: signed saturation to i8.
#[inline]
fn sat_i8(v: i32) -> i8 {
    v.clamp(-128, 127) as i8
}

/// ggml's ref Q8 core (`quantize_row_q8_{0,1}_ref`): returns `(d, qs)`.
fn ref_q8_block(x: &[f32; 32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0.0f32, |m, v| maxps(m, v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `roundf`: ties away from zero. C's float→int8_t conversion is undefined out of range;
    // GCC's x86 code converts with `cvttps2dq` (out of range or NaN: i32::MIN) and keeps the
    // low byte, which this mirrors.
    (d, x.map(|v| cvtps_epi32((v * id).round()) as i8))
}

impl ActBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;

    fn quantize(x: &[f32]) -> Self {
        let (d, q) = x86_q8_block(block32(x));
        BlockQ8_0 {
            d: F16Le::from_f32(d),
            qs: q.map(sat_i8),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        super::dequant::WeightBlock::dequantize(self, out);
    }

    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::Q8_0(b) => Some(b),
            _ => None,
        }
    }
}

impl ActBlock for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;

    fn quantize(x: &[f32]) -> Self {
        let (d, q) = x86_q8_block(block32(x));
        // `_mm256_add_epi32` + `hsum_i32_8`: wrapping int32 sum of the unpacked lanes.
        let sum = q.iter().fold(0i32, |s, &v| s.wrapping_add(v));
        BlockQ8_1 {
            d: F16Le::from_f32(d),
            s: F16Le::from_f32(d * sum as f32),
            qs: q.map(sat_i8),
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out[..QK32].iter_mut().zip(&self.qs) {
            *o = f32::from(q) * d;
        }
    }

    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::Q8_1(b) => Some(b),
            _ => None,
        }
    }
}

/// ggml's `nearest_int(v)`: `v + 1.5 * 2^23` rounds to an integer (ties to even) in the low
/// mantissa bits (valid for `|v| <= 4194303`, which the Q8_K scale guarantees for finite input).
#[inline]
fn magic_round(sum: f32) -> i32 {
    (sum.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// How `nearest_int(iscale * x)` is evaluated.
#[derive(Clone, Copy)]
enum Q8kRounding {
    /// As GCC compiles it with FMA available (`-march=native`; `-std=gnu11` implies
    /// `-ffp-contract=fast`): the product and the magic-number add fuse into one FMA, so the
    /// *exact* product is rounded to an integer.
    Fused,
    /// As the C source reads, and as llama.cpp's `GGML_NATIVE=OFF` build compiles it (no FMA
    /// in `ggml-base`): the product is rounded to f32 first, then to an integer. Differs from
    /// `Fused` when that first rounding lands on or across a half-integer.
    Separate,
}

/// `quantize_row_q8_K_ref` on one block: the signed value of largest magnitude `max` (first
/// one on ties) maps to -127 — note the sign: `iscale = -127 / max`, so a block whose extreme
/// value is positive stores a *negative* `d = 1 / iscale` and negated quants. An all-zero
/// block gets `d = 0`, zero quants and zero `bsums` (ggml leaves `bsums` untouched there, but
/// they are only ever multiplied by `d = 0`).
fn q8k_block(x: &[f32], rounding: Q8kRounding) -> BlockQ8K {
    let x = &x[..QK_K];
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut y = BlockQ8K::default();
    if amax == 0.0 {
        return y;
    }
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        let r = match rounding {
            Q8kRounding::Fused => {
                // The FMA rounds the exact product to an integer, ties to even, whenever it
                // stays in the magic range. The product is exact in f64 (24 + 24 bits), and the
                // same magic trick one precision up rounds it once. Otherwise (non-finite input)
                // compute the FMA itself (a libm call on baseline x86-64, hence not first).
                let p = f64::from(iscale) * f64::from(v);
                if p.abs() < 4_194_304.0 {
                    ((p + MAGIC64) - MAGIC64) as i32
                } else {
                    magic_round(iscale.mul_add(v, MAGIC))
                }
            }
            Q8kRounding::Separate => magic_round(iscale * v + MAGIC),
        };
        // `MIN(127, v)` stored to an int8_t: C's modulo conversion (only reachable for
        // non-finite input).
        *q = r.min(127) as i8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
    y.d = 1.0 / iscale;
    y
}

impl ActBlock for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8K;

    /// llama.cpp's Q8_K quantizer as the reference build compiles it, see
    /// [`quantize_row_q8_k`].
    fn quantize(x: &[f32]) -> Self {
        q8k_block(x, Q8kRounding::Separate)
    }

    fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out[..QK_K].iter_mut().zip(&self.qs) {
            *o = self.d * f32::from(q);
        }
    }

    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::Q8K(b) => Some(b),
            _ => None,
        }
    }
}

impl ActBlock for F16Le {
    const TYPE: GgmlType = GgmlType::F16;
    fn quantize(x: &[f32]) -> Self {
        F16Le::from_f32(x[0])
    }
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::F16(b) => Some(b),
            _ => None,
        }
    }
}

impl ActBlock for Bf16Le {
    const TYPE: GgmlType = GgmlType::BF16;
    fn quantize(x: &[f32]) -> Self {
        Bf16Le::from_f32(x[0])
    }
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::BF16(b) => Some(b),
            _ => None,
        }
    }
}

impl ActBlock for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    fn quantize(x: &[f32]) -> Self {
        x[0]
    }
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self;
    }
    fn blocks_in(row: &ActRow) -> Option<&[Self]> {
        match row {
            ActRow::F32(b) => Some(b),
            _ => None,
        }
    }
}

/// Checks that `x` fills `out` exactly with blocks of `B`.
pub(crate) fn check_row<B: ActBlock>(x: &[f32], blocks: usize) -> Result<(), QuantError> {
    let ty = B::TYPE;
    let n = x.len();
    if !n.is_multiple_of(B::N) {
        return Err(QuantError::RaggedRow { ty, n, block: B::N });
    }
    if n / B::N != blocks {
        return Err(QuantError::BlockCount {
            ty,
            n,
            got: blocks,
            expected: n / B::N,
        });
    }
    Ok(())
}

/// Quantizes a row with `B`'s x86-path quantizer into `out` (`x.len() / B::N` blocks).
pub fn quantize_row<B: ActBlock>(x: &[f32], out: &mut [B]) -> Result<(), QuantError> {
    check_row::<B>(x, out.len())?;
    for (o, x) in out.iter_mut().zip(x.chunks_exact(B::N)) {
        *o = B::quantize(x);
    }
    Ok(())
}

/// Dequantizes activation blocks into `out` (`out.len()` must be `blocks.len() * B::N`).
pub fn dequantize_act<B: ActBlock>(blocks: &[B], out: &mut [f32]) -> Result<(), QuantError> {
    check_row::<B>(out, blocks.len())?;
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::N)) {
        b.dequantize(o);
    }
    Ok(())
}

/// Q8_0 activations as ggml's x86 `quantize_row_q8_0` makes them (AVX/AVX2 path):
/// `amax = max |x|`, `d = f16(amax / 127)`, `qs = round_ties_even(x * (127 / amax))`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), QuantError> {
    quantize_row(x, out)
}

/// Q8_1 activations as ggml's x86 `quantize_row_q8_1` makes them (AVX2 path): the quants of
/// [`quantize_row_q8_0`], plus `s = f16(d * Σ qs)` with `d` the f32 `amax / 127` (before f16
/// rounding) and the sum over the integer quants. As in ggml, `s` overflows to infinity once
/// `|d * Σ qs|` passes the f16 range (65504), i.e. for blocks summing to more than ~65k.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) -> Result<(), QuantError> {
    quantize_row(x, out)
}

/// Q8_K activations as llama.cpp's reference build makes them. ggml's x86 `quantize_row_q8_K`
/// just calls `quantize_row_q8_K_ref` (there is no SIMD version), which `GGML_NATIVE=OFF`
/// builds compile without FMA (see the module docs): `iscale * x` is rounded to f32, then to the
/// nearest integer, ties to even. Per block: `max` = the value of largest magnitude,
/// `iscale = -127 / max`, `qs = min(127, round(iscale * x))`, `d = 1 / iscale` (negative when
/// `max > 0`), `bsums` = sums of 16 quants.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) -> Result<(), QuantError> {
    quantize_row(x, out)
}

/// `quantize_row_q8_K_ref` as GCC compiles it with FMA (`-march=native`): `iscale * x + 1.5*2^23`
/// fused into one FMA, so the *exact* product is rounded to an integer. Not what the reference
/// build computes; see [`quantize_row_q8_k`].
pub fn quantize_row_q8_k_fma(x: &[f32], out: &mut [BlockQ8K]) -> Result<(), QuantError> {
    check_row::<BlockQ8K>(x, out.len())?;
    for (o, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        *o = q8k_block(x, Q8kRounding::Fused);
    }
    Ok(())
}

/// ggml's portable `quantize_row_q8_0_ref` (`ggml-quants.c`): `id = 1 / (amax / 127)` and
/// `roundf` (ties away from zero). Not what llama.cpp's x86 CPU backend computes; see the
/// module docs.
pub fn quantize_row_q8_0_ref(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), QuantError> {
    check_row::<BlockQ8_0>(x, out.len())?;
    for (o, x) in out.iter_mut().zip(x.chunks_exact(QK32)) {
        let (d, qs) = ref_q8_block(block32(x));
        *o = BlockQ8_0 {
            d: F16Le::from_f32(d),
            qs,
        };
    }
    Ok(())
}

/// ggml's portable `quantize_row_q8_1_ref` (`ggml-quants.c`): the quants of
/// [`quantize_row_q8_0_ref`] and `s = f16(Σ qs * d)`.
pub fn quantize_row_q8_1_ref(x: &[f32], out: &mut [BlockQ8_1]) -> Result<(), QuantError> {
    check_row::<BlockQ8_1>(x, out.len())?;
    for (o, x) in out.iter_mut().zip(x.chunks_exact(QK32)) {
        let (d, qs) = ref_q8_block(block32(x));
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        *o = BlockQ8_1 {
            d: F16Le::from_f32(d),
            s: F16Le::from_f32(sum as f32 * d),
            qs,
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absmax_lane_order_matters_only_for_nan() {
        let mut x = [0.0f32; 32];
        x[17] = -3.0;
        x[30] = 2.0;
        assert_eq!(x86_absmax32(&x), 3.0);
        // A NaN in lane 0 of the first register is replaced by the next register's lane 0.
        x[0] = f32::NAN;
        assert_eq!(x86_absmax32(&x), 3.0);
        // A NaN in the last register wins its lane and the hi/lo step (NaN is the second
        // operand there), then loses at the `movehl` step where it is the first operand.
        let mut y = [1.0f32; 32];
        y[24] = f32::NAN;
        assert_eq!(x86_absmax32(&y), 1.0);
    }

    #[test]
    fn magic_round_is_ties_to_even() {
        let r = |v: f32| magic_round(v + MAGIC);
        assert_eq!(r(0.5), 0);
        assert_eq!(r(1.5), 2);
        assert_eq!(r(-2.5), -2);
        assert_eq!(r(-126.6), -127);
        assert_eq!(magic_round(f32::NAN), 0);
    }

    #[test]
    fn cvt_out_of_range() {
        assert_eq!(cvtps_epi32(f32::NAN), i32::MIN);
        assert_eq!(cvtps_epi32(f32::INFINITY), i32::MIN);
        assert_eq!(cvtps_epi32(-7.0), -7);
        assert_eq!(sat_i8(i32::MIN), -128);
    }
}
