//! The repacked decode products (AVX-512 VNNI) against their twins, every row bit-identical,
//! for row counts that fill the 16-row groups and ones that leave the last group partly empty,
//! one to several blocks per row, random, zero and all-ones blocks, and activations of every
//! scale `matmul_gen` makes:
//!
//! * Q4_K (`quants::packed_k4`) against `gemv::gemv_q4_k` (ggml's `ggml_gemv_q4_K_8x8_q8_K`
//!   order);
//! * Q5_0, Q8_0 and Q4_1 (`quants::packed_b32`) against the x86 single-row `vec_dot` kernels
//!   (`Kernels::dot`, checked against ggml's own in `matmul_dots.rs`) and against the scalar
//!   reading of the packed layout, `b32_packed_scalar`.
//!
//! Also the whole `matmul` path: a one-token product with a packed copy equals the same rows
//! computed row by row, on every ISA this machine runs.

use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul_with_isa};
use minfer::quants::gemm::{B32Panel, split_q8_1};
use minfer::quants::packed::PackedMatrix;
use minfer::quants::packed_b32::{B32Packed, b32_packed_scalar};
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
    assert!(kernels.has_packed());
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
        let packed = PackedMatrix::K4(K4Packed::new(&w, rows, per_row).unwrap());
        for isa in supported_isas() {
            for with_packed in [None, Some(&packed)] {
                let m = WeightMatrix { ty: GgmlType::Q4K, data: bytes, rows, cols, packed: with_packed };
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

/// A `[rows][cols]` matrix of `ty` from `matmul_gen` (random, zero and extreme blocks).
fn matrix_bytes(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| weight_row(rng, ty, cols)).collect()
}

fn q8_0_row(x: &[f32]) -> Vec<BlockQ8_0> {
    match ActRow::for_weight(GgmlType::Q8_0, x).unwrap() {
        ActRow::Q8_0(a) => a,
        other => panic!("Q8_0 activations expected, got {:?}", other.act_type()),
    }
}

fn b32_packed<W: minfer::quants::packed_b32::Block32Pack>(bytes: &[u8], rows: usize, per_row: usize) -> (Vec<W>, B32Packed) {
    let blocks: Vec<W> = blocks_of::<W>(bytes, rows * per_row * 32).unwrap().to_vec();
    let packed = B32Packed::new(&blocks, rows, per_row).unwrap();
    (blocks, packed)
}

/// One token's activations for weights of type `ty` (Q8_0, or Q8_1 for Q4_1) as a packed
/// product reads them: Q8_0 blocks, and the Q8_1 sums (empty for Q8_0).
fn panel_parts(act: &ActRow) -> (Vec<BlockQ8_0>, Vec<f32>) {
    match act {
        ActRow::Q8_0(a) => (a.clone(), Vec::new()),
        ActRow::Q8_1(a) => split_q8_1(a),
        other => panic!("Q8_0 or Q8_1 activations expected, got {:?}", other.act_type()),
    }
}

fn check_b32_packed<W: minfer::quants::packed_b32::Block32Pack>(kernels: Kernels, seed: u32) {
    let ty = <W as WeightBlock>::TYPE;
    let mut rng = Rng(seed);
    for (rows, per_row) in [(16, 1), (8, 2), (24, 3), (48, 4), (40, 7), (128, 28)] {
        for _ in 0..4 {
            let bytes = matrix_bytes(&mut rng, ty, rows, per_row * 32);
            let (_, packed) = b32_packed::<W>(&bytes, rows, per_row);
            assert_eq!((packed.groups(), packed.bytes()), (rows.div_ceil(16), rows.div_ceil(16) * 16 * per_row * std::mem::size_of::<W>()));
            let act = ActRow::for_weight(ty, &activations(&mut rng, per_row * 32)).unwrap();
            let (a, sa) = panel_parts(&act);
            let mut panel = B32Panel::new(vec![a.as_slice()], packed.offset());
            if !sa.is_empty() {
                panel.sa = vec![sa];
            }
            let mut out = vec![f32::NAN; rows];
            assert!(kernels.b32_packed_gemv(&packed, 0, &panel, &mut out));
            let mut split = vec![f32::NAN; rows];
            for (g, piece) in split.chunks_mut(16).enumerate() {
                assert!(kernels.b32_packed_gemv(&packed, g, &panel, piece));
                let twin = b32_packed_scalar(&packed, g, &panel).unwrap();
                for (j, (got, want)) in piece.iter().zip(twin).enumerate() {
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty:?} twin, rows {rows} x {per_row} blocks, row {}", 16 * g + j);
                }
            }
            let row_bytes = bytes.len() / rows;
            for r in 0..rows {
                let want = minfer::quants::simd::vec_dot_row_isa(Isa::Avx512, ty, &bytes[r * row_bytes..][..row_bytes], &act).unwrap();
                assert_eq!(out[r].to_bits(), want.to_bits(), "{ty:?} rows {rows} x {per_row} blocks, row {r}: {} vs {want}", out[r]);
                assert_eq!(split[r].to_bits(), want.to_bits(), "{ty:?} split, row {r}");
            }
        }
    }
}

