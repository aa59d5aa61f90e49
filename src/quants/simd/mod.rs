//! SIMD dot products, one file per instruction set, chosen at run time (after ggml-cpu's
//! `arch/*/quants.c` and `cpu-feats.cpp`).
//!
//! # Map
//!
//! * [`Isa`]: the instruction sets minfer has kernels for, [`active_isa`] (the best one this CPU
//!   runs, after the `MINFER_NO_*` levers) and [`supported_isas`] (every one it can run).
//! * [`Kernels`]: a handle on one ISA's kernels, proven runnable; [`Kernels::dot`] is the hot
//!   call of the matrix multiply. [`Kernels::dot_rows`] / [`Kernels::gemv_rows`] take one
//!   weight row against a few tokens (batched decoding): on x86 the Q5_0, Q8_0, Q6_K and
//!   repacked Q4_K kernels (`*_rows`) unpack each weight block once for up to four tokens and
//!   keep every token's sum in its single dot's order, so each element has the dot's bits.
//! * [`SimdDot`]: implemented by every weight block type; ties it to its kernel in each ISA.
//! * [`vec_dot_row_isa`] / [`vec_dot_isa`]: checked one-off dots with an explicit ISA (tests).
//! * `x86_avx2.rs`, `x86_avx512.rs`, `aarch64_neon.rs`: the kernels. `unsafe` lives only there.
//!   `x86_avx2_gemm.rs` / `x86_avx512_gemm.rs`: the many-token (prefill) tiles of each x86 ISA;
//!   `x86_avx512_pairs.rs`: the few-token pair kernels ([`Kernels::b32_pairs`],
//!   [`Kernels::k4_gemv_pairs`], [`Kernels::k6_pairs`]; see [`gemm_pairs`](super::gemm_pairs)).
//!   The scalar ISA is the reference dots of [`dot`](super::dot).
//!
//! # Levers
//!
//! Detection runs once (a [`OnceLock`] holds its result). `MINFER_NO_AVX2=1` drops x86 to
//! scalar, `MINFER_NO_AVX512=1` drops AVX-512 to AVX2, `MINFER_NO_NEON=1` drops aarch64 to
//! scalar. They steer [`active_isa`] only; [`Kernels::for_isa`] runs any ISA the CPU has.
//!
//! # Numerics: which ggml kernel each one mirrors
//!
//! llama.cpp's reference logits come from its x86 build with AVX-512 (+VNNI, +BF16) and its
//! single-token path (`ggml_vec_dot_*`; the llamafile sgemm only runs for two or more tokens).
//! In that build every quantized `ggml_vec_dot_*` takes its `__AVX2__` branch; AVX-512 VNNI only
//! replaces `maddubs`+`madd` by `vpdpbusd` inside `mul_sum_us8_pairs_float`, which gives the
//! same integers. Inside a block all sums are exact integers, so the float result depends only on
//! *which* integers meet *which* float accumulator lane, and in what order. The x86 kernels here
//! reproduce that lane layout and order:
//!
//! | weight · act | ggml kernel (x86) | AVX2 here | AVX-512 here |
//! | --- | --- | --- | --- |
//! | Q4_0, Q5_0, Q8_0 · Q8_0 | `acc = fma(d, lanes, acc)`, `hsum_float_8` | same order | same order (VNNI) |
//! | Q4_1, Q5_1 · Q8_1 | same, `+ summs` (`m*s` summed in f32, FMA-contracted by GCC) | same order | same order (VNNI) |
//! | Q2_K … Q6_K · Q8_K | per-block 8 i32 lanes (`(i%32)/4`), mins via `bsums`, `fma`, `hsum_float_8` | same order | same order (AVX2 code) |
//! | F32 · F32 | `ggml_vec_dot_f32`, `GGML_F32_STEP` accumulators + reduce | AVX build: 4×8 lanes | AVX-512 build: 4×16 lanes |
//! | F16 · F16 | `ggml_vec_dot_f16`, same layout, f64 tail | AVX build | AVX-512 build |
//! | BF16 · BF16 | `ggml_vec_dot_bf16` | AVX2 build: 4×8 lanes `mul`+`add` | AVX512_BF16 build: `vdpbf16ps` emulated (exact products, odd then even) |
//! | Q4_0 · Q8_0, Q4_K · Q8_K, matrix of 8k rows | repacked `ggml_gemv_*_8x8` ([`gemv`](super::gemv)): whole block integer, one `fma` per block | [`Kernels::gemv`] | same |
//! | Q2_K · Q8_K, matrix of 8k rows | AVX-512 build: repacked `ggml_gemv_q2_K_8x8_q8_K`; AVX2 build: `vec_dot` | `vec_dot` order | gemv order |
//!
//! An AVX-512 CPU without VNNI runs the AVX2 kernels: the same quantized results as its ggml
//! build (VNNI changes no integer), but the F32/F16/BF16 order of ggml's AVX2 build.
//!
//! "Same order" is checked bit for bit against ggml's own SIMD kernels compiled on this machine
//! (`tests/matmul_dots.rs` reads `tests/data/q8-oracle.jsonl`). Known differences: ggml's
//! `vdpbf16ps` flushes subnormal inputs and outputs to zero, the emulation does not; the
//! `sign_epi8` trick of ggml (mirrored) gets `x * -128` wrong for `x < 0`, which the x86
//! activation quantizers never produce from finite input.
//!
//! The NEON kernels (`aarch64_neon.rs`) do not follow ggml's ARM kernels: their quantized dots
//! keep the scalar reference's float order and are bit-identical to [`Isa::Scalar`] (ggml's
//! generic kernels); their F32/F16/BF16 rows use ggml's NEON 4×4-lane layout, unverified against
//! ggml (no ARM build here), within a few f32 roundings of the scalar f64 sums. CI runs them
//! under qemu-aarch64 (`scripts/test_neon.sh`: with and without dotprod).

