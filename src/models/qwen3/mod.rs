//! Qwen3: bias-free Q/K/V, per-head RMSNorm on Q and K, head dim decoupled from n_embd/n_head.

mod graph;

pub use graph::Qwen3;