#[test]
fn packed_q5_0_q8_0_and_q4_1_rows_equal_vec_dot_bit_for_bit() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else {
        eprintln!("no AVX-512 VNNI here: the packed kernels do not run (the matmul test below still checks the fallback)");
        return;
    };
    assert!(kernels.has_packed());
    check_b32_packed::<BlockQ5_0>(kernels, 0x5005);
    check_b32_packed::<BlockQ8_0>(kernels, 0x8008);
    check_b32_packed::<BlockQ4_1>(kernels, 0x4001);
}

#[test]
fn packed_b32_bad_shapes_are_refused_and_write_nothing() {
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else { return };
    let mut rng = Rng(11);
    let bytes = matrix_bytes(&mut rng, GgmlType::Q5_0, 32, 64);
    let blocks = blocks_of::<BlockQ5_0>(&bytes, 32 * 64).unwrap();
    assert!(B32Packed::new(blocks, 32, 3).is_none());
    assert!(B32Packed::new(blocks, 33, 2).is_none());
    assert!(B32Packed::new(blocks, 0, 0).is_none());
    let packed = B32Packed::new(blocks, 32, 2).unwrap();
    let a = q8_0_row(&activations(&mut rng, 64));
    let short = q8_0_row(&activations(&mut rng, 32));
    let mut out = vec![1.5f32; 32];
    let (good, short) = (B32Panel::new(vec![&a[..]], 16), B32Panel::new(vec![&short[..]], 16));
    assert!(!kernels.b32_packed_gemv(&packed, 0, &short, &mut out));
    assert!(!kernels.b32_packed_gemv(&packed, 1, &good, &mut out));
    assert!(!kernels.b32_packed_gemv(&packed, 0, &good, &mut [0.0; 33]));
    assert!(!kernels.b32_packed_gemv(&packed, 0, &B32Panel::new(vec![&a[..], &a[..]], 16), &mut out));
    assert!(!kernels.b32_packed_gemv(&packed, 0, &B32Panel::default(), &mut out));
    assert!(b32_packed_scalar(&packed, 2, &good).is_none());
    assert!(b32_packed_scalar(&packed, 0, &short).is_none());
    // Q4_1 needs the activations' sums, one per block.
    let bytes = matrix_bytes(&mut rng, GgmlType::Q4_1, 32, 64);
    let q41 = B32Packed::new(blocks_of::<BlockQ4_1>(&bytes, 32 * 64).unwrap(), 32, 2).unwrap();
    let no_sums = B32Panel::new(vec![&a[..]], 0);
    assert!(!kernels.b32_packed_gemv(&q41, 0, &no_sums, &mut out));
    assert!(b32_packed_scalar(&q41, 0, &no_sums).is_none());
    let short_sums = B32Panel { sa: vec![vec![1.0]], ..no_sums.clone() };
    assert!(!kernels.b32_packed_gemv(&q41, 0, &short_sums, &mut out));
    assert!(out.iter().all(|&x| x == 1.5));
    let sums = B32Panel { sa: vec![vec![1.0, -2.0]], ..no_sums };
    assert!(kernels.b32_packed_gemv(&q41, 0, &sums, &mut out));
}

#[test]
fn one_token_q5_0_q8_0_and_q4_1_products_follow_vec_dot_on_every_isa() {
    let mut rng = Rng(0x3b32);
    let pool = Pool::new(2).unwrap();
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1] {
        for (rows, cols) in [(64, 512), (40, 96), (8, 32), (12, 64)] {
            let bytes = matrix_bytes(&mut rng, ty, rows, cols);
            let x = activations(&mut rng, cols);
            let act = ActRow::for_weight(ty, &x).unwrap();
            let packed = PackedMatrix::for_decode(ty, &bytes, rows, cols).unwrap().unwrap();
            let row_bytes = bytes.len() / rows;
            for isa in supported_isas() {
                for with_packed in [None, Some(&packed)] {
                    let m = WeightMatrix { ty, data: &bytes, rows, cols, packed: with_packed };
                    let mut out = vec![f32::NAN; rows];
                    let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.25 - 3.0).collect();
                    matmul_with_isa(&pool, &m, &x, Some(&bias), &mut out, isa).unwrap();
                    for r in 0..rows {
                        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        let want = minfer::quants::simd::vec_dot_row_isa(isa, ty, row, &act).unwrap() + bias[r];
                        assert_eq!(out[r].to_bits(), want.to_bits(), "{isa:?} {ty:?} {rows}x{cols} packed {} row {r}", with_packed.is_some());
                    }
                }
            }
        }
    }
}