use std::fmt;
use std::sync::OnceLock;

use super::blocks::*;
use super::dequant::{WeightBlock, blocks_of};
use super::dot::VecDot;
use super::gemm::{B32Panel, B32Tile, Block32Gemm, RowLaneTile};
use super::gemm_pairs::{B32Pairs, K8Pairs};
use super::gemm_k::{K4Tile, K6Tile, K8Panel};
use super::packed_b32::B32Packed;
use super::packed_k4::{K4Packed, K8Row};
use super::packed_k6::K6Packed;
use super::q8::ActBlock;
use super::scalars::{Bf16Le, F16Le, F32Le};
use super::{ActRow, GgmlType, QuantError};

#[cfg(target_arch = "aarch64")]
mod aarch64_neon;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx2_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_avx2_pairs;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_fill;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_gemm;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_pairs;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_packed;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_packed_k6;
#[cfg(target_arch = "x86_64")]
mod x86_q8;

/// An instruction set minfer has dot-product kernels for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// The scalar reference dots (ggml's generic order); runs everywhere.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI (plus AVX2, FMA, F16C).
    Avx512,
    /// aarch64 Advanced SIMD, without the dot-product extension.
    Neon,
    /// aarch64 Advanced SIMD with `SDOT` (the `dotprod` feature).
    NeonDotprod,
}

