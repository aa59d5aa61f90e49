//! Model architectures. Each architecture reads its hyper-parameters from GGUF metadata under
//! its own key prefix (`qwen2.block_count`).

mod hparams;

pub use hparams::{HParams, ModelError, SUPPORTED_ARCHITECTURES};
