//! Gemma 3: scaled embeddings, RMSNorm before and after attention and FFN, per-head q/k
//! RMSNorm, GELU-gated FFN, sliding-window attention on five layers of every six.

mod graph;

pub use graph::Gemma3;