impl Isa {
    /// Every ISA, weakest first within each architecture.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Neon,
        Isa::NeonDotprod,
    ];

    /// A short lower-case name (`"avx512"`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon+dotprod",
        }
    }

    /// Whether this CPU can run the ISA's kernels (the `MINFER_NO_*` levers do not matter here).
    pub fn is_supported(self) -> bool {
        Kernels::for_isa(self).is_ok()
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the ISA-explicit entry points.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimdError {
    /// An ISA this CPU (or this build's architecture) cannot run.
    #[error("the {isa} kernels cannot run on this CPU")]
    Unsupported { isa: Isa },
    /// Bad rows or types, as for the scalar [`vec_dot_row`](super::vec_dot_row).
    #[error(transparent)]
    Quant(#[from] QuantError),
}

/// What detection found: one proof token per runnable ISA.
#[derive(Debug, Clone, Copy)]
struct Detected {
    #[cfg(target_arch = "x86_64")]
    avx2: Option<x86_avx2::Avx2>,
    #[cfg(target_arch = "x86_64")]
    avx512: Option<x86_avx512::Avx512>,
    #[cfg(target_arch = "aarch64")]
    neon: Option<aarch64_neon::Neon>,
    #[cfg(target_arch = "aarch64")]
    neon_dotprod: Option<aarch64_neon::Neon>,
}

fn detected() -> &'static Detected {
    static DETECTED: OnceLock<Detected> = OnceLock::new();
    DETECTED.get_or_init(|| Detected {
        #[cfg(target_arch = "x86_64")]
        avx2: x86_avx2::Avx2::detect(),
        #[cfg(target_arch = "x86_64")]
        avx512: x86_avx512::Avx512::detect(),
        #[cfg(target_arch = "aarch64")]
        neon: aarch64_neon::Neon::detect(false),
        #[cfg(target_arch = "aarch64")]
        neon_dotprod: aarch64_neon::Neon::detect(true),
    })
}

/// Whether environment variable `name` is set to `1`.
fn lever(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// The best ISA of this CPU after the `MINFER_NO_AVX2`, `MINFER_NO_AVX512` and `MINFER_NO_NEON`
/// levers, decided once per process.
pub fn active_isa() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let best = |order: &[Isa]| {
            order
                .iter()
                .copied()
                .find(|i| i.is_supported())
                .unwrap_or(Isa::Scalar)
        };
        if cfg!(target_arch = "x86_64") {
            if lever("MINFER_NO_AVX2") {
                Isa::Scalar
            } else if lever("MINFER_NO_AVX512") {
                best(&[Isa::Avx2])
            } else {
                best(&[Isa::Avx512, Isa::Avx2])
            }
        } else if cfg!(target_arch = "aarch64") && !lever("MINFER_NO_NEON") {
            best(&[Isa::NeonDotprod, Isa::Neon])
        } else {
            Isa::Scalar
        }
    })
}

/// Every ISA this CPU can run, [`Isa::Scalar`] first.
pub fn supported_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// The kernels of one ISA, proven runnable on this CPU (holding one is the proof).
#[derive(Debug, Clone, Copy)]
pub struct Kernels(Backend);

#[derive(Debug, Clone, Copy)]
enum Backend {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(x86_avx2::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(x86_avx512::Avx512),
    #[cfg(target_arch = "aarch64")]
    Neon(Isa, aarch64_neon::Neon),
}

impl Kernels {
    /// The kernels of `isa`. Errors with [`SimdError::Unsupported`] if this CPU lacks it.
    pub fn for_isa(isa: Isa) -> Result<Kernels, SimdError> {
        let d = detected();
        let backend = match isa {
            Isa::Scalar => Some(Backend::Scalar),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => d.avx2.map(Backend::Avx2),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => d.avx512.map(Backend::Avx512),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => d.neon.map(|t| Backend::Neon(isa, t)),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => d.neon_dotprod.map(|t| Backend::Neon(isa, t)),
            #[allow(unreachable_patterns)]
            _ => {
                let _ = d;
                None
            }
        };
        backend.map(Kernels).ok_or(SimdError::Unsupported { isa })
    }

    /// The kernels of [`active_isa`].
    pub fn active() -> Kernels {
        // The active ISA was chosen among the supported ones.
        Kernels::for_isa(active_isa()).unwrap_or(Kernels(Backend::Scalar))
    }

    /// The ISA these kernels belong to.
    pub fn isa(&self) -> Isa {
        match self.0 {
            Backend::Scalar => Isa::Scalar,
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(_) => Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(_) => Isa::Avx512,
            #[cfg(target_arch = "aarch64")]
            Backend::Neon(isa, _) => isa,
        }
    }

