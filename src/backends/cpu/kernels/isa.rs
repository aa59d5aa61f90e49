//! Which instruction set the kernels of this module run with.
//!
//! Every SIMD kernel has a scalar twin that performs the same floating-point operations in the
//! same order, lane for lane, so the choice changes speed, never results: the AVX-512, AVX2 and
//! scalar paths are bit-identical (the tests check it). The arithmetic they all share is the
//! one llama.cpp's CPU backend performs when it is built for AVX-512 (the build the reference
//! data comes from); the AVX2 path emulates the 16-lane AVX-512 layout with pairs of 8-lane
//! registers.
//!
//! Detection runs once and follows the matmul kernels' choice
//! ([`crate::quants::simd::active_isa`], which reads the `MINFER_NO_AVX512=1` /
//! `MINFER_NO_AVX2=1` / `MINFER_NO_NEON=1` levers); there is no NEON path here (ARM runs the
//! scalar twins, whose `mul_add` is one hardware FMA there).

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::simd_x86::{Avx2, Avx512};

/// An instruction set for the kernels of [`vec_ops`](super).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, on any CPU.
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/DQ (never AMX).
    Avx512,
}

impl Isa {
    /// All instruction sets, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The best instruction set this CPU has and the environment levers allow (detected once).
    /// The levers are read in one place, [`crate::quants::simd::active_isa`]: these kernels
    /// follow the matmul kernels' choice, stepping down where they need a feature it lacks.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            use crate::quants::simd::{Isa as DotIsa, active_isa};
            let wanted = match active_isa() {
                DotIsa::Avx512 => Isa::Avx512,
                DotIsa::Avx2 => Isa::Avx2,
                _ => Isa::Scalar,
            };
            Isa::ALL.into_iter().rev().find(|&i| i <= wanted && i.is_supported()).unwrap_or(Isa::Scalar)
        })
    }

    /// Whether this CPU can run the kernels of `self` (the environment levers aside).
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::detect().is_some(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::detect().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The instruction sets this CPU supports, lowest first (for tests and benchmarks).
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The kernels to run for a request of `self`: the best supported set not above it.
    pub(crate) fn kernels(self) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if self >= Isa::Avx512
                && let Some(t) = Avx512::detect()
            {
                return Kernels::Avx512(t);
            }
            if self >= Isa::Avx2
                && let Some(t) = Avx2::detect()
            {
                return Kernels::Avx2(t);
            }
        }
        Kernels::Scalar
    }
}

/// A dispatch target carrying the proof (a token from `simd_x86`) that its instructions exist.
#[derive(Clone, Copy)]
pub(crate) enum Kernels {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_is_supported_and_kernels_never_exceed_the_cpu() {
        assert!(Isa::detected().is_supported());
        assert_eq!(Isa::supported()[0], Isa::Scalar);
        for isa in Isa::ALL {
            let got = match isa.kernels() {
                Kernels::Scalar => Isa::Scalar,
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx2(_) => Isa::Avx2,
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx512(_) => Isa::Avx512,
            };
            assert!(got <= isa && got.is_supported(), "{isa:?} ran as {got:?}");
        }
    }
}
