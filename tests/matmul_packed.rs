//! The repacked Q4_K decode gemv (`quants::packed_k4`, AVX-512 VNNI) against its scalar twin
//! `gemv::gemv_q4_k` (ggml's `ggml_gemv_q4_K_8x8_q8_K` order): every row bit-identical, for row
//! counts that fill the 16-row groups and ones that leave the last group partly empty, one to
//! several super-blocks per row, random, zero and all-ones blocks, and activations of every
//! scale `matmul_gen` makes. Also the whole `matmul` path: a one-token product of a Q4_K matrix
//! equals the same rows computed by `gemv_q4_k`, on every ISA this machine runs.

use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul_with_isa};
use minfer::quants::packed_k4::{K4Packed, K8Row};
use minfer::quants::simd::{Isa, Kernels, supported_isas};
use minfer::quants::*;

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, activations, weight_row};

fn q4k_matrix(rng: &mut Rng, rows: usize, cols: usize) -> Vec<BlockQ4K> {
    let bytes: Vec<u8> = (0..rows).flat_map(|_| weight_row(rng, GgmlType::Q4K, cols)).collect();
    bytes.chunks_exact(144).map(|c| *bytemuck::from_bytes::<BlockQ4K>(c)).collect()
}

fn q8k_row(x: &[f32]) -> Vec<BlockQ8K> {
    let mut a = vec![bytemuck::Zeroable::zeroed(); x.len() / 256];
    quantize_row_q8_k(x, &mut a).unwrap();
    a
}

#[test]
fn packed_rows_equal_the_gemv_twin_bit_for_bit() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else {
        eprintln!("no AVX-512 VNNI here: the packed kernel does not run (the matmul test below still checks the fallback)");
        return;
    };
    assert!(kernels.has_packed_k4());
    let mut rng = Rng(0x4b34);
    for (rows, per_row) in [(16, 1), (8, 2), (24, 3), (48, 4), (40, 2), (64, 6)] {
        for _ in 0..4 {
            let w = q4k_matrix(&mut rng, rows, per_row * 256);
            let a = q8k_row(&activations(&mut rng, per_row * 256));
            let packed = K4Packed::new(&w, rows, per_row).unwrap();
            assert_eq!(packed.groups(), rows.div_ceil(16));
            let row = K8Row::new(&a);
            let mut out = vec![f32::NAN; rows];
            // All groups at once, then each group alone (as the workers split them).
            assert!(kernels.k4_packed_gemv(&packed, 0, &row, &mut out));
            let mut split = vec![f32::NAN; rows];
            for (g, piece) in split.chunks_mut(16).enumerate() {
                assert!(kernels.k4_packed_gemv(&packed, g, &row, piece));
            }
            for r in 0..rows {
                let want = gemv::gemv_q4_k(&w[r * per_row..(r + 1) * per_row], &a);
                assert_eq!(out[r].to_bits(), want.to_bits(), "rows {rows} x {per_row} blocks, row {r}: {} vs {want}", out[r]);
                assert_eq!(split[r].to_bits(), want.to_bits(), "split, row {r}");
            }
        }
    }
}

#[test]
fn bad_shapes_are_refused_and_write_nothing() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else { return };
    let mut rng = Rng(7);
    let w = q4k_matrix(&mut rng, 32, 512);
    assert!(K4Packed::new(&w, 32, 3).is_none());
    assert!(K4Packed::new(&w, 33, 2).is_none());
    assert!(K4Packed::new(&w, 0, 0).is_none());
    let packed = K4Packed::new(&w, 32, 2).unwrap();
    let a = q8k_row(&activations(&mut rng, 512));
    let short = q8k_row(&activations(&mut rng, 256));
    let mut out = vec![1.5f32; 32];
    assert!(!kernels.k4_packed_gemv(&packed, 0, &K8Row::new(&short), &mut out));
    assert!(!kernels.k4_packed_gemv(&packed, 1, &K8Row::new(&a), &mut out));
    assert!(!kernels.k4_packed_gemv(&packed, 0, &K8Row::new(&a), &mut [0.0; 33]));
    assert!(out.iter().all(|&x| x == 1.5));
}

#[test]
fn one_token_q4k_products_follow_the_gemv_on_every_isa() {
    let mut rng = Rng(0x9e37);
    let pool = Pool::new(2).unwrap();
    for (rows, cols) in [(64, 512), (40, 768), (8, 256), (12, 256)] {
        let w = q4k_matrix(&mut rng, rows, cols);
        let x = activations(&mut rng, cols);
        let a = q8k_row(&x);
        let per_row = cols / 256;
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let packed = K4Packed::new(&w, rows, per_row).unwrap();
        for isa in supported_isas() {
            for with_packed in [None, Some(&packed)] {
                let m = WeightMatrix { ty: GgmlType::Q4K, data: bytes, rows, cols, packed_k4: with_packed };
                let mut out = vec![f32::NAN; rows];
                matmul_with_isa(&pool, &m, &x, None, &mut out, isa).unwrap();
                for r in 0..rows {
                    let row = &w[r * per_row..(r + 1) * per_row];
                    // llama.cpp repacks (gemv order) only matrices of 8k rows; others take vec_dot.
                    let want = if rows % 8 == 0 {
                        gemv::gemv_q4_k(row, &a)
                    } else {
                        vec_dot_row_for(isa, row, &a)
                    };
                    assert_eq!(out[r].to_bits(), want.to_bits(), "{isa:?} {rows}x{cols} packed {} row {r}", with_packed.is_some());
                }
            }
        }
    }
}

fn vec_dot_row_for(isa: Isa, row: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    minfer::quants::simd::vec_dot_isa(isa, row, a).unwrap()
}
