//! The storage format of the KV cache cells (`MINFER_CACHE_TYPE` / `--cache-type`).
//!
//! A region is a run of `n_ctx` rows, one per cell, each `n_embd_kv` values stored as:
//! - `f32`: 4 bytes a value (the default, and what llama.cpp's reference data uses);
//! - `f16`: 2 bytes a value (IEEE half);
//! - `q8_0`: packed Q8_0 blocks, `ceil(n_embd_kv / 32) * 34` bytes a row (3.76x smaller than
//!   f32 for a 128-wide row).
//!
//! The type is part of [`CParams`](crate::graph::CParams) and of every KV node's metadata, so it is
//! part of the graph's identity: an engine never reuses a region of another type (the
//! allocator refuses a region of another size).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
    Q8_0,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache type '{given}' (expected f32, f16 or q8_0)")]
pub struct KvTypeError {
    pub given: String,
}

/// Values per Q8_0 block and bytes per block.
const QK: usize = 32;
const Q8_0_BYTES: usize = 34;

impl KvType {
    pub fn parse(s: &str) -> Result<KvType, KvTypeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            // Bounded: the value may come from a request or a long environment variable.
            _ => Err(KvTypeError { given: s.chars().take(32).collect() }),
        }
    }

    /// `MINFER_CACHE_TYPE`, when set; an unknown value is an error, never ignored.
    pub fn from_env() -> Result<Option<KvType>, KvTypeError> {
        match std::env::var("MINFER_CACHE_TYPE") {
            Ok(v) if !v.is_empty() => KvType::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The format tag of session files (f32 0, f16 1, q8_0 2).
    pub const fn tag(self) -> u32 {
        match self {
            KvType::F32 => 0,
            KvType::F16 => 1,
            KvType::Q8_0 => 2,
        }
    }

    /// Bytes of one row of `width` values.
    pub const fn row_bytes(self, width: usize) -> usize {
        match self {
            KvType::F32 => 4 * width,
            KvType::F16 => 2 * width,
            KvType::Q8_0 => width.div_ceil(QK) * Q8_0_BYTES,
        }
    }

    /// Bytes of a region of `n_ctx` rows of `width` values, rounded up to whole 4-byte words
    /// (so a region always has an f32 view).
    pub const fn region_bytes(self, width: usize, n_ctx: usize) -> usize {
        (self.row_bytes(width) * n_ctx).div_ceil(4) * 4
    }

    /// 4-byte words holding a region (packed rows rounded up): the length of its f32 view.
    pub const fn region_len(self, width: usize, n_ctx: usize) -> usize {
        self.region_bytes(width, n_ctx) / 4
    }

    /// The element type of the cells.
    pub const fn dtype(self) -> super::DType {
        match self {
            KvType::F32 => super::DType::F32,
            KvType::F16 => super::DType::F16,
            KvType::Q8_0 => super::DType::Q8_0,
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(KvType::Q8_0.row_bytes(128), 136);
        assert_eq!(KvType::Q8_0.region_bytes(128, 10), 1360);
        // q8_0 regions are 136/512 = 0.266 of f32's
        assert!((KvType::Q8_0.region_bytes(128, 4096) as f64) / (KvType::F32.region_bytes(128, 4096) as f64) <= 0.27);
        assert_eq!(KvType::parse("Q8_0"), Ok(KvType::Q8_0));
        assert!(KvType::parse("q4_0").is_err());
    }
}
