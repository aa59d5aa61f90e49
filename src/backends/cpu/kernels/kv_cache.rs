//! KV cells stored as f16 or packed Q8_0 (see [`KvType`]): storing rows, reading them back as
//! f32, and the store kernel for every type. Regions are f32 pool buffers; a packed row is
//! `row_bytes` bytes at byte offset `cell * row_bytes` of the region.
//!
//! Q8_0 rows are quantized as ggml quantizes activations (`quantize_row_q8_0`: `d = amax/127`,
//! f16-rounded, `q = round(x / d)`), 32 values a block; f16 rows round to nearest even.
//! Q8_0 rows are stored rotated head by head ([`hadamard`](super::hadamard)), as llama.cpp
//! stores quantized caches: [`encode_row`] / [`decode_row`] give and take the plain values.

use super::attention::{AttnArgs, attention, check_store, kv_store};
use crate::workers::Pool;
use super::hadamard::rotate_heads;
use super::error::{OpsError, check_len};
use crate::tensor::KvType;
use crate::quants::{BlockQ8_0, F16Le, quantize_row_q8_0};

fn bytes(region: &[f32]) -> &[u8] {
    bytemuck::cast_slice(region)
}

fn bytes_mut(region: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(region)
}

/// A packed row's blocks (`BlockQ8_0` has alignment 1, so any byte offset is fine).
pub fn q8_blocks(row: &[u8]) -> &[BlockQ8_0] {
    bytemuck::cast_slice(row)
}

fn check_width(kv_type: KvType, width: usize) -> Result<(), OpsError> {
    if kv_type == KvType::Q8_0 && !width.is_multiple_of(32) {
        return Err(OpsError::BadDim { what: "q8_0 KV row width", value: width, why: "must be a multiple of 32" });
    }
    Ok(())
}

/// Encodes one row of `width` values into `out` (`kv_type.row_bytes(width)` bytes).
pub fn store_row(kv_type: KvType, x: &[f32], out: &mut [u8]) -> Result<(), OpsError> {
    check_width(kv_type, x.len())?;
    check_len("kv row bytes", kv_type.row_bytes(x.len()), out.len())?;
    match kv_type {
        KvType::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        KvType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&F16Le::from_f32(v).0);
            }
        }
        KvType::Q8_0 => {
            let mut blocks = vec![BlockQ8_0::default(); x.len() / 32];
            quantize_row_q8_0(x, &mut blocks).map_err(|e| OpsError::BadDim { what: "q8_0 KV row", value: x.len(), why: quant_failed(e) })?;
            out.copy_from_slice(bytemuck::cast_slice(&blocks));
        }
    }
    Ok(())
}

fn quant_failed(_: crate::quants::QuantError) -> &'static str {
    "cannot be quantized"
}

/// Decodes one row of `out.len()` values from its bytes.
pub fn load_row(kv_type: KvType, row: &[u8], out: &mut [f32]) -> Result<(), OpsError> {
    check_width(kv_type, out.len())?;
    check_len("kv row bytes", kv_type.row_bytes(out.len()), row.len())?;
    match kv_type {
        KvType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        KvType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = F16Le([b[0], b[1]]).to_f32();
            }
        }
        KvType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(q8_blocks(row)) {
                let d = b.d.to_f32();
                for (x, &q) in o.iter_mut().zip(&b.qs) {
                    *x = d * f32::from(q);
                }
            }
        }
    }
    Ok(())
}

/// The first `rows` rows of a region as f32, `[rows][width]`.
pub fn load_rows(kv_type: KvType, region: &[f32], width: usize, rows: usize) -> Result<Vec<f32>, OpsError> {
    let rb = kv_type.row_bytes(width);
    let b = bytes(region);
    if rows * rb > b.len() {
        return Err(OpsError::Length { what: "kv region", expected: rows * rb, got: b.len() });
    }
    let mut out = vec![0.0f32; rows * width];
    for (r, o) in out.chunks_exact_mut(width.max(1)).enumerate() {
        load_row(kv_type, &b[r * rb..(r + 1) * rb], o)?;
    }
    Ok(out)
}

/// Row `cell`'s bytes in a region.
pub fn row_bytes_mut(kv_type: KvType, region: &mut [f32], width: usize, cell: usize) -> Result<&mut [u8], OpsError> {
    let rb = kv_type.row_bytes(width);
    let b = bytes_mut(region);
    let len = b.len();
    b.get_mut(cell * rb..(cell + 1) * rb).ok_or(OpsError::Length { what: "kv region", expected: (cell + 1) * rb, got: len })
}

/// Whether rows of `kv_type` are stored rotated.
pub const fn rotated(kv_type: KvType) -> bool {
    matches!(kv_type, KvType::Q8_0)
}

/// Stores plain values `x` (heads of `head_dim`) as a row: rotated first when the type is.
pub fn encode_row(kv_type: KvType, head_dim: usize, x: &[f32], out: &mut [u8]) -> Result<(), OpsError> {
    if rotated(kv_type) {
        let mut r = x.to_vec();
        rotate_heads(&mut r, head_dim);
        store_row(kv_type, &r, out)
    } else {
        store_row(kv_type, x, out)
    }
}