    /// Dot product of a weight row with an activation row. Both should hold the same number of
    /// values; if not, the shorter one decides how many blocks are used (checked variant:
    /// [`vec_dot_isa`]). Never reads out of bounds.
    #[inline]
    pub fn dot<W: SimdDot>(&self, w: &[W], a: &[W::Act]) -> f32 {
        match self.0 {
            Backend::Scalar => W::vec_dot(w, a),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => W::avx2(t, w, a),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => W::avx512(t, w, a),
            #[cfg(target_arch = "aarch64")]
            Backend::Neon(_, t) => W::neon(t, w, a),
        }
    }

    /// `x` as the activation row `weight` rows are dotted with, bit-identical to
    /// [`ActRow::for_weight`] (its scalar twin): the x86 ISAs quantize Q8_0, Q8_1 and Q8_K
    /// with SIMD (`x86_q8.rs`), every other ISA and type goes through `for_weight`. Same
    /// errors as `for_weight`.
    pub fn act_row(&self, weight: GgmlType, x: &[f32]) -> Result<ActRow, QuantError> {
        let act = super::vec_dot_type(weight)?;
        let simd = match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => t.act_row(act, x),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.act_row(act, x),
            #[allow(unreachable_patterns)]
            _ => None,
        };
        simd.unwrap_or_else(|| ActRow::quantize(act, x))
    }

    /// Whether [`Kernels::b32_tile`], [`Kernels::k4_tile`] and [`Kernels::k6_tile`] run on this
    /// ISA (AVX2 and AVX-512; scalar and NEON multiply element by element).
    pub fn has_tiles(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Backend::Avx512(_) | Backend::Avx2(_) = self.0 {
            return true;
        }
        false
    }

