//! `kernels::matmul` on random weights of every type: against a dequantize-then-f64 reference,
//! bit-identical across thread counts, bit-identical between a batch of tokens and one token at
//! a time (batch invariance), for every ISA this machine runs; and typed errors for bad shapes.
//!
//! # Budget against the f64 reference
//!
//! `ref[t][r] = Σ_i w[r][i] x[t][i]` in f64 from the dequantized weights and the original f32
//! activations, plus the bias. The product differs from it by the activation quantization and
//! the f32 summation: `|out - ref| <= Σ_i |w_i| e_i + REL * S + 2^-23 |out|`, with `e_i` the
//! per-value quantization bound of the activation type (`0.57 * amax_b / 127` for Q8_0/Q8_1:
//! half a step plus the f16 rounding of the scale; `0.51 * amax_b / 127` for Q8_K; `2^-11 |x_i|`
//! for F16; `2^-8 |x_i|` for BF16; 0 for F32), `S` the magnitude of the dot (see
//! `matmul_gen::magnitude`), `REL` 1e-5 (f32 rounding of block terms, see `matmul_dots.rs`), or
//! 1e-3 for Q4_1/Q5_1 whose min term uses Q8_1's `s = f16(d Σ q)` rather than `Σ a_i`, and
//! `2^-23 |out|` the rounding of the bias add.

use minfer::quants::simd::{Isa, SimdError, supported_isas, vec_dot_row_isa};
use minfer::quants::*;
use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{MatmulError, WeightMatrix, matmul, matmul_with_isa};

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, activations, magnitude, weight_row};

const WEIGHT_TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

/// A random `rows x cols` matrix of `ty` as bytes.
fn matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| weight_row(rng, ty, cols)).collect()
}

/// Row length used for a type: a few blocks, an odd count where the block size allows.
fn cols_for(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 130,
        32 => 224,
        _ => 768,
    }
}

fn run(pool: &Pool, w: &WeightMatrix, x: &[f32], bias: Option<&[f32]>, isa: Isa) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.len() / w.cols * w.rows];
    matmul_with_isa(pool, w, x, bias, &mut out, isa).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Per-value activation quantization bound, see the module docs.
fn act_error(ty: GgmlType, x: &[f32]) -> Vec<f64> {
    let blockwise = |bs: usize, frac: f64| -> Vec<f64> {
        x.chunks(bs)
            .flat_map(|b| {
                let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                std::iter::repeat_n(frac * amax / 127.0, b.len())
            })
            .collect()
    };
    match vec_dot_type(ty).unwrap() {
        GgmlType::Q8_0 | GgmlType::Q8_1 => blockwise(32, 0.57),
        GgmlType::Q8K => blockwise(256, 0.51),
        GgmlType::F16 => x.iter().map(|v| v.abs() as f64 * 2f64.powi(-11)).collect(),
        GgmlType::BF16 => x.iter().map(|v| v.abs() as f64 * 2f64.powi(-8)).collect(),
        _ => vec![0.0; x.len()],
    }
}

#[test]
fn matches_dequantized_f64_reference() {
    let pool = Pool::new(2).unwrap();
    let mut rng = Rng(0xabcd_0001);
    // 48 rows: the many-token tile kernels where the ISA has them; 37: element by element.
    for (ty, rows) in WEIGHT_TYPES.into_iter().flat_map(|ty| [(ty, 37), (ty, 48)]) {
        let nt = 3;
        let cols = cols_for(ty);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = WeightMatrix {
            packed: None,
            ty,
            data: &data,
            rows,
            cols,
        };
        let x: Vec<f32> = (0..nt).flat_map(|_| activations(&mut rng, cols)).collect();
        let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
        let row_bytes = w.row_bytes();
        let mut worst = 0.0f64;
        for isa in supported_isas() {
            let out = run(&pool, &w, &x, Some(&bias), isa);
            for t in 0..nt {
                let xt = &x[t * cols..(t + 1) * cols];
                let act = ActRow::for_weight(ty, xt).unwrap();
                let e = act_error(ty, xt);
                for r in 0..rows {
                    let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                    let mut wf = vec![0.0f32; cols];
                    dequantize_row(ty, wr, &mut wf).unwrap();
                    let exact: f64 = wf
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let reference = exact + f64::from(bias[r]);
                    let qerr: f64 = wf
                        .iter()
                        .zip(&e)
                        .map(|(&w, &e)| f64::from(w.abs()) * e)
                        .sum();
                    let rel = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                        1e-3
                    } else {
                        1e-5
                    };
                    let got = out[t * rows + r];
                    let budget = qerr
                        + rel * magnitude(ty, wr, &act)
                        + 2f64.powi(-23) * f64::from(got.abs());
                    let err = (f64::from(got) - reference).abs();
                    assert!(
                        err <= budget,
                        "{ty} {isa} t {t} r {r}: {got} vs {reference} (budget {budget:e})"
                    );
                    if budget > 0.0 {
                        worst = worst.max(err / budget);
                    }
                }
            }
        }
        println!("{ty:>5}: worst error / budget = {worst:.3}");
    }
}

