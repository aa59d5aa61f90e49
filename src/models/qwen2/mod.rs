//! Qwen2 (Qwen2.5): biased Q/K/V projections, NeoX RoPE, GQA.

mod graph;

pub use graph::Qwen2;