/// The plain values of a row stored by [`encode_row`].
pub fn decode_row(kv_type: KvType, head_dim: usize, row: &[u8], out: &mut [f32]) -> Result<(), OpsError> {
    load_row(kv_type, row, out)?;
    if rotated(kv_type) {
        rotate_heads(out, head_dim);
    }
    Ok(())
}

/// Attention over f16 or Q8_0 regions by the f32 path: the cells in use are decoded into f32
/// copies first (the `MINFER_NO_FUSED_Q8_KV=1` read of a q8_0 cache, and the f16 read).
/// `args.k_cache` / `args.v_cache` are ignored: the regions are `k` and `v`.
pub fn attention_dequantized(
    pool: &Pool,
    kv_type: KvType,
    args: &AttnArgs,
    (k, v): (&[f32], &[f32]),
    out: &mut [f32],
) -> Result<(), OpsError> {
    let width = args.n_head_kv * args.head_dim;
    let rows = args.positions.iter().map(|&p| p.max(0) as usize + 1).max().unwrap_or(0);
    let kf = load_rows(kv_type, k, width, rows)?;
    let vf = load_rows(kv_type, v, width, rows)?;
    let mut plain = AttnArgs { k_cache: &kf, v_cache: &vf, ..*args };
    if !rotated(kv_type) {
        return attention(pool, &plain, out);
    }
    // The cells hold H·k and H·v: rotate the query the same way, and the output back.
    let mut qr = args.q.to_vec();
    rotate_heads(&mut qr, args.head_dim);
    plain.q = &qr;
    attention(pool, &plain, out)?;
    rotate_heads(out, args.head_dim);
    Ok(())
}

/// [`kv_store`] for any cell type: rows `cells[t]` of both regions get token `t`'s K and V.
pub fn kv_store_typed(
    (kv_type, head_dim): (KvType, usize),
    k: &[f32],
    v: &[f32],
    cells: &[i32],
    n_ctx: usize,
    k_region: &mut [f32],
    v_region: &mut [f32],
) -> Result<(), OpsError> {
    if kv_type == KvType::F32 {
        return kv_store(k, v, cells, n_ctx, k_region, v_region);
    }
    let regions = (k_region.len(), v_region.len());
    let Some(width) = check_store(k, v, cells, n_ctx, regions, |w| kv_type.region_len(w, n_ctx))? else {
        return Ok(());
    };
    for (t, &cell) in cells.iter().enumerate() {
        let c = cell as usize;
        encode_row(kv_type, head_dim, &k[t * width..(t + 1) * width], row_bytes_mut(kv_type, k_region, width, c)?)?;
        encode_row(kv_type, head_dim, &v[t * width..(t + 1) * width], row_bytes_mut(kv_type, v_region, width, c)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_the_format_precision() {
        let x = crate::backends::cpu::kernels::test_data(64, 3, 1, 2.0);
        for (t, tol) in [(KvType::F32, 0.0), (KvType::F16, 2.0 / 2048.0), (KvType::Q8_0, 2.0 / 127.0)] {
            let mut b = vec![0u8; t.row_bytes(64)];
            store_row(t, &x, &mut b).unwrap();
            let mut y = vec![0.0; 64];
            load_row(t, &b, &mut y).unwrap();
            let err = x.iter().zip(&y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol, "{t}: {err}");
        }
        assert!(store_row(KvType::Q8_0, &x[..40], &mut [0u8; 68]).is_err());
    }

    #[test]
    fn store_writes_the_named_cells_only() {
        let (w, n_ctx) = (32, 4);
        let k = crate::backends::cpu::kernels::test_data(2 * w, 1, 2, 1.0);
        let v = crate::backends::cpu::kernels::test_data(2 * w, 1, 3, 1.0);
        let t = KvType::Q8_0;
        let mut kr = vec![0.0f32; t.region_len(w, n_ctx)];
        let mut vr = kr.clone();
        kv_store_typed((t, 32), &k, &v, &[3, 1], n_ctx, &mut kr, &mut vr).unwrap();
        let rows = load_rows(t, &kr, w, n_ctx).unwrap();
        assert!(rows[..w].iter().all(|&x| x == 0.0) && rows[2 * w..3 * w].iter().all(|&x| x == 0.0));
        let err = rows[3 * w..].iter().zip(&k[..w]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err < 1.0 / 127.0 + 1e-6, "{err}");
        assert!(kv_store_typed((t, 32), &k, &v, &[0, 4], n_ctx, &mut kr, &mut vr).is_err());
        // 64-value heads are stored rotated; decode_row gives the plain values back
        let x = crate::backends::cpu::kernels::test_data(128, 9, 9, 1.0);
        let mut row = vec![0u8; t.row_bytes(128)];
        encode_row(t, 64, &x, &mut row).unwrap();
        let mut plain = vec![0.0; 128];
        load_row(t, &row, &mut plain).unwrap();
        assert!(plain.iter().zip(&x).any(|(a, b)| (a - b).abs() > 0.1), "stored rotated");
        decode_row(t, 64, &row, &mut plain).unwrap();
        assert!(plain.iter().zip(&x).all(|(a, b)| (a - b).abs() < 0.02));
    }
}