    /// The many-token product of a tile of 32-value-block weight rows (Q5_0, Q8_0 with Q8_0
    /// activations; Q4_1 with Q8_1 activations as a panel with sums, AVX-512 only; see
    /// [`gemm`](super::gemm)): `out[t][r]`, each element bit-identical to [`Kernels::dot`] of
    /// the x86 ISAs. Returns `false`, writing nothing, where this ISA has no such kernel or the
    /// shapes do not fit (then multiply element by element).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // tiles are x86-only
    pub fn b32_tile(&self, tile: &B32Tile, panel: &B32Panel, out: &mut [&mut [f32]]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.b32_tile(tile, panel, out),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => t.b32_tile(tile, panel, out),
            _ => false,
        }
    }

    /// Whether this ISA has few-token kernels: [`Kernels::b32_pairs`] on AVX2 and AVX-512,
    /// [`Kernels::k4_gemv_pairs`] and [`Kernels::k6_pairs`] on AVX-512 with VNNI only (each
    /// returns `false` where it has none).
    pub fn has_pairs(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Backend::Avx512(_) | Backend::Avx2(_) = self.0 {
            return true;
        }
        false
    }

    /// The few-token product of `n_rows` 32-value-block weight rows (`blocks`,
    /// `[n_rows][per_row]`, Q5_0 or Q8_0) with up to 8 tokens laid out as [`B32Pairs`]:
    /// `out[t][r]`, each element bit-identical to [`Kernels::dot`]. Returns `false`, writing
    /// nothing, where this ISA has no pair kernel ([`Kernels::has_pairs`]), `W` has none, or
    /// the shapes do not fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // x86 only
    pub fn b32_pairs<W: Block32Gemm + WeightBlock>(
        &self,
        blocks: &[W],
        n_rows: usize,
        pairs: &B32Pairs,
        out: &mut [&mut [f32]],
    ) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.b32_pairs(blocks, n_rows, pairs, out),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => t.b32_pairs(blocks, n_rows, pairs, out),
            _ => false,
        }
    }

    /// [`Kernels::b32_pairs`] for Q4_K rows in ggml's repacked gemv order (each element
    /// bit-identical to [`Kernels::gemv`]), the tokens laid out as [`K8Pairs`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn k4_gemv_pairs(&self, blocks: &[BlockQ4K], n_rows: usize, pairs: &K8Pairs, out: &mut [&mut [f32]]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k4_gemv_pairs(blocks, n_rows, pairs, out),
            _ => false,
        }
    }

    /// Whether these kernels multiply repacked matrices ([`K4Packed`], [`K6Packed`],
    /// [`B32Packed`]) by one token ([`Kernels::k4_packed_gemv`], [`Kernels::k6_packed_gemv`],
    /// [`Kernels::b32_packed_gemv`]); where not, no matrix is repacked at all.
    pub fn has_packed(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Backend::Avx512(_) = self.0 {
            return true;
        }
        false
    }

    /// One token's product with the rows of groups `first..` of a repacked Q4_K matrix:
    /// `out[i]` for row `16·first + i`, each bit-identical to [`Kernels::gemv`] of that row.
    /// Returns `false`, writing nothing, where this ISA has no such kernel or the shapes do not
    /// fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn k4_packed_gemv(&self, w: &K4Packed, first: usize, a: &K8Row, out: &mut [f32]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k4_packed_gemv(w, first, a, out),
            _ => false,
        }
    }

    /// One token's product with the rows of groups `first..` of a repacked Q6_K matrix:
    /// `out[i]` for row `16·first + i`, each bit-identical to [`Kernels::dot`] of that row.
    /// Returns `false`, writing nothing, where this ISA has no such kernel or the shapes do not
    /// fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn k6_packed_gemv(&self, w: &K6Packed, first: usize, a: &[BlockQ8K], out: &mut [f32]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k6_packed_gemv(w, first, a, out),
            _ => false,
        }
    }

    /// A [`K6Tile`] of row groups `first..first + groups` of a repacked Q6_K matrix, equal to
    /// [`Kernels::k6_fill`] of the same rows' blocks. `false`, leaving `tile` as it was, where
    /// this ISA has no such fill or the groups are not all in `w`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn k6_fill_packed(&self, tile: &mut K6Tile, w: &K6Packed, first: usize, groups: usize) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k6_fill_packed(tile, w, first, groups),
            _ => false,
        }
    }

    /// One token's product with the rows of groups `first..` of a repacked Q5_0, Q8_0 or Q4_1
    /// matrix, the token as a one-token [`B32Panel`] for the matrix's offset (with the Q8_1
    /// sums for Q4_1): `out[i]` for row
    /// `16·first + i`, each bit-identical to [`Kernels::dot`] of that row. Returns `false`,
    /// writing nothing, where this ISA has no such kernel or the shapes do not fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn b32_packed_gemv(&self, w: &B32Packed, first: usize, panel: &B32Panel, out: &mut [f32]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.b32_packed_gemv(w, first, panel, out),
            _ => false,
        }
    }

    /// [`Kernels::b32_pairs`] for Q6_K rows (each element bit-identical to [`Kernels::dot`]),
    /// the tokens laid out as [`K8Pairs`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn k6_pairs(&self, blocks: &[BlockQ6K], n_rows: usize, pairs: &K8Pairs, out: &mut [&mut [f32]]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k6_pairs(blocks, n_rows, pairs, out),
            _ => false,
        }
    }

    /// The many-token product of a tile of Q4_K rows (a multiple of 16) that llama.cpp repacks
    /// (see [`gemm_k`](super::gemm_k)): `out[t][r]`, each element bit-identical to
    /// [`Kernels::gemv`]. Returns `false`, writing nothing, where this ISA has no such kernel
    /// or the shapes do not fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // tiles are x86-only
    pub fn k4_tile(&self, tile: &K4Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k4_tile(tile, panel, out),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => t.k4_tile(tile, panel, out),
            _ => false,
        }
    }

    /// The many-token product of a tile of Q6_K rows (a multiple of 16; see
    /// [`gemm_k`](super::gemm_k)): `out[t][r]`, each element bit-identical to [`Kernels::dot`]
    /// of the x86 ISAs. Returns `false`, writing nothing, where this ISA has no such kernel
    /// or the shapes do not fit.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // tiles are x86-only
    pub fn k6_tile(&self, tile: &K6Tile, panel: &K8Panel, out: &mut [&mut [f32]]) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k6_tile(tile, panel, out),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2(t) => t.k6_tile(tile, panel, out),
            _ => false,
        }
    }

    /// `tile` filled with `blocks` (`[rows][per_row]` Q4_K) for [`Kernels::k4_tile`]: the
    /// ISA's fill where it has one, else the scalar [`RowLaneTile::fill`] (the same tile).
    pub fn k4_fill(&self, tile: &mut K4Tile, blocks: &[BlockQ4K], per_row: usize) {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k4_fill(tile, blocks, per_row),
            _ => tile.fill(blocks, per_row),
        }
    }

    /// `tile` holding row groups `first..first + groups` (16 rows each) of the repacked Q5_0,
    /// Q8_0 or Q4_1 matrix `w`, for [`Kernels::b32_tile`]: the tile [`RowLaneTile::fill`] makes
    /// from the matrix's blocks, read from the packed lines. `false`, leaving `tile` as it was,
    /// where the ISA has no packed kernels ([`Kernels::has_packed`]) or where the groups do not
    /// fit `w`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // AVX-512 only
    pub fn b32_fill_packed(&self, tile: &mut B32Tile, w: &B32Packed, first: usize, groups: usize) -> bool {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.b32_fill_packed(tile, w, first, groups),
            _ => false,
        }
    }

    /// [`Kernels::k4_fill`] for Q6_K ([`Kernels::k6_tile`]).
    pub fn k6_fill(&self, tile: &mut K6Tile, blocks: &[BlockQ6K], per_row: usize) {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512(t) => t.k6_fill(tile, blocks, per_row),
            _ => tile.fill(blocks, per_row),
        }
    }

    /// One row of the matrix product of a matrix llama.cpp repacks ([`SimdDot::REPACK_ROWS`]):
    /// the per-row arithmetic of ggml's x86 repacked gemv (see [`gemv`](super::gemv)), the
    /// same bits in every x86 ISA and in scalar. For other types (and on NEON), [`Kernels::dot`].
    #[inline]
    pub fn gemv<W: SimdDot>(&self, w: &[W], a: &[W::Act]) -> f32 {
        W::gemv(*self, w, a)
    }

    /// `out[i] = self.dot(w, a[i])` for each activation row, bit for bit; where the type has a
    /// several-row kernel each weight block is unpacked once for up to four rows.
    pub fn dot_rows<W: SimdDot>(&self, w: &[W], a: &[&[W::Act]], out: &mut [f32]) {
        W::dot_rows(*self, w, a, out)
    }

    /// [`Kernels::gemv`] for each activation row, as [`Kernels::dot_rows`] does for the dot.
    pub fn gemv_rows<W: SimdDot>(&self, w: &[W], a: &[&[W::Act]], out: &mut [f32]) {
        W::gemv_rows(*self, w, a, out)
    }
}

