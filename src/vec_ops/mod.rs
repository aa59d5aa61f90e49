//! CPU kernels.
//!
//! * [`pool`]: the ownership-split worker pool.
//! * [`isa`](Isa): the instruction set the kernels run with (results do not depend on it).
//! * [`act`]: `add`, `mul`, `silu`, the fused `swiglu`.
//! * [`softmax`]: ggml's `soft_max_ext`.
//! * [`dot`]: ggml's f32 dot product.
//!
//! Buffers are f32 and token-major: an activation of `nt` tokens and `d` features is `nt` rows
//! of `d` values. Each kernel's docs say what it mirrors of llama.cpp's CPU backend and what
//! matches it bit for bit.

pub mod act;
pub mod dot;
mod error;
pub mod expf;
pub mod isa;
pub mod pool;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
pub mod softmax;

pub use act::{add, add_inplace, mul, mul_inplace, silu, silu_with, swiglu, swiglu_with};
pub use dot::{dot_f32, dot_f32_with};
pub use error::OpsError;
pub use isa::Isa;
pub use pool::{Pool, PoolError};
pub use softmax::{soft_max, soft_max_row, soft_max_row_with, soft_max_with};
