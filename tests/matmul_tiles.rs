//! The many-token (prefill) tile kernels against their scalar twins and the single-token x86
//! dots, bit for bit: `quants::gemm` (Q5_0, Q8_0 · Q8_0), `quants::gemm_k` (Q4_K in the
//! repacked gemv order, Q6_K in vec_dot's order). Shapes cover every remainder path of the
//! kernels: 16 and 48 rows (one and three row registers), 1 to 7 tokens.
//!
//! The SIMD tiles run where the CPU has AVX2 or AVX-512 VNNI (each checked); the twins are checked against the AVX2
//! (x86) dots wherever AVX2 runs, since that is the order they promise.

use minfer::quants::gemm::{B32Panel, B32Tile, Block32Gemm, RowLaneTile, b32_cell_scalar, tile_scalar};
use minfer::quants::gemm_pairs::{B32Pairs, K8Pairs, PAIR_TOKENS};
use minfer::quants::gemm_k::{K4Tile, K6Tile, K8Panel, q6k_cell_scalar};
use minfer::quants::gemv::gemv_q4_k;
use minfer::quants::simd::{Isa, Kernels};
use minfer::quants::*;

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, activations, weight_row};

const ROWS: [usize; 2] = [16, 48];
const TOKENS: [usize; 4] = [1, 2, 5, 7];

fn bits(out: &[Vec<f32>]) -> Vec<Vec<u32>> {
    out.iter().map(|o| o.iter().map(|x| x.to_bits()).collect()).collect()
}

/// `[tokens][rows]` of NaN, and the `&mut` pieces the kernels write into.
fn outputs(tokens: usize, rows: usize) -> Vec<Vec<f32>> {
    vec![vec![f32::NAN; rows]; tokens]
}

fn pieces(out: &mut [Vec<f32>]) -> Vec<&mut [f32]> {
    out.iter_mut().map(|o| o.as_mut_slice()).collect()
}

/// A random matrix of `ty` as blocks, and `tokens` activation rows of its `vec_dot_type`.
fn case<W: WeightBlock>(rng: &mut Rng, rows: usize, cols: usize, tokens: usize) -> (Vec<W>, Vec<ActRow>) {
    let bytes: Vec<u8> = (0..rows).flat_map(|_| weight_row(rng, W::TYPE, cols)).collect();
    let blocks = blocks_of::<W>(&bytes, rows * cols).unwrap().to_vec();
    let acts = (0..tokens)
        .map(|_| ActRow::for_weight(W::TYPE, &activations(rng, cols)).unwrap())
        .collect();
    (blocks, acts)
}

