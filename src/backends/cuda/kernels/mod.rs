//! The CUDA kernel sources, compiled by NVRTC at first use for the device's architecture.
//!
//! Every `.cu` file in this folder is one entry of [`SOURCES`] and every `.cuh` one of
//! [`HEADERS`]; `tests/cuda_kernels.rs` compiles each source for the oldest and the newest
//! architecture the backend supports and fails on any error or warning, and on a file of this
//! folder that is missing from the lists.

use super::nvrtc::Source;

/// The oldest compute capability the kernels are written for: Turing (NVRTC 12.9 deprecates
/// everything older, with a warning the compile test would count).
pub const MIN_CC: (i32, i32) = (7, 5);

/// The architectures the compile test covers: the oldest supported and the H100/H200's.
pub const TEST_ARCHES: [&str; 2] = ["compute_75", "compute_90"];

/// Headers, by the name the sources `#include`.
pub const HEADERS: &[(&str, &str)] = &[
    ("prelude.cuh", include_str!("prelude.cuh")),
    ("quants.cuh", include_str!("quants.cuh")),
    ("hadamard.cuh", include_str!("hadamard.cuh")),
];

/// Every kernel source file, by file name.
pub const SOURCES: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("elementwise.cu")),
    ("norm.cu", include_str!("norm.cu")),
    ("rope.cu", include_str!("rope.cu")),
    ("get_rows.cu", include_str!("get_rows.cu")),
    ("matmul.cu", include_str!("matmul.cu")),
    ("matmul_q8.cu", include_str!("matmul_q8.cu")),
    ("kv.cu", include_str!("kv.cu")),
    ("attention.cu", include_str!("attention.cu")),
];

/// The compile unit of source `name` with every header available to it.
pub fn source(name: &str) -> Option<Source<'static>> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(name, text)| Source { name, text, headers: HEADERS })
}

/// All compile units.
pub fn all() -> impl Iterator<Item = Source<'static>> {
    SOURCES.iter().map(|(name, text)| Source { name, text, headers: HEADERS })
}