/// Tiles filled from a packed copy (`Kernels::b32_fill_packed`, the prefill's fill where a
/// decode copy exists) against the scalar fill from the file's blocks (`RowLaneTile::fill`,
/// the twin), field by field and bit for bit, for every group range of a few Q5_0, Q8_0 and
/// Q4_1 matrices; ranges past the end and row counts that leave a group partly empty are
/// refused with the tile left as it was.
#[test]
fn tiles_filled_from_packed_copies_equal_the_scalar_fill() {
    use minfer::quants::gemm::{B32Tile, RowLaneTile};
    let Ok(kernels) = Kernels::for_isa(Isa::Avx512) else {
        eprintln!("no AVX-512 VNNI here: no packed copies to fill tiles from");
        return;
    };
    fn same(a: &B32Tile, b: &B32Tile) -> bool {
        let d = |t: &B32Tile| t.d.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        let m = |t: &B32Tile| t.m.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        a.q == b.q && d(a) == d(b) && m(a) == m(b) && (a.vecs, a.per_row, a.offset) == (b.vecs, b.per_row, b.offset)
    }
    fn check<W: minfer::quants::packed_b32::Block32Pack + minfer::quants::gemm::Block32Gemm>(kernels: Kernels, seed: u32) {
        let ty = <W as WeightBlock>::TYPE;
        let mut rng = Rng(seed);
        for (rows, per_row) in [(16, 1), (32, 3), (64, 7), (96, 28)] {
            let bytes = matrix_bytes(&mut rng, ty, rows, per_row * 32);
            let (blocks, packed) = b32_packed::<W>(&bytes, rows, per_row);
            let groups = rows / 16;
            let mut reused = B32Tile::default();
            for first in 0..groups {
                for n in 1..=groups - first {
                    let mut twin = B32Tile::default();
                    twin.fill(&blocks[first * 16 * per_row..(first + n) * 16 * per_row], per_row);
                    assert!(kernels.b32_fill_packed(&mut reused, &packed, first, n), "{ty:?}");
                    assert!(same(&reused, &twin), "{ty:?} rows {rows} x {per_row}, groups {first}..{}", first + n);
                }
            }
            let before = reused.clone();
            assert!(!kernels.b32_fill_packed(&mut reused, &packed, groups, 1));
            assert!(!kernels.b32_fill_packed(&mut reused, &packed, 0, groups + 1));
            assert!(same(&reused, &before));
        }
    }
    check::<BlockQ5_0>(kernels, 0x5a5a);
    check::<BlockQ8_0>(kernels, 0x8a8a);
    check::<BlockQ4_1>(kernels, 0x4a4a);
    let mut rng = Rng(3);
    let mut t = B32Tile::default();
    let bytes = matrix_bytes(&mut rng, GgmlType::Q5_0, 24, 32);
    let (_, partial) = b32_packed::<BlockQ5_0>(&bytes, 24, 1);
    assert!(!kernels.b32_fill_packed(&mut t, &partial, 0, 1));
    assert!(t.q.is_empty());
}

#[test]
fn copies_hand_back_their_source_in_order_as_they_grow() {
    use minfer::quants::packed::RELEASE_RUN;
    let mut rng = Rng(0x7e1e);
    // Q8_0 4096 x 1024: 4.25 MiB of blocks, so several runs and a shorter last one.
    for (ty, rows, cols) in [(GgmlType::Q8_0, 4096, 1024), (GgmlType::Q6K, 2048, 1024), (GgmlType::Q5_0, 16, 64)] {
        let bytes = matrix_bytes(&mut rng, ty, rows, cols);
        let mut ranges = Vec::new();
        let packed = PackedMatrix::for_decode_releasing(ty, &bytes, rows, cols, &mut |r| ranges.push(r)).unwrap().unwrap();
        let plain = PackedMatrix::for_decode(ty, &bytes, rows, cols).unwrap().unwrap();
        assert_eq!(packed.bytes(), plain.bytes());
        assert_eq!(ranges.first().map(|r| r.start), Some(0), "{ty:?}");
        assert_eq!(ranges.last().map(|r| r.end), Some(bytes.len()), "{ty:?}");
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "{ty:?}: runs in order, no gap");
            assert!(pair[0].len() >= RELEASE_RUN, "{ty:?}: {} bytes is a short run before the last", pair[0].len());
        }
        // Each run ends on a row boundary: its rows are copied when it is handed back.
        let row_bytes = bytes.len() / rows;
        assert!(ranges.iter().all(|r| r.end % row_bytes == 0), "{ty:?}");
        assert!(bytes.len() < RELEASE_RUN || ranges.len() > 1, "{ty:?}");
    }
    // A type without a copy hands nothing back.
    let bytes = matrix_bytes(&mut rng, GgmlType::Q4_0, 16, 64);
    let mut calls = 0;
    assert!(PackedMatrix::for_decode_releasing(GgmlType::Q4_0, &bytes, 16, 64, &mut |_| calls += 1).unwrap().is_none());
    assert_eq!(calls, 0);
}
