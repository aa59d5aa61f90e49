//! The repacked copies of weight matrices that a backend makes at load for one-token products
//! (decode), one kind per weight layout: Q4_K as [`K4Packed`] (ggml's repacked gemv order), Q6_K
//! as [`K6Packed`], Q5_0, Q8_0 and Q4_1 as [`B32Packed`] (`vec_dot`'s order). Which matrices
//! get one is decided here, once, by the order llama.cpp multiplies them in, so a packed product
//! keeps the bits of the path it replaces.
//!
//! A copy made while the file's pages of its matrix stay resident would hold the matrix twice
//! at the moment it is finished (the peak of a load: a 170 MiB embedding read and copied made
//! Gemma-3-270M's peak RSS 75 MiB above the run's steady state).
//! [`PackedMatrix::for_decode_releasing`] hands the bytes it has copied back as it goes, in runs
//! of [`RELEASE_RUN`] bytes, for the backend to release where the copy replaces them
//! ([`PackedMatrix::replaces_source`]).

use super::blocks::{BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0};
use super::gemv::REPACK_ROWS;
use super::packed_b32::{B32Packed, Block32Pack};
use super::packed_k4::K4Packed;
use super::packed_k6::K6Packed;
use std::ops::Range;

use super::{GgmlType, QuantError, WeightBlock, blocks_of};

/// Bytes of a matrix's source handed back at a time while its copy is made (one `madvise` per
/// run; small against the matrices that matter, tens to hundreds of MiB).
pub const RELEASE_RUN: usize = 1 << 20;

/// A repacked weight matrix.
#[derive(Debug, Clone)]
pub enum PackedMatrix {
    K4(K4Packed),
    K6(K6Packed),
    B32(B32Packed),
}

impl PackedMatrix {
    /// The copy of a `[rows][cols]` matrix of type `ty` (`data`, the file's blocks) that decode
    /// multiplies, where its type packs: Q4_K matrices of a multiple of 8 rows (those llama.cpp
    /// repacks and multiplies in its gemv order; others keep `vec_dot`'s order and are not
    /// copied), every Q6_K, Q5_0, Q8_0 and Q4_1 matrix. `Ok(None)` for other types and shapes; an error
    /// where `data` is not the matrix's blocks.
    pub fn for_decode(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Option<PackedMatrix>, QuantError> {
        PackedMatrix::for_decode_releasing(ty, data, rows, cols, &mut |_| {})
    }

    /// [`PackedMatrix::for_decode`], calling `release(range)` with the ranges of `data` the
    /// copy has been made from, in order, in runs of at least [`RELEASE_RUN`] bytes and the
    /// rest at the end (nothing where no copy is made).
    pub fn for_decode_releasing(
        ty: GgmlType,
        data: &[u8],
        rows: usize,
        cols: usize,
        release: &mut dyn FnMut(Range<usize>),
    ) -> Result<Option<PackedMatrix>, QuantError> {
        let row_bytes = data.len().checked_div(rows).unwrap_or(0);
        let mut from = 0;
        let mut rows_done = |n: usize| {
            let end = n * row_bytes;
            if end - from >= RELEASE_RUN || (n == rows && end > from) {
                release(from..end);
                from = end;
            }
        };
        Ok(match ty {
            GgmlType::Q4K if rows.is_multiple_of(REPACK_ROWS) && cols.is_multiple_of(BlockQ4K::N) => {
                let blocks = blocks_of::<BlockQ4K>(data, rows * cols)?;
                K4Packed::new_with(blocks, rows, cols / BlockQ4K::N, &mut rows_done).map(PackedMatrix::K4)
            }
            GgmlType::Q6K if cols.is_multiple_of(BlockQ6K::N) => {
                let blocks = blocks_of::<BlockQ6K>(data, rows * cols)?;
                K6Packed::new_with(blocks, rows, cols / BlockQ6K::N, &mut rows_done).map(PackedMatrix::K6)
            }
            GgmlType::Q5_0 => b32::<BlockQ5_0>(data, rows, cols, &mut rows_done)?,
            GgmlType::Q8_0 => b32::<BlockQ8_0>(data, rows, cols, &mut rows_done)?,
            GgmlType::Q4_1 => b32::<BlockQ4_1>(data, rows, cols, &mut rows_done)?,
            _ => None,
        })
    }

    /// Whether the copy of a `ty` matrix replaces the file's bytes on one-token products and
    /// the prefill tiles (which fill from the copy): Q6_K, Q5_0, Q8_0 and Q4_1, so a backend may
    /// release the file's pages. They are still read, and fault back in, for passes of 2 to 32
    /// tokens (the pair kernels read the file's blocks: a batched or speculative step, a short
    /// prompt tail), matrices whose rows are not a multiple of 16, and row lookups of a tied
    /// embedding; the saving holds for plain prompt-and-generate runs. Q4_K's tiles read the
    /// file.
    pub fn replaces_source(ty: GgmlType) -> bool {
        matches!(ty, GgmlType::Q6K | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_1)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            PackedMatrix::K4(p) => p.bytes(),
            PackedMatrix::K6(p) => p.bytes(),
            PackedMatrix::B32(p) => p.bytes(),
        }
    }
}

fn b32<W: Block32Pack>(data: &[u8], rows: usize, cols: usize, rows_done: &mut dyn FnMut(usize)) -> Result<Option<PackedMatrix>, QuantError> {
    if !cols.is_multiple_of(W::N) {
        return Ok(None);
    }
    let blocks = blocks_of::<W>(data, rows * cols)?;
    Ok(B32Packed::new_with(blocks, rows, cols / W::N, rows_done).map(PackedMatrix::B32))
}
