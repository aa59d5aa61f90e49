//! The repacked copies of weight matrices that a backend makes at load for one-token products
//! (decode), one kind per weight layout: Q4_K as [`K4Packed`] (ggml's repacked gemv order), Q6_K
//! as [`K6Packed`], Q5_0, Q8_0 and Q4_1 as [`B32Packed`] (`vec_dot`'s order). Which matrices get one is decided here, once,
//! by the order llama.cpp multiplies them in, so a packed product keeps the bits of the path it
//! replaces.

use super::blocks::{BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0};
use super::gemv::REPACK_ROWS;
use super::packed_b32::{B32Packed, Block32Pack};
use super::packed_k4::K4Packed;
use super::packed_k6::K6Packed;
use super::{GgmlType, QuantError, WeightBlock, blocks_of};

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
        Ok(match ty {
            GgmlType::Q4K if rows.is_multiple_of(REPACK_ROWS) && cols.is_multiple_of(BlockQ4K::N) => {
                let blocks = blocks_of::<BlockQ4K>(data, rows * cols)?;
                K4Packed::new(blocks, rows, cols / BlockQ4K::N).map(PackedMatrix::K4)
            }
            GgmlType::Q6K if cols.is_multiple_of(BlockQ6K::N) => {
                let blocks = blocks_of::<BlockQ6K>(data, rows * cols)?;
                K6Packed::new(blocks, rows, cols / BlockQ6K::N).map(PackedMatrix::K6)
            }
            GgmlType::Q5_0 => b32::<BlockQ5_0>(data, rows, cols)?,
            GgmlType::Q8_0 => b32::<BlockQ8_0>(data, rows, cols)?,
            GgmlType::Q4_1 => b32::<BlockQ4_1>(data, rows, cols)?,
            _ => None,
        })
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

fn b32<W: Block32Pack>(data: &[u8], rows: usize, cols: usize) -> Result<Option<PackedMatrix>, QuantError> {
    if !cols.is_multiple_of(W::N) {
        return Ok(None);
    }
    let blocks = blocks_of::<W>(data, rows * cols)?;
    Ok(B32Packed::new(blocks, rows, cols / W::N).map(PackedMatrix::B32))
}
