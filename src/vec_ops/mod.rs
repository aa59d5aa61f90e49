//! CPU kernels.

pub mod matmul;
pub mod pool;

pub use pool::{Pool, PoolError};
