//! Activation quantizers on hand-computed inputs, and round-trip error bounds on random rows.

mod common;
use common::rng::Rng;

use minfer::quants::*;

fn q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
    let mut out = vec![BlockQ8_0::default(); x.len() / 32];
    quantize_row_q8_0(x, &mut out).unwrap();
    out
}

fn q8_0_ref(x: &[f32]) -> Vec<BlockQ8_0> {
    let mut out = vec![BlockQ8_0::default(); x.len() / 32];
    quantize_row_q8_0_ref(x, &mut out).unwrap();
    out
}

fn q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    let mut out = vec![BlockQ8_1::default(); x.len() / 32];
    quantize_row_q8_1(x, &mut out).unwrap();
    out
}

fn q8_1_ref(x: &[f32]) -> Vec<BlockQ8_1> {
    let mut out = vec![BlockQ8_1::default(); x.len() / 32];
    quantize_row_q8_1_ref(x, &mut out).unwrap();
    out
}

fn q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    let mut out = vec![BlockQ8K::default(); x.len() / 256];
    quantize_row_q8_k(x, &mut out).unwrap();
    out
}

fn q8_k_fma(x: &[f32]) -> Vec<BlockQ8K> {
    let mut out = vec![BlockQ8K::default(); x.len() / 256];
    quantize_row_q8_k_fma(x, &mut out).unwrap();
    out
}

/// A block whose largest magnitude is 127, so `d = 1` and both scales are exactly 1: the
/// quants are the inputs rounded, and only the tie rule differs.
fn halves_block() -> [f32; 32] {
    let mut x = [0.0f32; 32];
    x[..8].copy_from_slice(&[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.0]);
    x[8] = 3.25; // not a tie: 3 for both
    x[9] = -3.75; // not a tie: -4 for both
    x
}

#[test]
fn q8_0_ties_go_to_even_on_x86_and_away_from_zero_in_ref() {
    let x = halves_block();
    let b = q8_0(&x)[0];
    assert_eq!(b.d.to_f32(), 1.0);
    assert_eq!(&b.qs[..10], &[0, 2, 2, 0, -2, -2, 126, 127, 3, -4]);
    assert!(b.qs[10..].iter().all(|&q| q == 0));

    let r = q8_0_ref(&x)[0];
    assert_eq!(r.d.to_f32(), 1.0);
    assert_eq!(&r.qs[..10], &[1, 2, 3, -1, -2, -3, 127, 127, 3, -4]);
}

/// x86 scales by `127 / amax`, ref by `1 / (amax / 127)`. For `amax = 2.75` these are the f32s
/// 46.181819915771484 and 46.18181610107422, and `x = 1.375` (exactly `amax / 2`, so 63.5 in
/// exact arithmetic) becomes 63.500004 → 64 on x86 but 63.499996 → 63 in ref. For
/// `amax = 7.25`, `x = 3.625` goes the other way: 63.499996 → 63 on x86, 63.500004 → 64 in ref.
#[test]
fn q8_0_x86_and_ref_scales_differ_in_the_last_bit() {
    assert_ne!(127.0f32 / 2.75, 1.0 / (2.75f32 / 127.0));
    let mut x = [0.0f32; 64];
    x[0] = 2.75;
    x[1] = 1.375;
    x[32] = 7.25;
    x[33] = 3.625;
    let b = q8_0(&x);
    let r = q8_0_ref(&x);
    assert_eq!((b[0].qs[0], b[0].qs[1]), (127, 64));
    assert_eq!((r[0].qs[0], r[0].qs[1]), (127, 63));
    assert_eq!((b[1].qs[0], b[1].qs[1]), (127, 63));
    assert_eq!((r[1].qs[0], r[1].qs[1]), (127, 64));
    // Both store the same scale: f16(2.75 / 127).
    assert_eq!(b[0].d, r[0].d);
    assert_eq!(b[0].d, F16Le::from_f32(2.75 / 127.0));
}

#[test]
fn q8_1_sum_is_d_times_the_integer_quants() {
    let x = halves_block();
    // x86 quants: 0+2+2+0-2-2+126+127+3-4 = 252; s = f16(1.0 * 252)
    let b = q8_1(&x)[0];
    assert_eq!(b.d.to_f32(), 1.0);
    assert_eq!(&b.qs[..10], &[0, 2, 2, 0, -2, -2, 126, 127, 3, -4]);
    assert_eq!(b.s.to_f32(), 252.0);
    // ref quants: 1+2+3-1-2-3+127+127+3-4 = 253
    let r = q8_1_ref(&x)[0];
    assert_eq!(r.s.to_f32(), 253.0);

    // s uses the f32 d, not the f16-rounded one: amax = 1 gives d = 1/127 = 0.007874016 in
    // f32, 0.007873535 in f16; all 32 values 1.0 quantize to 127, so s = f16(0.007874016 *
    // 4064) = f16(32.0) = 32, whereas d16 * 4064 would be 31.998047.
    let b = q8_1(&[1.0; 32])[0];
    assert!(b.qs.iter().all(|&q| q == 127));
    assert_eq!(b.d.to_f32(), F16Le::from_f32(1.0 / 127.0).to_f32());
    assert_eq!(b.s.to_f32(), 32.0);
}