#[test]
fn bit_identical_for_1_2_and_3_threads() {
    let pools: Vec<Pool> = (1..=3).map(|n| Pool::new(n).unwrap()).collect();
    let mut rng = Rng(0xabcd_0002);
    // 37 rows: vec_dot for every type; 40: the repacked gemv for Q4_0 and Q4_K.
    for (ty, rows) in WEIGHT_TYPES.into_iter().flat_map(|ty| [(ty, 2 * minfer::backends::cpu::kernels::matmul::ROW_TILE + 5), (ty, 40)]) {
        let cols = cols_for(ty);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = WeightMatrix {
            packed: None,
            ty,
            data: &data,
            rows,
            cols,
        };
        let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
        for nt in [1, 5] {
            let x: Vec<f32> = (0..nt).flat_map(|_| activations(&mut rng, cols)).collect();
            for isa in supported_isas() {
                let one = bits(&run(&pools[0], &w, &x, Some(&bias), isa));
                for pool in &pools[1..] {
                    let other = bits(&run(pool, &w, &x, Some(&bias), isa));
                    assert_eq!(
                        one,
                        other,
                        "{ty} {isa} nt {nt}: {} threads differ",
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

#[test]
fn batches_equal_single_tokens_on_both_sides_of_the_tile_threshold() {
    let pool = Pool::new(2).unwrap();
    let mut rng = Rng(0xabcd_0003);
    let min = minfer::backends::cpu::kernels::matmul::TILE_MIN_TOKENS;
    let min_avx2 = minfer::backends::cpu::kernels::matmul::TILE_MIN_TOKENS_AVX2;
    let pairs = minfer::backends::cpu::kernels::matmul::PAIRS_BELOW_TOKENS;
    // Below the tile threshold (AVX2's is higher) every element is a dot, four tokens per
    // unpacked weight block (`Kernels::dot_rows`: 2 = one group of 2, 5 = 4 + 1, min - 1 =
    // 4 + 3); from it on the tile kernels run. Q5_0 and Q8_0 on AVX2 and AVX-512 take the
    // pair kernels below `pairs` (groups of 8: 9 = 8 + 1), the tiles from it on.
    for (nt, ty) in [2, 5, min - 1, min + 1, min_avx2 - 1, min_avx2 + 1, pairs - 1, pairs].into_iter().flat_map(|nt| WEIGHT_TYPES.into_iter().map(move |ty| (nt, ty))) {
        let cols = cols_for(ty);
        // 48: the many-token tile kernels (rows a multiple of 16) where the ISA has them.
        for rows in [1, 37, 3 * minfer::backends::cpu::kernels::matmul::ROW_TILE + 1, 24, 48] {
            let data = matrix(&mut rng, ty, rows, cols);
            let w = WeightMatrix {
                packed: None,
                ty,
                data: &data,
                rows,
                cols,
            };
            let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
            let x: Vec<f32> = (0..nt).flat_map(|_| activations(&mut rng, cols)).collect();
            for isa in supported_isas() {
                for b in [None, Some(&bias[..])] {
                    let batch = bits(&run(&pool, &w, &x, b, isa));
                    let single: Vec<u32> = x
                        .chunks(cols)
                        .flat_map(|xt| bits(&run(&pool, &w, xt, b, isa)))
                        .collect();
                    assert_eq!(batch, single, "{ty} {isa} rows {rows} tokens {nt} bias {}", b.is_some());
                }
            }
        }
    }
}

/// Matrices tall enough that the pair kernels' work items of one token group hold more than
/// one row tile (1096 rows, a multiple of 8 so that Q4_K takes its pair kernel: items of 32
/// rows on 2 threads and 64 on 1, the last ones of 8; `pair_tile_rows`), and 9 tokens (two
/// groups, 16-row items): the batch still equals its tokens one at a time, and 2 threads
/// equal 1, bit for bit.
#[test]
fn tall_matrices_through_the_pair_kernels_equal_single_tokens() {
    let (one, two) = (Pool::new(1).unwrap(), Pool::new(2).unwrap());
    let mut rng = Rng(0xabcd_0006);
    let rows = 1096;
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q4K] {
        let cols = cols_for(ty);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = WeightMatrix { packed: None, ty, data: &data, rows, cols };
        let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
        for nt in [2, 4, 9] {
            let x: Vec<f32> = (0..nt).flat_map(|_| activations(&mut rng, cols)).collect();
            for isa in supported_isas() {
                let batch = bits(&run(&two, &w, &x, Some(&bias), isa));
                assert_eq!(batch, bits(&run(&one, &w, &x, Some(&bias), isa)), "{ty} {isa} tokens {nt}: threads");
                let single: Vec<u32> = x.chunks(cols).flat_map(|xt| bits(&run(&one, &w, xt, Some(&bias), isa))).collect();
                assert_eq!(batch, single, "{ty} {isa} tokens {nt}");
            }
        }
    }
}

#[test]
fn active_isa_is_what_matmul_uses_and_scalar_equals_reference_dots() {
    let pool = Pool::new(2).unwrap();
    let mut rng = Rng(0xabcd_0004);
    let rows = 9;
    for ty in WEIGHT_TYPES {
        let cols = cols_for(ty);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = WeightMatrix {
            packed: None,
            ty,
            data: &data,
            rows,
            cols,
        };
        let bias: Vec<f32> = (0..rows).map(|_| rng.normal()).collect();
        let x = activations(&mut rng, cols);
        let mut out = vec![0.0; rows];
        matmul(&pool, &w, &x, Some(&bias), &mut out).unwrap();
        let active = run(
            &pool,
            &w,
            &x,
            Some(&bias),
            minfer::quants::simd::active_isa(),
        );
        assert_eq!(bits(&out), bits(&active), "{ty}");
        let scalar = run(&pool, &w, &x, Some(&bias), Isa::Scalar);
        let act = ActRow::for_weight(ty, &x).unwrap();
        let row_bytes = w.row_bytes();
        for r in 0..rows {
            let dot = vec_dot_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], &act).unwrap();
            assert_eq!(
                scalar[r].to_bits(),
                (dot + bias[r]).to_bits(),
                "{ty} row {r}"
            );
        }
    }
}

/// Q4_0 and Q4_K matrices of a multiple of 8 rows are multiplied in the order of llama.cpp's
/// repacked gemv (`quants::gemv`), bit for bit the same in every ISA this CPU runs on x86;
/// other row counts use the dot. Q2_K is repacked by llama.cpp's AVX-512 build only: the gemv
/// order in the scalar and AVX-512 kernels, the AVX2 dot's order in the AVX2 kernels.
#[test]
fn repacked_types_use_the_gemv_order() {
    let pool = Pool::new(2).unwrap();
    let mut rng = Rng(0xabcd_0005);
    for ty in [GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q2K] {
        let cols = cols_for(ty);
        for rows in [16, 9] {
            let data = matrix(&mut rng, ty, rows, cols);
            let w = WeightMatrix {
                packed: None,
                ty,
                data: &data,
                rows,
                cols,
            };
            let x = activations(&mut rng, cols);
            let act = ActRow::for_weight(ty, &x).unwrap();
            let row_bytes = w.row_bytes();
            let want: Vec<u32> = (0..rows)
                .map(|r| {
                    let row = &data[r * row_bytes..(r + 1) * row_bytes];
                    let v = match (rows % 8, &act) {
                        (0, ActRow::Q8_0(a)) => gemv::gemv_q4_0(blocks_of(row, cols).unwrap(), a),
                        (0, ActRow::Q8K(a)) if ty == GgmlType::Q2K => gemv::gemv_q2_k(blocks_of(row, cols).unwrap(), a),
                        (0, ActRow::Q8K(a)) => gemv::gemv_q4_k(blocks_of(row, cols).unwrap(), a),
                        _ => vec_dot_row(ty, row, &act).unwrap(),
                    };
                    v.to_bits()
                })
                .collect();
            for isa in supported_isas() {
                // The x86 SIMD dots sum in ggml's x86 order, not the scalar one; NEON follows
                // no ggml order.
                if (rows % 8 != 0 || !cfg!(target_arch = "x86_64")) && isa != Isa::Scalar {
                    continue;
                }
                let got = bits(&run(&pool, &w, &x, None, isa));
                #[cfg(target_arch = "x86_64")]
                if ty == GgmlType::Q2K && isa == Isa::Avx2 {
                    let dots: Vec<u32> = (0..rows)
                        .map(|r| {
                            let row = &data[r * row_bytes..(r + 1) * row_bytes];
                            vec_dot_row_isa(Isa::Avx2, ty, row, &act).unwrap().to_bits()
                        })
                        .collect();
                    assert_eq!(got, dots, "{ty} {isa} rows {rows}: the AVX2 build's vec_dot");
                    continue;
                }
                assert_eq!(got, want, "{ty} {isa} rows {rows}");
            }
        }
    }
}

#[test]
fn shape_errors_are_typed_not_panics() {
    let pool = Pool::new(1).unwrap();
    let data = vec![0u8; 2 * 34];
    let w = WeightMatrix {
        packed: None,
        ty: GgmlType::Q8_0,
        data: &data,
        rows: 2,
        cols: 32,
    };
    let x = vec![0.5f32; 64];
    let mut out = vec![0.0f32; 4];
    let err = |w: &WeightMatrix, x: &[f32], b: Option<&[f32]>, out: &mut [f32]| {
        matmul(&pool, w, x, b, out).unwrap_err()
    };
    assert_eq!(
        err(&w, &x[..40], None, &mut out),
        MatmulError::InputLength { cols: 32, got: 40 }
    );
    assert_eq!(
        err(&w, &x, None, &mut out[..3]),
        MatmulError::OutputLength {
            rows: 2,
            tokens: 2,
            expected: 4,
            got: 3
        }
    );
    assert_eq!(
        err(&w, &x, Some(&[1.0]), &mut out),
        MatmulError::BiasLength { rows: 2, got: 1 }
    );
    let short = WeightMatrix {
        data: &data[..67],
        ..w
    };
    assert_eq!(
        err(&short, &x, None, &mut out),
        MatmulError::WeightBytes {
            ty: GgmlType::Q8_0,
            rows: 2,
            cols: 32,
            expected: 68,
            got: 67
        }
    );
    let ragged = WeightMatrix { cols: 16, ..w };
    assert_eq!(
        err(&ragged, &x, None, &mut out),
        MatmulError::RaggedRow {
            ty: GgmlType::Q8_0,
            cols: 16,
            block: 32
        }
    );
    for ty in [GgmlType::Q8_1, GgmlType::Q8K] {
        let act_only = WeightMatrix { ty, ..w };
        assert_eq!(
            err(&act_only, &x, None, &mut out),
            MatmulError::UnsupportedType { ty }
        );
    }
    let empty = WeightMatrix { cols: 0, ..w };
    assert_eq!(err(&empty, &x, None, &mut out), MatmulError::NoColumns);
    let huge = WeightMatrix {
        rows: usize::MAX,
        ..w
    };
    assert!(matches!(
        err(&huge, &x, None, &mut out),
        MatmulError::TooLarge { .. }
    ));
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
        let e = matmul_with_isa(&pool, &w, &x, None, &mut out, isa).unwrap_err();
        assert_eq!(e, MatmulError::Simd(SimdError::Unsupported { isa }));
    }
    // No tokens: nothing to do, not an error.
    matmul(&pool, &w, &[], None, &mut []).unwrap();
    // A good call still works after all that.
    matmul(&pool, &w, &x, Some(&[1.0, 2.0]), &mut out).unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
    assert!(!format!("{}", MatmulError::BiasLength { rows: 2, got: 1 }).is_empty());
}
