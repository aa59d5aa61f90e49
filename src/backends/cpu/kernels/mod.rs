//! CPU kernels.
//!
//! * [`pool`]: the ownership-split worker pool.
//! * [`isa`](Isa): the instruction set the kernels run with (results do not depend on it).
//! * [`norm`]: `rms_norm` (+ weight), Qwen3's per-head `qk_norm`.
//! * [`rope`]: NeoX rotary embedding with ggml's iterative cos/sin tables.
//! * [`act`]: `add`, `mul`, `silu`, the fused `swiglu`.
//! * [`softmax`]: ggml's `soft_max_ext`.
//! * [`dot`]: ggml's f32 dot product.
//! * [`attention`](mod@attention): grouped-query attention over an f32 KV region, `kv_store`;
//!   [`attention_q8`] reads packed Q8_0 cells directly; [`kv_cache`] stores and reads f16/Q8_0 cells.
//! * [`get_rows`](mod@get_rows): embedding lookup and row selection.
//! * [`matmul`]: quantized matrix products (activations quantized as ggml does, int8 dots).
//!
//! Buffers are f32 and token-major: an activation of `nt` tokens and `d` features is `nt` rows
//! of `d` values. Each kernel's docs say what it mirrors of llama.cpp's CPU backend and what
//! matches it bit for bit.

pub mod act;
pub mod attention;
pub mod attention_q8;
pub mod dot;
mod error;
pub mod expf;
pub mod gelu;
pub mod get_rows;
pub mod isa;
pub mod matmul;
pub mod norm;

pub mod hadamard;
pub mod kv_cache;
pub mod rope;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
#[cfg(target_arch = "x86_64")]
mod simd_x86_attn;
pub mod softmax;

pub use act::{add, add_inplace, mul, mul_inplace, silu, silu_with, swiglu, swiglu_inplace_with, swiglu_with};
pub use attention::{AttnArgs, AttnRun, attention, attention_runs, attention_runs_with, attention_with, kv_store};
pub use dot::{dot_f32, dot_f32_with};
pub use error::OpsError;
pub use gelu::{geglu, geglu_inplace, gelu, gelu_inplace, scale, scale_inplace};
pub use get_rows::{get_rows, select_rows};
pub use isa::Isa;
pub use norm::{qk_norm, qk_norm_inplace, rms_norm, rms_norm_inplace};
pub use crate::workers::{Pool, PoolError};
pub use rope::{RopeCache, RopeMode, RopeSpec, RopeTables, rope_ext, rope_ext_cached, rope_ext_with, rope_neox};
pub use softmax::{soft_max, soft_max_row, soft_max_row_with, soft_max_with};

/// Test data for the kernels' unit tests: `n` values uniform in [-scale, scale) from a
/// xorshift32 stream seeded with `seed * 2654435761 + salt`.
#[cfg(test)]
pub(crate) fn test_data(n: usize, seed: u32, salt: u32, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(salt);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s >> 8) as f32 / (1u32 << 23) as f32 - 1.0) * scale
        })
        .collect()
}