#[test]
fn q8_k_maps_the_signed_extreme_to_minus_127() {
    let mut x = [0.0f32; 256];
    x[..8].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -127.0]);
    x[16] = 10.0;
    x[17] = 10.25;
    let b = q8_k(&x)[0];
    // The first value of largest magnitude is +127: iscale = -127 / 127 = -1, d = 1 / -1.
    assert_eq!(b.d, -1.0);
    // Negated, ties to even: -0.5 → -0 → 0, -1.5 → -2, -2.5 → -2; -(-127) = 127.
    assert_eq!(&b.qs[..8], &[-127, 0, -2, -2, 0, 2, 2, 127]);
    assert_eq!(&b.qs[16..18], &[-10, -10]);
    assert_eq!(b.bsums[0], -127 - 2 - 2 + 2 + 2 + 127);
    assert_eq!(b.bsums[1], -20);
    assert!(b.bsums[2..].iter().all(|&s| s == 0));

    // A negative extreme gives a positive d and un-negated quants.
    let mut y = [0.0f32; 256];
    y[3] = -63.5;
    y[4] = 31.75;
    let b = q8_k(&y)[0];
    assert_eq!(b.d, 1.0 / (127.0 / 63.5));
    assert_eq!(b.d, 0.5);
    assert_eq!(&b.qs[3..5], &[-127, 64]); // 31.75 * 2 = 63.5: tie to even → 64
}

/// Values where `iscale * x` rounded to f32 lands on a half-integer although the exact product
/// does not: the plain reading of the C source (llama.cpp's `GGML_NATIVE=OFF` build, whose
/// `ggml-base` has no FMA) rounds the f32 product, GCC's fused multiply-add (a `-march=native`
/// build) rounds the exact product.
#[test]
fn q8_k_fused_rounding_differs_from_the_plain_source() {
    let mut x = [0.0f32; 256];
    x[0] = 3.0; // iscale = -127 / 3 = -42.333332
    let iscale = -127.0f32 / 3.0;
    // Search deterministically for a value whose f32 product rounds onto (or across) a
    // half-integer so that the two roundings disagree.
    let exact = |v: f32| (iscale as f64 * v as f64).round_ties_even() as i8;
    let of_f32 = |v: f32| (iscale * v).round_ties_even() as i8;
    let v = (1..3_000_000u32)
        .map(|k| k as f32 * 1e-6)
        .find(|&v| exact(v) != of_f32(v))
        .unwrap();
    x[1] = v;
    let fused = q8_k_fma(&x)[0];
    let plain = q8_k(&x)[0];
    assert_eq!(fused.qs[1], exact(v), "x = {v}");
    assert_eq!(plain.qs[1], of_f32(v), "x = {v}");
    assert_eq!(fused.qs[0], -127);
}

#[test]
fn all_zero_rows_quantize_to_zero() {
    let x = [0.0f32; 256];
    assert!(
        q8_0(&x)
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.qs == [0; 32])
    );
    assert!(
        q8_0_ref(&x)
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.qs == [0; 32])
    );
    assert!(
        q8_1(&x)
            .iter()
            .all(|b| b.d.to_f32() == 0.0 && b.s.to_f32() == 0.0 && b.qs == [0; 32])
    );
    let k = q8_k(&x)[0];
    assert_eq!((k.d, k.qs, k.bsums), (0.0, [0; 256], [0; 16]));
    // -0.0 too: its magnitude is 0.
    let k = q8_k(&[-0.0; 256])[0];
    assert_eq!(k.d, 0.0);
}

#[test]
fn quantizers_reject_bad_lengths() {
    let mut b = vec![BlockQ8_0::default(); 2];
    assert_eq!(
        quantize_row_q8_0(&[0.0; 48], &mut b),
        Err(QuantError::RaggedRow {
            ty: GgmlType::Q8_0,
            n: 48,
            block: 32
        })
    );
    assert_eq!(
        quantize_row_q8_0(&[0.0; 32], &mut b),
        Err(QuantError::BlockCount {
            ty: GgmlType::Q8_0,
            n: 32,
            got: 2,
            expected: 1
        })
    );
    let mut k = vec![BlockQ8K::default(); 1];
    assert!(matches!(
        quantize_row_q8_k(&[0.0; 128], &mut k),
        Err(QuantError::RaggedRow { .. })
    ));
}


