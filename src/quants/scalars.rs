//! Storage scalars of alignment 1: little-endian f16, bf16 and f32 as they lie in a GGUF file.
//!
//! GGUF tensor data is only 32-byte aligned and most blocks have odd sizes, so a block starting
//! at an arbitrary byte offset of a memory map cannot hold a `u16` or `f32` field. These
//! newtypes wrap the raw bytes instead, which keeps every weight block at alignment 1 and lets
//! `bytemuck` view any byte slice as blocks without copying.

use bytemuck::{Pod, Zeroable};

/// An IEEE binary16 value stored as two little-endian bytes (ggml's `ggml_half`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    /// Exact widening to f32, like ggml's `GGML_FP16_TO_FP32` (F16C `vcvtph2ps`), subnormals
    /// included.
    #[inline]
    pub fn to_f32(self) -> f32 {
        half::f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }

    /// Round-to-nearest-even narrowing, like ggml's `GGML_CPU_FP32_TO_FP16` (F16C `vcvtps2ph`
    /// with rounding mode 0) and the software `GGML_FP32_TO_FP16`. The two ggml paths and this
    /// one agree on every non-NaN input; NaN payloads may differ (ggml's software path makes
    /// every NaN `0x7E00`).
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F16Le(half::f16::from_f32(x).to_bits().to_le_bytes())
    }

    /// The raw bit pattern.
    #[inline]
    pub fn to_bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// From a raw bit pattern.
    #[inline]
    pub fn from_bits(bits: u16) -> Self {
        F16Le(bits.to_le_bytes())
    }
}

impl std::fmt::Debug for F16Le {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}f16", self.to_f32())
    }
}

/// A bfloat16 value stored as two little-endian bytes (ggml's `ggml_bf16_t`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct Bf16Le(pub [u8; 2]);

impl Bf16Le {
    /// Exact widening to f32: the 16 bits become the high half of the f32.
    #[inline]
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes(self.0)) << 16)
    }

    /// Narrowing exactly as ggml's `ggml_compute_fp32_to_bf16`: a NaN keeps its top bits and is
    /// forced quiet (bit 6 of the bf16 set); everything else rounds to nearest even, overflowing
    /// to infinity.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        let u = x.to_bits();
        let bits = if u & 0x7fff_ffff > 0x7f80_0000 {
            (u >> 16) | 64
        } else {
            // Cannot overflow u32: the largest non-NaN pattern 0xff80_0000 plus 0x8000 fits.
            (u + (0x7fff + ((u >> 16) & 1))) >> 16
        };
        Bf16Le((bits as u16).to_le_bytes())
    }
}

impl std::fmt::Debug for Bf16Le {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}bf16", self.to_f32())
    }
}

/// An f32 stored as four little-endian bytes: the element of an F32 tensor, readable at any
/// byte offset.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct F32Le(pub [u8; 4]);

impl F32Le {
    #[inline]
    pub fn to_f32(self) -> f32 {
        f32::from_le_bytes(self.0)
    }

    #[inline]
    pub fn from_f32(x: f32) -> Self {
        F32Le(x.to_le_bytes())
    }
}

impl std::fmt::Debug for F32Le {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}f32", self.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_subnormals() {
        assert_eq!(F16Le::from_bits(0x3c00).to_f32(), 1.0);
        assert_eq!(F16Le::from_bits(0x0001).to_f32(), 2f32.powi(-24));
        assert_eq!(F16Le::from_bits(0x8000).to_f32().to_bits(), 0x8000_0000);
        // 1 + 2^-11 is halfway between 1 and the next f16: ties to even (1.0).
        assert_eq!(F16Le::from_f32(1.0 + 2f32.powi(-11)).to_bits(), 0x3c00);
        // 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: ties to even (1+2^-9).
        assert_eq!(
            F16Le::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_bits(),
            0x3c02
        );
        assert_eq!(F16Le::from_f32(65520.0).to_bits(), 0x7c00);
    }

    #[test]
    fn bf16_matches_ggml_rounding() {
        assert_eq!(Bf16Le::from_f32(1.0).0, [0x80, 0x3f]);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1.
        assert_eq!(Bf16Le::from_f32(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        // 1 + 3*2^-8 ties to 1 + 2^-6 (even).
        assert_eq!(
            Bf16Le::from_f32(1.0 + 3.0 * 2f32.powi(-8)).to_f32(),
            1.0 + 2f32.powi(-6)
        );
        let nan = Bf16Le::from_f32(f32::from_bits(0x7f80_0001));
        assert_eq!(u16::from_le_bytes(nan.0), 0x7fc0);
        assert_eq!(Bf16Le::from_f32(f32::MAX).to_f32(), f32::INFINITY);
        assert_eq!(Bf16Le::from_f32(-0.0).0, [0x00, 0x80]);
    }
}