/// The kernels of every ISA this CPU runs that has tile kernels (AVX2, AVX-512).
fn tile_isas() -> Vec<Kernels> {
    let tiled: Vec<Kernels> = [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter_map(|isa| Kernels::for_isa(isa).ok())
        .filter(|k| k.has_tiles())
        .collect();
    if tiled.is_empty() {
        println!("no tile ISA on this CPU: only the scalar twins are checked");
    }
    tiled
}

/// Every element of `out` equals the AVX2 single-token kernel (`gemv` when `repacked`).
fn assert_equals_x86_dots<W: simd::SimdDot>(
    what: &str,
    blocks: &[W],
    per_row: usize,
    acts: &[ActRow],
    out: &[Vec<f32>],
    repacked: bool,
) {
    let Ok(avx2) = Kernels::for_isa(Isa::Avx2) else {
        println!("{what}: no AVX2 here, the x86 dot comparison is skipped");
        return;
    };
    for (t, act) in acts.iter().enumerate() {
        let a = <W as VecDot>::Act::blocks_in(act).unwrap();
        for (r, row) in blocks.chunks(per_row).enumerate() {
            let dot = if repacked { avx2.gemv(row, a) } else { avx2.dot(row, a) };
            assert_eq!(out[t][r].to_bits(), dot.to_bits(), "{what}: token {t} row {r}");
        }
    }
}

fn b32_case<W: Block32Gemm + simd::SimdDot<Act = BlockQ8_0>>(seed: u32) {
    let mut rng = Rng(seed);
    let tiled = tile_isas();
    for rows in ROWS {
        for tokens in TOKENS {
            let cols = 7 * 32;
            let (blocks, acts) = case::<W>(&mut rng, rows, cols, tokens);
            let q8: Vec<&[BlockQ8_0]> = acts.iter().map(|a| BlockQ8_0::blocks_in(a).unwrap()).collect();
            let what = format!("{} rows {rows} tokens {tokens}", W::TYPE);
            let mut twin = outputs(tokens, rows);
            tile_scalar(&blocks, cols / 32, &q8, &mut pieces(&mut twin), b32_cell_scalar);
            assert_equals_x86_dots(&what, &blocks, cols / 32, &acts, &twin, false);
            for k in &tiled {
                let mut tile = B32Tile::default();
                tile.fill(&blocks, cols / 32);
                let panel = B32Panel::new(q8.clone(), W::OFFSET);
                let mut simd = outputs(tokens, rows);
                assert!(k.b32_tile(&tile, &panel, &mut pieces(&mut simd)));
                assert_eq!(bits(&simd), bits(&twin), "{what}: {:?} tile vs scalar twin", k.isa());
            }
        }
    }
}

#[test]
fn q5_0_tiles_equal_twin_and_dots() {
    b32_case::<BlockQ5_0>(0x7115_0001);
}

#[test]
fn q8_0_tiles_equal_twin_and_dots() {
    b32_case::<BlockQ8_0>(0x7115_0002);
}

/// Q4_1 tiles (mins per slot, Q8_1 tokens as a panel of their Q8_0 parts plus sums; AVX-512
/// only) against the single-token AVX2 dot, which follows ggml's `q4_1_q8_1` order
/// (`matmul_dots.rs` checks it against ggml's own kernel). The AVX2 tile refuses a tile with
/// mins, and a panel without the sums is refused.
#[test]
fn q4_1_tiles_equal_the_dots() {
    use minfer::quants::gemm::split_q8_1;
    let mut rng = Rng(0x7115_0041);
    for rows in ROWS {
        for tokens in TOKENS {
            let cols = 7 * 32;
            let (blocks, acts) = case::<BlockQ4_1>(&mut rng, rows, cols, tokens);
            let (y, sa): (Vec<Vec<BlockQ8_0>>, Vec<Vec<f32>>) =
                acts.iter().map(|a| split_q8_1(BlockQ8_1::blocks_in(a).unwrap())).unzip();
            let mut tile = B32Tile::default();
            tile.fill(&blocks, cols / 32);
            assert_eq!(tile.m.len(), tile.d.len());
            let mut panel = B32Panel::new(y.iter().map(Vec::as_slice).collect(), BlockQ4_1::OFFSET);
            for k in tile_isas() {
                let mut out = outputs(tokens, rows);
                let refused = !k.b32_tile(&tile, &panel, &mut pieces(&mut out));
                assert!(refused, "{:?}: a Q4_1 tile without the tokens' sums must be refused", k.isa());
            }
            panel.sa = sa;
            for k in tile_isas() {
                let mut out = outputs(tokens, rows);
                let ran = k.b32_tile(&tile, &panel, &mut pieces(&mut out));
                assert_eq!(ran, k.isa() == Isa::Avx512, "{:?}", k.isa());
                if ran {
                    let what = format!("Q4_1 rows {rows} tokens {tokens}");
                    assert_equals_x86_dots(&what, &blocks, cols / 32, &acts, &out, false);
                } else {
                    assert!(out.iter().flatten().all(|x| x.is_nan()), "a refusal writes nothing");
                }
            }
        }
    }
}

/// A pair kernel `run(n_rows, out)` against its scalar twin (`[tokens][rows]`), bit for bit;
/// with a row count that does not match its blocks, or too few outputs, it must refuse and
/// write nothing.
fn assert_pair_kernel(what: &str, twin: &[Vec<f32>], run: impl Fn(usize, &mut [&mut [f32]]) -> bool) {
    let (tokens, rows) = (twin.len(), twin[0].len());
    let mut simd = outputs(tokens, rows);
    assert!(run(rows, &mut pieces(&mut simd)), "{what}");
    assert_eq!(bits(&simd), bits(twin), "{what}: pairs vs scalar twin");
    let mut none = outputs(tokens, rows);
    assert!(!run(rows + 1, &mut pieces(&mut none)), "{what}: a row count off by one");
    assert!(!run(rows, &mut pieces(&mut none[..tokens - 1])), "{what}: one output short");
    assert!(none.iter().flatten().all(|x| x.is_nan()), "{what}: refused but wrote");
}

/// The few-token pair kernels (Q5_0, Q8_0 with up to 8 tokens; AVX2 and AVX-512 VNNI) against
/// the scalar twin, bit for bit, for every token count, for 1, 2 and 17 rows and for rows of
/// 7, 16 and 19 blocks (less than one group of 8 blocks' scales, two whole groups, two and a
/// part); shapes that do not fit are refused with nothing written.
fn b32_pairs_case<W: Block32Gemm + simd::SimdDot<Act = BlockQ8_0>>(seed: u32) {
    for k in tile_isas().into_iter().filter(|k| k.has_pairs()) {
        b32_pairs_on::<W>(k, seed);
    }
}

fn b32_pairs_on<W: Block32Gemm + simd::SimdDot<Act = BlockQ8_0>>(k: Kernels, seed: u32) {
    let mut rng = Rng(seed);
    for (rows, per_row) in [1, 2, 17].into_iter().flat_map(|r| [(r, 7), (r, 16), (r, 19)]) {
        for tokens in 1..=PAIR_TOKENS {
            let cols = per_row * 32;
            let (blocks, acts) = case::<W>(&mut rng, rows, cols, tokens);
            let q8: Vec<&[BlockQ8_0]> = acts.iter().map(|a| BlockQ8_0::blocks_in(a).unwrap()).collect();
            let what = format!("{:?} {} rows {rows} x {per_row} blocks, tokens {tokens}", k.isa(), W::TYPE);
            let mut twin = outputs(tokens, rows);
            tile_scalar(&blocks, cols / 32, &q8, &mut pieces(&mut twin), b32_cell_scalar);
            let g = B32Pairs::new(&q8, W::OFFSET).unwrap();
            assert_pair_kernel(&what, &twin, |n, out| k.b32_pairs(&blocks, n, &g, out));
        }
    }
}

#[test]
fn q5_0_pairs_equal_twin() {
    b32_pairs_case::<BlockQ5_0>(0x7115_0005);
}

#[test]
fn q8_0_pairs_equal_twin() {
    b32_pairs_case::<BlockQ8_0>(0x7115_0006);
}

fn f32_bits<const N: usize>(v: &[[f32; N]]) -> Vec<[u32; N]> {
    v.iter().map(|a| a.map(f32::to_bits)).collect()
}

/// The ISA's fill (SIMD transposes) makes the scalar fill's tile, field by field, also into a
/// tile that held other rows before (matrix products reuse tiles without clearing them).
fn assert_same_k4(scalar: &K4Tile, blocks: &[BlockQ4K], per_row: usize, k: &Kernels) {
    // Twice the rows, reversed, first: the reused tile shrinks.
    let other: Vec<BlockQ4K> = blocks.iter().chain(blocks).rev().copied().collect();
    let mut reused = K4Tile::default();
    reused.fill(&other, per_row);
    reused.fill(blocks, per_row);
    assert_eq!(format!("{reused:?}"), format!("{scalar:?}"), "scalar fill into a used tile");
    let mut t = K4Tile::default();
    k.k4_fill(&mut t, &other, per_row);
    k.k4_fill(&mut t, blocks, per_row);
    assert_eq!((t.vecs, t.per_row), (scalar.vecs, scalar.per_row));
    assert_eq!(t.q, scalar.q, "Q4_K quants");
    assert_eq!(t.sc, scalar.sc, "Q4_K scales");
    assert_eq!(t.mp, scalar.mp, "Q4_K mins");
    assert_eq!(f32_bits(&t.d), f32_bits(&scalar.d), "Q4_K d");
    assert_eq!(f32_bits(&t.dmin), f32_bits(&scalar.dmin), "Q4_K dmin");
}

fn assert_same_k6(scalar: &K6Tile, blocks: &[BlockQ6K], per_row: usize, k: &Kernels) {
    // Twice the rows, reversed, first: the reused tile shrinks.
    let other: Vec<BlockQ6K> = blocks.iter().chain(blocks).rev().copied().collect();
    let mut reused = K6Tile::default();
    reused.fill(&other, per_row);
    reused.fill(blocks, per_row);
    assert_eq!(format!("{reused:?}"), format!("{scalar:?}"), "scalar fill into a used tile");
    let mut t = K6Tile::default();
    k.k6_fill(&mut t, &other, per_row);
    k.k6_fill(&mut t, blocks, per_row);
    assert_eq!((t.vecs, t.per_row), (scalar.vecs, scalar.per_row));
    assert_eq!(t.q, scalar.q, "Q6_K quants");
    assert_eq!(t.scp, scalar.scp, "Q6_K scales");
    assert_eq!(t.sp, scalar.sp, "Q6_K scale pairs");
    assert_eq!(f32_bits(&t.d), f32_bits(&scalar.d), "Q6_K d");
}

#[test]
fn k_quant_tiles_equal_twin_and_dots() {
    let mut rng = Rng(0x7115_0003);
    let tiled = tile_isas();
    for rows in ROWS {
        for tokens in TOKENS {
            let cols = 3 * QK_K;
            let per_row = cols / QK_K;
            let (q4, acts4) = case::<BlockQ4K>(&mut rng, rows, cols, tokens);
            let (q6, acts6) = case::<BlockQ6K>(&mut rng, rows, cols, tokens);
            let q8k = |acts: &[ActRow]| -> Vec<Vec<BlockQ8K>> {
                acts.iter().map(|a| BlockQ8K::blocks_in(a).unwrap().to_vec()).collect()
            };
            let (a4, a6) = (q8k(&acts4), q8k(&acts6));
            let p4 = K8Panel::new(a4.iter().map(|a| a.as_slice()).collect());
            let p6 = K8Panel::new(a6.iter().map(|a| a.as_slice()).collect());

            let mut twin4 = outputs(tokens, rows);
            tile_scalar(&q4, per_row, &p4.acts, &mut pieces(&mut twin4), gemv_q4_k);
            assert_equals_x86_dots(&format!("Q4_K rows {rows} tokens {tokens}"), &q4, per_row, &acts4, &twin4, true);
            let mut twin6 = outputs(tokens, rows);
            tile_scalar(&q6, per_row, &p6.acts, &mut pieces(&mut twin6), q6k_cell_scalar);
            assert_equals_x86_dots(&format!("Q6_K rows {rows} tokens {tokens}"), &q6, per_row, &acts6, &twin6, false);

            for k in &tiled {
                let isa = k.isa();
                let mut t4 = K4Tile::default();
                t4.fill(&q4, per_row);
                assert_same_k4(&t4, &q4, per_row, k);
                let mut simd4 = outputs(tokens, rows);
                assert!(k.k4_tile(&t4, &p4, &mut pieces(&mut simd4)));
                assert_eq!(bits(&simd4), bits(&twin4), "{isa:?} Q4_K rows {rows} tokens {tokens}");
                let mut t6 = K6Tile::default();
                t6.fill(&q6, per_row);
                assert_same_k6(&t6, &q6, per_row, k);
                let mut simd6 = outputs(tokens, rows);
                assert!(k.k6_tile(&t6, &p6, &mut pieces(&mut simd6)));
                assert_eq!(bits(&simd6), bits(&twin6), "{isa:?} Q6_K rows {rows} tokens {tokens}");
            }
        }
    }
}

/// The K-quant pair kernels (Q4_K in the repacked gemv order, Q6_K in vec_dot's; up to 8
/// tokens, AVX-512 VNNI) against the scalar twins, bit for bit, for every token count and for
/// 1, 2 and 17 rows; shapes that do not fit are refused with nothing written.
#[test]
fn k_quant_pairs_equal_twin() {
    let Some(k) = Kernels::for_isa(Isa::Avx512).ok().filter(|k| k.has_pairs()) else {
        println!("no AVX-512 VNNI on this CPU: the pair kernels are not checked");
        return;
    };
    let mut rng = Rng(0x7115_0007);
    for rows in [1, 2, 17] {
        for tokens in 1..=PAIR_TOKENS {
            let cols = 3 * QK_K;
            let per_row = cols / QK_K;
            let (q4, acts4) = case::<BlockQ4K>(&mut rng, rows, cols, tokens);
            let (q6, acts6) = case::<BlockQ6K>(&mut rng, rows, cols, tokens);
            let a4: Vec<&[BlockQ8K]> = acts4.iter().map(|a| BlockQ8K::blocks_in(a).unwrap()).collect();
            let a6: Vec<&[BlockQ8K]> = acts6.iter().map(|a| BlockQ8K::blocks_in(a).unwrap()).collect();
            let (g4, g6) = (K8Pairs::new(&a4).unwrap(), K8Pairs::new(&a6).unwrap());
            let what = format!("rows {rows} tokens {tokens}");

            let mut twin4 = outputs(tokens, rows);
            tile_scalar(&q4, per_row, &a4, &mut pieces(&mut twin4), gemv_q4_k);
            assert_pair_kernel(&format!("Q4_K {what}"), &twin4, |n, out| k.k4_gemv_pairs(&q4, n, &g4, out));

            let mut twin6 = outputs(tokens, rows);
            tile_scalar(&q6, per_row, &a6, &mut pieces(&mut twin6), q6k_cell_scalar);
            assert_pair_kernel(&format!("Q6_K {what}"), &twin6, |n, out| k.k6_pairs(&q6, n, &g6, out));
        }
    }
}

/// The twins follow the exact float order the x86 dots use, which is what prefill/decode
/// invariance needs; against an f64 reference they are within the dots' own budget: the
/// activation quantization plus 1e-5 of the magnitude (see `matmul_matmul.rs`).
#[test]
fn twins_are_close_to_f64() {
    let mut rng = Rng(0x7115_0004);
    let (rows, tokens, cols) = (16, 3, 512);
    let (blocks, acts) = case::<BlockQ5_0>(&mut rng, rows, cols, tokens);
    let q8: Vec<&[BlockQ8_0]> = acts.iter().map(|a| BlockQ8_0::blocks_in(a).unwrap()).collect();
    let mut out = outputs(tokens, rows);
    tile_scalar(&blocks, cols / 32, &q8, &mut pieces(&mut out), b32_cell_scalar);
    for (t, act) in acts.iter().enumerate() {
        let x = act.dequantize(); // the quantized activations, so only f32 rounding remains
        for (r, row) in blocks.chunks(cols / 32).enumerate() {
            let mut w = vec![0.0f32; cols];
            dequantize_blocks(row, &mut w);
            let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            let mag: f64 = w.iter().zip(&x).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
            let err = (f64::from(out[t][r]) - exact).abs();
            assert!(err <= 1e-5 * mag + 1e-30, "t {t} r {r}: {} vs {exact}", out[t][r]);
        }
    }
}
