//! Row gathers: the embedding lookup (`get_rows` on a quantized or float matrix) and the
//! selection of f32 rows (the last layer keeps only the rows whose logits are wanted).
//!
//! Dequantization is [`dequantize_row`], bit-exact with ggml's `to_float`.

use super::error::{OpsError, check_len, rows_of};
use crate::quants::{GgmlType, dequantize_row};

/// Dequantizes rows `ids` of the `ty` matrix `data` (rows of `row_len` values) into `out`,
/// `[ids.len()][row_len]`.
pub fn get_rows(
    ty: GgmlType,
    data: &[u8],
    row_len: usize,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), OpsError> {
    let block = ty.block_size();
    if row_len == 0 || !row_len.is_multiple_of(block) {
        return Err(OpsError::Ragged {
            what: "get_rows row length (blocks of the type)",
            len: row_len,
            of: block,
        });
    }
    let row_bytes = row_len / block * ty.type_size();
    let n_rows = rows_of("get_rows data (bytes per row)", data.len(), row_bytes)?;
    check_len("get_rows output", ids.len() * row_len, out.len())?;
    check_ids(ids, n_rows)?;
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(row_len)) {
        let r = id as usize * row_bytes;
        dequantize_row(ty, &data[r..r + row_bytes], o)?;
    }
    Ok(())
}

/// Copies rows `ids` of `x`, `[n][d]`, into `out`, `[ids.len()][d]`.
// [d, nt] feature-major, token-major memory
pub fn select_rows(x: &[f32], d: usize, ids: &[i32], out: &mut [f32]) -> Result<(), OpsError> {
    let n_rows = rows_of("select_rows input", x.len(), d)?;
    check_len("select_rows output", ids.len() * d, out.len())?;
    check_ids(ids, n_rows)?;
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(d)) {
        let r = id as usize * d;
        o.copy_from_slice(&x[r..r + d]);
    }
    Ok(())
}

fn check_ids(ids: &[i32], n_rows: usize) -> Result<(), OpsError> {
    for (index, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= n_rows {
            return Err(OpsError::RowId { index, id, n_rows });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_rows_and_errors() {
        // Two Q8_0 rows of 32: d = 1.0 (f16 0x3c00) with qs = row index + 1, d = 0.5 (0x3800).
        let mut data = vec![0x00u8, 0x3c];
        data.extend([1u8; 32]);
        data.extend([0x00u8, 0x38]);
        data.extend([4u8; 32]);
        let mut out = vec![0.0; 64];
        get_rows(GgmlType::Q8_0, &data, 32, &[1, 0], &mut out).unwrap();
        assert_eq!(&out[..32], &[2.0; 32]);
        assert_eq!(&out[32..], &[1.0; 32]);
        let e = get_rows(GgmlType::Q8_0, &data, 32, &[2], &mut out[..32]).unwrap_err();
        assert_eq!(
            e,
            OpsError::RowId {
                index: 0,
                id: 2,
                n_rows: 2
            }
        );
        assert!(e.to_string().contains("row id 2"));
        let e = get_rows(GgmlType::Q8_0, &data, 32, &[0, -1], &mut out).unwrap_err();
        assert_eq!(
            e,
            OpsError::RowId {
                index: 1,
                id: -1,
                n_rows: 2
            }
        );
        assert!(matches!(
            get_rows(GgmlType::Q8_0, &data, 16, &[0], &mut out[..16]),
            Err(OpsError::Ragged { .. })
        ));
        assert!(matches!(
            get_rows(GgmlType::Q8_0, &data[..40], 32, &[0], &mut out[..32]),
            Err(OpsError::Ragged { .. })
        ));
        assert!(matches!(
            get_rows(GgmlType::Q8_0, &data, 32, &[0], &mut out),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            get_rows(GgmlType::Q8_1, &[0u8; 36], 32, &[0], &mut out[..32]),
            Err(OpsError::Quant(_))
        ));
    }

    #[test]
    fn select_rows_copies_and_checks() {
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut out = vec![0.0; 8];
        select_rows(&x, 4, &[2, 0], &mut out).unwrap();
        assert_eq!(out, [8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
        assert!(matches!(
            select_rows(&x, 4, &[3], &mut out[..4]),
            Err(OpsError::RowId { .. })
        ));
        assert!(matches!(
            select_rows(&x, 5, &[0], &mut out[..5]),
            Err(OpsError::Ragged { .. })
        ));
    }
}
