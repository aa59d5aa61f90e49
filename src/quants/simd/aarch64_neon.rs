//! aarch64 NEON kernels (placeholder: every dot runs the scalar reference until the NEON
//! kernels land).

use crate::quants::blocks::*;
use crate::quants::dot::VecDot;
use crate::quants::scalars::{Bf16Le, F16Le, F32Le};

/// Proof that this CPU runs NEON (and SDOT when `dotprod` is set).
#[derive(Debug, Clone, Copy)]
pub struct Neon {
    dotprod: bool,
}

impl Neon {
    /// `Some` if the CPU has NEON (and `dotprod`, when asked for).
    pub(super) fn detect(dotprod: bool) -> Option<Neon> {
        let ok = std::arch::is_aarch64_feature_detected!("neon")
            && (!dotprod || std::arch::is_aarch64_feature_detected!("dotprod"));
        ok.then_some(Neon { dotprod })
    }
}

macro_rules! scalar_entries {
    ($($name:ident: ($w:ty, $a:ty);)*) => {
        impl Neon {$(
            #[inline]
            pub fn $name(self, w: &[$w], a: &[$a]) -> f32 {
                let _ = self.dotprod;
                <$w as VecDot>::vec_dot(w, a)
            }
        )*}
    };
}

scalar_entries! {
    f32: (F32Le, f32); f16: (F16Le, F16Le); bf16: (Bf16Le, Bf16Le);
    q4_0: (BlockQ4_0, BlockQ8_0); q4_1: (BlockQ4_1, BlockQ8_1); q5_0: (BlockQ5_0, BlockQ8_0);
    q5_1: (BlockQ5_1, BlockQ8_1); q8_0: (BlockQ8_0, BlockQ8_0);
    q2_k: (BlockQ2K, BlockQ8K); q3_k: (BlockQ3K, BlockQ8K); q4_k: (BlockQ4K, BlockQ8K);
    q5_k: (BlockQ5K, BlockQ8K); q6_k: (BlockQ6K, BlockQ8K);
}
