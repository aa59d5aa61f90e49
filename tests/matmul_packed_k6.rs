//! The repacked Q6_K decode product (`quants::packed_k6`, AVX-512 VNNI) against its twins, every
//! row bit-identical: the x86 single-row `vec_dot` (`Kernels::dot`, ggml's
//! `ggml_vec_dot_q6_K_q8_K` order, checked against ggml's own in `matmul_dots.rs`) and the
//! scalar reading of that order (`gemm_k::q6k_cell_scalar`); row counts that fill the 16-row
//! groups and ones that leave the last group partly empty, one to several blocks per row,
//! random, zero and extreme blocks, and activations of every scale `matmul_gen` makes. Also the
//! prefill tile filled from the packed copy against the fill from the blocks, and the whole
//! `matmul` path (one token and many) with and without the copy, on every ISA.

use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul_with_isa};
use minfer::quants::gemm::RowLaneTile;
use minfer::quants::gemm_k::{K6Tile, q6k_cell_scalar};
use minfer::quants::packed::PackedMatrix;
use minfer::quants::packed_k6::K6Packed;
use minfer::quants::simd::{Isa, Kernels, supported_isas};
use minfer::quants::*;

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, activations, weight_row};

fn q6k_matrix(rng: &mut Rng, rows: usize, cols: usize) -> Vec<BlockQ6K> {
    let bytes: Vec<u8> = (0..rows).flat_map(|_| weight_row(rng, GgmlType::Q6K, cols)).collect();
    bytes.chunks_exact(210).map(|c| *bytemuck::from_bytes::<BlockQ6K>(c)).collect()
}

fn q8k_row(x: &[f32]) -> Vec<BlockQ8K> {
    let mut a = vec![bytemuck::Zeroable::zeroed(); x.len() / 256];
    quantize_row_q8_k(x, &mut a).unwrap();
    a
}

/// An activation row at the edges of Q8_K's range: every quant -128 or 127 (where the 4-value
/// dots of a chunk reach their extremes, 4·63·±128).
fn extreme_q8k(rng: &mut Rng, per_row: usize) -> Vec<BlockQ8K> {
    (0..per_row)
        .map(|_| {
            let mut b: BlockQ8K = bytemuck::Zeroable::zeroed();
            b.d = 0.01 + (rng.next_u32() % 100) as f32 * 1e-3;
            let all_low = rng.next_u32().is_multiple_of(2);
            for q in b.qs.iter_mut() {
                *q = if all_low || rng.next_u32().is_multiple_of(2) { -128 } else { 127 };
            }
            for (k, s) in b.bsums.iter_mut().enumerate() {
                *s = b.qs[16 * k..16 * k + 16].iter().map(|&q| i16::from(q)).sum();
            }
            b
        })
        .collect()
}

#[test]
fn packed_q6k_rows_equal_vec_dot_bit_for_bit() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else {
        eprintln!("no AVX-512 VNNI here: the packed kernel does not run (the matmul test below still checks the fallback)");
        return;
    };
    let mut rng = Rng(0x6b36);
    for (rows, per_row) in [(16, 1), (8, 2), (24, 3), (48, 4), (40, 2), (64, 6)] {
        for round in 0..5 {
            let w = q6k_matrix(&mut rng, rows, per_row * 256);
            let a = if round == 4 { extreme_q8k(&mut rng, per_row) } else { q8k_row(&activations(&mut rng, per_row * 256)) };
            let packed = K6Packed::new(&w, rows, per_row).unwrap();
            assert_eq!(packed.groups(), rows.div_ceil(16));
            let mut out = vec![f32::NAN; rows];
            // All groups at once, then each group alone (as the workers split them).
            assert!(kernels.k6_packed_gemv(&packed, 0, &a, &mut out));
            let mut split = vec![f32::NAN; rows];
            for (g, piece) in split.chunks_mut(16).enumerate() {
                assert!(kernels.k6_packed_gemv(&packed, g, &a, piece));
            }
            for r in 0..rows {
                let row = &w[r * per_row..(r + 1) * per_row];
                let want = kernels.dot(row, &a);
                assert_eq!(want.to_bits(), q6k_cell_scalar(row, &a).to_bits(), "the twins disagree, row {r}");
                assert_eq!(out[r].to_bits(), want.to_bits(), "rows {rows} x {per_row} blocks, row {r}: {} vs {want}", out[r]);
                assert_eq!(split[r].to_bits(), want.to_bits(), "split, row {r}");
            }
        }
    }
}

