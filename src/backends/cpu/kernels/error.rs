//! The error type of the CPU kernels.
//!
//! Shapes come from model files (head counts, dimensions) and token ids from users, so every
//! kernel checks its geometry and returns an [`OpsError`] instead of panicking.

use crate::quants::QuantError;

/// A kernel was called with inconsistent shapes, an out-of-range index, or unsupported data.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum OpsError {
    /// A buffer does not have the length the other arguments imply.
    #[error("{what}: expected {expected} values, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A buffer that must hold whole rows (or heads) of `of` values holds `len`.
    #[error("{what}: {len} values is not a whole number of rows of {of}")]
    Ragged {
        what: &'static str,
        len: usize,
        of: usize,
    },
    /// A dimension that must be non-zero (or even) is not.
    #[error("{what} = {value} is not allowed: {why}")]
    BadDim {
        what: &'static str,
        value: usize,
        why: &'static str,
    },
    /// `n_head` is not a positive multiple of `n_head_kv` (grouped-query attention needs it).
    #[error("{n_head} query heads cannot share {n_head_kv} KV heads evenly")]
    HeadGroups { n_head: usize, n_head_kv: usize },
    /// A token's position is negative or outside the KV region.
    #[error("token {token} has position {pos}, outside the KV region of {n_ctx} cells")]
    Position {
        token: usize,
        pos: i32,
        n_ctx: usize,
    },
    /// A KV cell index is negative or outside the cache.
    #[error("token {token} is stored in cell {cell}, outside the cache of {n_ctx} cells")]
    Cell {
        token: usize,
        cell: i32,
        n_ctx: usize,
    },
    /// A row id (token id for an embedding lookup) is negative or past the last row.
    #[error("row id {id} (entry {index}) is outside the {n_rows} rows")]
    RowId {
        index: usize,
        id: i32,
        n_rows: usize,
    },
    /// A quantized row could not be dequantized.
    #[error(transparent)]
    Quant(#[from] QuantError),
}

/// `Ok(())` when `got == expected`, else [`OpsError::Length`].
pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), OpsError> {
    if expected == got {
        Ok(())
    } else {
        Err(OpsError::Length {
            what,
            expected,
            got,
        })
    }
}

/// The number of rows of `of` values in `len` values, or [`OpsError::Ragged`] /
/// [`OpsError::BadDim`] when `len` is not a whole number of rows or `of` is zero.
pub(crate) fn rows_of(what: &'static str, len: usize, of: usize) -> Result<usize, OpsError> {
    if of == 0 {
        return Err(OpsError::BadDim {
            what,
            value: 0,
            why: "a row length must be positive",
        });
    }
    if !len.is_multiple_of(of) {
        return Err(OpsError::Ragged { what, len, of });
    }
    Ok(len / of)
}
