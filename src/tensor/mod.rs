//! The types every layer shares: element types of tensors and the KV cell formats. Nothing
//! here depends on the graph or on any backend, so both can name them.

pub mod dtype;
pub mod kv_type;

pub use dtype::DType;
pub use kv_type::{KvType, KvTypeError};
