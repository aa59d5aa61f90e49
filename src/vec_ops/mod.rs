//! CPU kernels.

pub mod pool;

pub use pool::{Pool, PoolError};