#[test]
fn packed_q6k_bad_shapes_are_refused_and_write_nothing() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else { return };
    let mut rng = Rng(7);
    let w = q6k_matrix(&mut rng, 32, 512);
    assert!(K6Packed::new(&w, 32, 3).is_none());
    assert!(K6Packed::new(&w, 33, 2).is_none());
    assert!(K6Packed::new(&w, 0, 0).is_none());
    let packed = K6Packed::new(&w, 32, 2).unwrap();
    let a = q8k_row(&activations(&mut rng, 512));
    let short = q8k_row(&activations(&mut rng, 256));
    let mut out = vec![1.5f32; 32];
    assert!(!kernels.k6_packed_gemv(&packed, 0, &short, &mut out));
    assert!(!kernels.k6_packed_gemv(&packed, 1, &a, &mut out));
    assert!(!kernels.k6_packed_gemv(&packed, 0, &a, &mut [0.0; 33]));
    assert!(!kernels.k6_packed_gemv(&packed, usize::MAX / 8, &a, &mut out[..16]));
    assert!(out.iter().all(|&x| x == 1.5));
    // A copy whose blocks are not its shape's (the fields are public) is refused too.
    let mut short = packed.clone();
    short.blocks.truncate(3);
    assert!(!short.consistent());
    assert!(!kernels.k6_packed_gemv(&short, 0, &a, &mut out[..16]));
    assert!(!kernels.k6_fill_packed(&mut minfer::quants::gemm_k::K6Tile::default(), &short, 0, 1));
}

#[test]
fn q6k_tiles_filled_from_the_packed_copy_equal_the_fill_from_blocks() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else {
        eprintln!("no AVX-512 VNNI here: no packed copies to fill tiles from");
        return;
    };
    fn same(a: &K6Tile, b: &K6Tile) -> bool {
        let d = |t: &K6Tile| t.d.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        a.q == b.q && a.scp == b.scp && a.sp == b.sp && d(a) == d(b) && (a.vecs, a.per_row) == (b.vecs, b.per_row)
    }
    let mut rng = Rng(0x6f11);
    for (rows, per_row) in [(16, 1), (32, 3), (64, 2), (96, 4)] {
        let w = q6k_matrix(&mut rng, rows, per_row * 256);
        let packed = K6Packed::new(&w, rows, per_row).unwrap();
        let groups = rows / 16;
        let mut reused = K6Tile::default();
        for first in 0..groups {
            for n in 1..=groups - first {
                let mut twin = K6Tile::default();
                twin.fill(&w[first * 16 * per_row..(first + n) * 16 * per_row], per_row);
                assert!(kernels.k6_fill_packed(&mut reused, &packed, first, n));
                assert!(same(&reused, &twin), "rows {rows} x {per_row}, groups {first}..{}", first + n);
            }
        }
        let before = reused.clone();
        assert!(!kernels.k6_fill_packed(&mut reused, &packed, groups, 1));
        assert!(!kernels.k6_fill_packed(&mut reused, &packed, 0, groups + 1));
        assert!(!kernels.k6_fill_packed(&mut reused, &packed, usize::MAX, 2));
        assert!(same(&reused, &before));
    }
    let w = q6k_matrix(&mut rng, 24, 256);
    let partial = K6Packed::new(&w, 24, 1).unwrap();
    let mut t = K6Tile::default();
    assert!(!kernels.k6_fill_packed(&mut t, &partial, 0, 1));
    assert!(t.q.is_empty());
}

#[test]
fn q6k_products_with_the_packed_copy_follow_vec_dot_on_every_isa() {
    let mut rng = Rng(0x6e37);
    let pool = Pool::new(2).unwrap();
    // One token (the packed gemv), 3 and 9 (the pair kernels on AVX-512, from the file), 33 and
    // 40 (the tiles, filled from the copy, several 32-row tiles and a 16-row one).
    let cases = [(64, 512, 1), (40, 768, 1), (12, 256, 1), (48, 512, 3), (64, 512, 9), (32, 768, 40), (24, 256, 9), (96, 512, 40), (48, 256, 33)];
    for (rows, cols, tokens) in cases {
        let w = q6k_matrix(&mut rng, rows, cols);
        let x = activations(&mut rng, cols * tokens);
        let per_row = cols / 256;
        let bytes: &[u8] = bytemuck::cast_slice(&w);
        let packed = PackedMatrix::for_decode(GgmlType::Q6K, bytes, rows, cols).unwrap().expect("every Q6_K matrix packs");
        assert!(matches!(packed, PackedMatrix::K6(_)));
        for isa in supported_isas() {
            for with_packed in [None, Some(&packed)] {
                let m = WeightMatrix { ty: GgmlType::Q6K, data: bytes, rows, cols, packed: with_packed };
                let mut out = vec![f32::NAN; rows * tokens];
                matmul_with_isa(&pool, &m, &x, None, &mut out, isa).unwrap();
                for t in 0..tokens {
                    let a = q8k_row(&x[t * cols..(t + 1) * cols]);
                    for r in 0..rows {
                        let want = minfer::quants::simd::vec_dot_isa(isa, &w[r * per_row..(r + 1) * per_row], &a).unwrap();
                        let got = out[t * rows + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} {rows}x{cols} x{tokens} packed {} token {t} row {r}", with_packed.is_some());
                    }
                }
            }
        }
    }
}