/// Round trip on random rows. Budgets (per value, `amax` of its block, `d = amax / 127` in f32,
/// `d16` = the stored f16 scale):
/// * Q8_0 / Q8_1 (x86 and ref): `|x - q * d16| <= 0.5 * d + 127 * |d - d16| + 1e-6 * d` —
///   rounding to the nearest quant, plus the f16 rounding of the stored scale (at most
///   `127 * 2^-11 * d`), plus a few f32 ulps of the scale computation;
/// * Q8_K: `|x - q * d| <= (0.5 + 1e-5) * |d|` — its scale is a full f32;
/// * Q8_1's `s`: `|s - d16 * Σq| <= |d - d16| * |Σq| + 2^-11 * d * |Σq| + 2^-25` (the stored
///   scale's rounding, then the f16 rounding of `s`, whose absolute floor is half the smallest
///   f16 subnormal); when `|d * Σq|` exceeds the f16 range, `s` is infinite, as in ggml.
#[test]
fn round_trip_errors_stay_within_budget() {
    let mut rng = Rng(0x1234_5678);
    for trial in 0..200 {
        let scale = 10f32.powi(trial % 9 - 4);
        let x: Vec<f32> = (0..1024).map(|_| rng.activation() * scale).collect();
        let check32 = |d16: f32, qs: &[i8; 32], x: &[f32]| {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let budget = 0.5 * d as f64 + 127.0 * (d - d16).abs() as f64 + 1e-6 * d as f64;
            for (&q, &x) in qs.iter().zip(x) {
                let err = (x as f64 - q as f64 * d16 as f64).abs();
                assert!(
                    err <= budget,
                    "err {err} > {budget} (x = {x}, q = {q}, d16 = {d16})"
                );
            }
        };
        for (b, x) in q8_0(&x).iter().zip(x.chunks(32)) {
            check32(b.d.to_f32(), &b.qs, x);
        }
        for (b, x) in q8_0_ref(&x).iter().zip(x.chunks(32)) {
            check32(b.d.to_f32(), &b.qs, x);
        }
        for blocks in [q8_1(&x), q8_1_ref(&x)] {
            for (b, x) in blocks.iter().zip(x.chunks(32)) {
                check32(b.d.to_f32(), &b.qs, x);
                let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                let (d, d16) = (d as f64, b.d.to_f32() as f64);
                let sum = b.qs.iter().map(|&q| q as i32).sum::<i32>() as f64;
                if (d * sum).abs() >= 65520.0 {
                    // beyond f16: ggml's `s` overflows to infinity too
                    assert!(b.s.to_f32().is_infinite());
                    continue;
                }
                let err = (b.s.to_f32() as f64 - d16 * sum).abs();
                let budget =
                    (d - d16).abs() * sum.abs() + 2f64.powi(-11) * d * sum.abs() + 2f64.powi(-25);
                assert!(err <= budget, "s err {err} > {budget}");
            }
        }
        for blocks in [q8_k(&x), q8_k_fma(&x)] {
            for (b, x) in blocks.iter().zip(x.chunks(256)) {
                let budget = (0.5 + 1e-5) * b.d.abs() as f64;
                for (&q, &x) in b.qs.iter().zip(x) {
                    let err = (x as f64 - q as f64 * b.d as f64).abs();
                    assert!(err <= budget, "q8_k err {err} > {budget}");
                }
                for (k, s) in b.bsums.iter().enumerate() {
                    let sum: i16 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
                    assert_eq!(*s, sum);
                }
            }
        }
    }
}

/// `dequantize_act` inverts the block layout: `x[i] = d * qs[i]`.
#[test]
fn activation_blocks_dequantize() {
    let x = halves_block();
    let b = q8_1(&x);
    let mut out = vec![0.0; 32];
    dequantize_act(&b, &mut out).unwrap();
    assert_eq!(
        &out[..10],
        &[0.0, 2.0, 2.0, 0.0, -2.0, -2.0, 126.0, 127.0, 3.0, -4.0]
    );
    assert!(matches!(
        dequantize_act(&b, &mut [0.0; 64]),
        Err(QuantError::BlockCount { .. })
    ));
}