/// A weight block type with a kernel in every ISA (for its `vec_dot_type` activations).
///
/// The per-ISA methods take the ISA's proof token, so they cannot be reached on a CPU that lacks
/// the ISA; call them through [`Kernels::dot`] and [`Kernels::gemv`].
pub trait SimdDot: VecDot {
    /// `Some(n)` for the types llama.cpp's x86 CPU backend repacks (Q4_0, Q4_K; Q2_K in its
    /// AVX-512 build only, whose AVX2 kernels keep the dot's order): a matrix whose
    /// row count is a multiple of `n` is multiplied by ggml's repacked gemv, whose per-row float
    /// order differs from `vec_dot`'s (see [`gemv`](super::gemv)); [`Kernels::gemv`] computes
    /// that order. `None`: the type is always multiplied by `vec_dot`.
    const REPACK_ROWS: Option<usize> = None;

    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    fn avx2(t: x86_avx2::Avx2, w: &[Self], a: &[Self::Act]) -> f32;
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    fn avx512(t: x86_avx512::Avx512, w: &[Self], a: &[Self::Act]) -> f32;
    #[cfg(target_arch = "aarch64")]
    #[doc(hidden)]
    fn neon(t: aarch64_neon::Neon, w: &[Self], a: &[Self::Act]) -> f32;

