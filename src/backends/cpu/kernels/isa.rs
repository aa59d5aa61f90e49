//! The instruction set the element-wise kernels run with: the **one** ISA dispatch of the CPU
//! backend, [`crate::quants::simd::Isa`], shared with the matrix-product kernels.
//!
//! Every SIMD kernel has a scalar twin that performs the same floating-point operations in the
//! same order, lane for lane, so the choice changes speed, never results: the AVX-512, AVX2 and
//! scalar paths are bit-identical (the tests check it). The arithmetic they all share is the
//! one llama.cpp's CPU backend performs when it is built for AVX-512 (the build the reference
//! data comes from); the AVX2 path emulates the 16-lane AVX-512 layout with pairs of 8-lane
//! registers.
//!
//! Detection runs once, in [`crate::quants::simd::active_isa`], which reads the
//! `MINFER_NO_AVX512=1` / `MINFER_NO_AVX2=1` / `MINFER_NO_NEON=1` levers. The element-wise
//! kernels have x86 paths only: on ARM (either NEON level) they run the scalar twins, whose
//! `mul_add` is one hardware FMA there.

pub use crate::quants::simd::Isa;

#[cfg(target_arch = "x86_64")]
use super::simd_x86::{Avx2, Avx512};

impl Isa {
    /// The ISA this process runs (detected once, after the environment levers).
    pub fn detected() -> Isa {
        crate::quants::simd::active_isa()
    }

    /// The instruction sets this CPU supports, [`Isa::Scalar`] first (tests and benchmarks).
    pub fn supported() -> Vec<Isa> {
        crate::quants::simd::supported_isas()
    }

    /// The element-wise kernels for a request of `self`: the best this CPU has that is not
    /// above it (an AVX-512 request on an AVX2-only CPU runs AVX2; NEON runs the scalar twins).
    pub(crate) fn kernels(self) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if self == Isa::Avx512
                && let Some(t) = Avx512::detect()
            {
                return Kernels::Avx512(t);
            }
            if matches!(self, Isa::Avx512 | Isa::Avx2)
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
    fn detected_is_supported_and_kernels_never_exceed_the_request() {
        assert!(Isa::detected().is_supported());
        assert_eq!(Isa::supported()[0], Isa::Scalar);
        for isa in Isa::ALL {
            let ran = match isa.kernels() {
                Kernels::Scalar => Isa::Scalar,
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx2(_) => Isa::Avx2,
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx512(_) => Isa::Avx512,
            };
            let allowed: &[Isa] = match isa {
                Isa::Avx512 => &[Isa::Avx512, Isa::Avx2, Isa::Scalar],
                Isa::Avx2 => &[Isa::Avx2, Isa::Scalar],
                _ => &[Isa::Scalar],
            };
            assert!(allowed.contains(&ran), "{isa:?} ran as {ran:?}");
        }
    }
}
