//! Llama (Llama 2/3, Mistral, SmolLM, TinyLlama and their derivatives): bias-free Q/K/V (biases
//! honoured where a file has them), normal (adjacent-pair) RoPE over whole heads, SwiGLU FFN,
//! tied or separate output.

mod graph;

pub use graph::Llama;