    /// One row of the repacked gemv with kernels `k`; types without one use the dot.
    #[doc(hidden)]
    #[inline]
    fn gemv(k: Kernels, w: &[Self], a: &[Self::Act]) -> f32 {
        k.dot(w, a)
    }

    /// `out[i] = k.dot(w, a[i])` for every row of `a`, bit for bit. Types with a `rows` kernel
    /// (`rows NAME` in `simd_dot!`) unpack each weight block once for several rows on x86.
    #[doc(hidden)]
    #[inline]
    fn dot_rows(k: Kernels, w: &[Self], a: &[&[Self::Act]], out: &mut [f32]) {
        for (o, a) in out.iter_mut().zip(a) {
            *o = k.dot(w, a);
        }
    }

    /// `out[i] = k.gemv(w, a[i])` for every row of `a`, bit for bit (`gemv_rows NAME` in
    /// `simd_dot!`: several rows per unpacked block on x86).
    #[doc(hidden)]
    #[inline]
    fn gemv_rows(k: Kernels, w: &[Self], a: &[&[Self::Act]], out: &mut [f32]) {
        for (o, a) in out.iter_mut().zip(a) {
            *o = k.gemv(w, a);
        }
    }
}

/// `impl SimdDot` for each weight block type, naming the kernel of each ISA file, and for the
/// types llama.cpp repacks, the gemv kernel (`repack NAME`: `gemv::NAME` in scalar, the
/// kernel of the same name in the x86 files; NEON keeps its dot, which follows no ggml order).
macro_rules! simd_dot {
    ($($w:ty => $k:ident $(repack $g:ident)? $(repack_avx512 $g5:ident)? $(rows $m:ident)? $(gemv_rows $gm:ident)?),* $(,)?) => {$(
        impl SimdDot for $w {
            $(#[inline]
            fn gemv_rows(k: Kernels, w: &[Self], a: &[&[Self::Act]], out: &mut [f32]) {
                match k.0 {
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2(t) => t.$gm(w, a, out),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx512(t) => t.$gm(w, a, out),
                    #[allow(unreachable_patterns)]
                    _ => out.iter_mut().zip(a).for_each(|(o, a)| *o = k.gemv(w, a)),
                }
            })?
            $(#[inline]
            fn dot_rows(k: Kernels, w: &[Self], a: &[&[Self::Act]], out: &mut [f32]) {
                match k.0 {
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2(t) => t.$m(w, a, out),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx512(t) => t.$m(w, a, out),
                    #[allow(unreachable_patterns)]
                    _ => out.iter_mut().zip(a).for_each(|(o, a)| *o = k.dot(w, a)),
                }
            })?
            // `repack_avx512`: llama.cpp repacks the type only in a build with AVX-512, so
            // the AVX2 kernels keep vec_dot's order (an AVX2 build's answer on an AVX2 CPU).
            $(const REPACK_ROWS: Option<usize> = Some(super::gemv::REPACK_ROWS);

            #[inline]
            fn gemv(k: Kernels, w: &[Self], a: &[Self::Act]) -> f32 {
                match k.0 {
                    Backend::Scalar => super::gemv::$g5(w, a),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2(t) => t.$k(w, a),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx512(t) => t.$g5(w, a),
                    #[cfg(target_arch = "aarch64")]
                    Backend::Neon(_, t) => t.$k(w, a),
                }
            })?
            $(const REPACK_ROWS: Option<usize> = Some(super::gemv::REPACK_ROWS);

            #[inline]
            fn gemv(k: Kernels, w: &[Self], a: &[Self::Act]) -> f32 {
                match k.0 {
                    Backend::Scalar => super::gemv::$g(w, a),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2(t) => t.$g(w, a),
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx512(t) => t.$g(w, a),
                    #[cfg(target_arch = "aarch64")]
                    Backend::Neon(_, t) => t.$k(w, a),
                }
            })?
            #[cfg(target_arch = "x86_64")]
            #[inline]
            fn avx2(t: x86_avx2::Avx2, w: &[Self], a: &[Self::Act]) -> f32 {
                t.$k(w, a)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline]
            fn avx512(t: x86_avx512::Avx512, w: &[Self], a: &[Self::Act]) -> f32 {
                t.$k(w, a)
            }
            #[cfg(target_arch = "aarch64")]
            #[inline]
            fn neon(t: aarch64_neon::Neon, w: &[Self], a: &[Self::Act]) -> f32 {
                t.$k(w, a)
            }
        }
    )*};
}