/// The SIMD quantizers of every ISA this CPU runs (`Kernels::act_row`) against their scalar
/// twins (`ActRow::for_weight`), bit for bit: random rows at scales from 1e-30 to 1e30, plus
/// blocks built to hit each special path — exact ties (x.5 after scaling), ties for the
/// largest magnitude of either sign, all zeros and signed zeros, subnormals, NaN at every
/// register position, ±inf, and values whose Q8_1 sum overflows f16.
#[test]
fn simd_quantizers_match_their_scalar_twins() {
    use minfer::quants::simd::{Kernels, supported_isas};
    let mut rng = Rng(0x9e37_79b9);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for trial in 0..60 {
        let scale = 10f32.powi(trial % 61 - 30);
        rows.push((0..512).map(|_| rng.activation() * scale).collect());
    }
    // Ties: multiples of 0.5 with amax 127 (id = 1), and of amax/254 for the Q8_K scale.
    rows.push((0..512).map(|i| ((i % 255) as f32 - 127.0) * 0.5).collect());
    rows.push((0..512).map(|i| ((i * 7 % 509) as f32 - 254.0) / 2.0).collect());
    // Largest magnitude reached by both signs, in either order.
    let mut tie = vec![0.25f32; 512];
    (tie[3], tie[200], tie[300], tie[301]) = (-4.0, 4.0, 4.0, -4.0);
    rows.push(tie);
    rows.push(vec![0.0; 512]);
    rows.push((0..512).map(|i| if i % 2 == 0 { -0.0 } else { 0.0 }).collect());
    rows.push((0..512).map(|i| f32::from_bits(1 + i as u32 * 3) * if i % 3 == 0 { -1.0 } else { 1.0 }).collect());
    for pos in [0usize, 5, 8, 17, 24, 31, 100, 255, 256, 511] {
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3.0e38] {
            let mut x: Vec<f32> = (0..512).map(|_| rng.normal()).collect();
            x[pos] = special;
            rows.push(x);
        }
    }
    // Q8_1's s overflows f16 (|d * Σq| > 65504).
    rows.push(vec![6.0e4; 512]);
    // Q8_K values whose f32 product `iscale * x` rounds onto or across a half-integer, where
    // an FMA (rounding the exact product) would give another integer than the reference build.
    let iscale = -127.0f32 / 3.0;
    let mut near: Vec<f32> = (1..3_000_000u32)
        .map(|k| k as f32 * 1e-6)
        .filter(|&v| (iscale as f64 * v as f64).round_ties_even() != f64::from((iscale * v).round_ties_even()))
        .collect();
    assert!(near.len() >= 8, "only {} half-integer products found", near.len());
    near = near.iter().copied().cycle().take(510).collect();
    near.insert(0, 3.0);
    near.insert(256, -3.0);
    rows.push(near);
    let weights = [GgmlType::Q5_0, GgmlType::Q4_1, GgmlType::Q4K];
    let bits = |r: &ActRow| -> Vec<u32> {
        match r {
            ActRow::Q8_0(b) => b.iter().flat_map(|b| {
                std::iter::once(u32::from(b.d.to_bits())).chain(b.qs.iter().map(|&q| q as u8 as u32))
            }).collect(),
            ActRow::Q8_1(b) => b.iter().flat_map(|b| {
                [u32::from(b.d.to_bits()), u32::from(b.s.to_bits())].into_iter().chain(b.qs.iter().map(|&q| q as u8 as u32))
            }).collect(),
            ActRow::Q8K(b) => b.iter().flat_map(|b| {
                std::iter::once(b.d.to_bits())
                    .chain(b.qs.iter().map(|&q| q as u8 as u32))
                    .chain(b.bsums.iter().map(|&s| s as u16 as u32))
            }).collect(),
            other => panic!("unexpected activation type {:?}", other.act_type()),
        }
    };
    let isas = supported_isas();
    for isa in &isas {
        let k = Kernels::for_isa(*isa).unwrap();
        for (i, x) in rows.iter().enumerate() {
            for w in weights {
                let want = ActRow::for_weight(w, x).unwrap();
                let got = k.act_row(w, x).unwrap();
                let (got, want) = (bits(&got), bits(&want));
                let first = got.iter().zip(&want).position(|(g, w)| g != w);
                assert!(got.len() == want.len() && first.is_none(), "{isa}, row {i}, weight {w:?}: first differing word {first:?}");
            }
        }
        // The same length errors as the twin.
        for w in weights {
            assert_eq!(k.act_row(w, &[1.0; 48]).err(), ActRow::for_weight(w, &[1.0; 48]).err(), "{isa}");
        }
    }
    eprintln!("compared on {}", isas.iter().map(|i| i.name()).collect::<Vec<_>>().join(", "));
}