simd_dot! {
    F32Le => f32, F16Le => f16, Bf16Le => bf16,
    BlockQ4_0 => q4_0 repack gemv_q4_0, BlockQ4_1 => q4_1, BlockQ5_0 => q5_0 rows q5_0_rows, BlockQ5_1 => q5_1,
    BlockQ8_0 => q8_0 rows q8_0_rows,
    BlockQ2K => q2_k repack_avx512 gemv_q2_k, BlockQ3K => q3_k, BlockQ4K => q4_k repack gemv_q4_k gemv_rows gemv_q4_k_rows,
    BlockQ5K => q5_k, BlockQ6K => q6_k rows q6_k_rows,
}

/// Checked dot with an explicit ISA: errors with [`QuantError::DotLength`] unless both rows hold
/// the same number of values, [`SimdError::Unsupported`] if the CPU lacks `isa`.
pub fn vec_dot_isa<W: SimdDot>(isa: Isa, w: &[W], a: &[W::Act]) -> Result<f32, SimdError> {
    let k = Kernels::for_isa(isa)?;
    let (weights, acts) = (w.len() * W::N, a.len() * W::Act::N);
    if weights != acts {
        return Err(QuantError::DotLength {
            ty: W::TYPE,
            weights,
            acts,
        }
        .into());
    }
    Ok(k.dot(w, a))
}

/// [`vec_dot_row`](super::vec_dot_row) with an explicit ISA: one weight row of type `ty` as raw
/// bytes (any alignment) with an activation row of `ty`'s activation type. Same errors as
/// `vec_dot_row`, plus [`SimdError::Unsupported`].
pub fn vec_dot_row_isa(isa: Isa, ty: GgmlType, w: &[u8], act: &ActRow) -> Result<f32, SimdError> {
    let k = Kernels::for_isa(isa)?;
    let dot: Result<f32, QuantError> = crate::with_weight_block!(ty, B => {
        let a = <B as VecDot>::Act::blocks_in(act).ok_or_else(|| QuantError::ActMismatch {
            weight: ty,
            expected: <<B as VecDot>::Act as ActBlock>::TYPE,
            got: act.act_type(),
        })?;
        let blocks = blocks_of::<B>(w, act.len())?;
        Ok(k.dot(blocks, a))
    });
    Ok(dot?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_always_runs_and_active_is_supported() {
        assert!(Isa::Scalar.is_supported());
        assert!(active_isa().is_supported());
        assert_eq!(supported_isas()[0], Isa::Scalar);
        assert_eq!(Kernels::active().isa(), active_isa());
    }

    #[test]
    fn isas_of_another_architecture_are_unsupported() {
        #[cfg(target_arch = "x86_64")]
        let foreign = [Isa::Neon, Isa::NeonDotprod];
        #[cfg(target_arch = "aarch64")]
        let foreign = [Isa::Avx2, Isa::Avx512];
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let foreign = [Isa::Avx2, Isa::Neon];
        for isa in foreign {
            assert_eq!(
                Kernels::for_isa(isa).unwrap_err(),
                SimdError::Unsupported { isa }
            );
        }
    }

    #[test]
    fn dot_length_mismatch_is_an_error() {
        let w = [BlockQ8_0::default(); 2];
        let a = [BlockQ8_0::default(); 1];
        let err = vec_dot_isa(Isa::Scalar, &w, &a).unwrap_err();
        assert_eq!(
            err,
            SimdError::Quant(QuantError::DotLength {
                ty: GgmlType::Q8_0,
                weights: 64,
                acts: 32
            })
        );
    }
}
