//! `vec_dot_row` against f64 dot products of the dequantized rows, on random weights of every
//! type, on the real blocks of the reference file, and on random activations.
//!
//! # Budgets
//!
//! With `w` the dequantized weight row, `a` the dequantized activation row (the quantized
//! activations as the kernel sees them), `x` the original f32 activations and
//! `S = Σ |w_i a_i|` (in f64):
//!
//! 1. **against `w · a` in f64**: `|vec_dot - w·a| <= REL[ty] * S`. The kernels sum exact
//!    integer block sums and round only when combining blocks in f32, so the error is a few
//!    f32 ulps per block relative to `S` (~`nb * 2^-24` in the worst case, far less in
//!    practice). Q4_1 and Q5_1 get a larger budget: their kernel uses Q8_1's stored
//!    `s = f16(d * Σq)` for the min term, which is not exactly `Σ a_i` of the block
//!    (f16 rounding of `d` and `s`: relative 2^-10 of `|m| * |s|`).
//! 2. **against `w · x` in f64** (no activation quantization at all): the quantization error
//!    of each activation, bounded per value, plus budget 1:
//!    `|vec_dot - w·x| <= Σ |w_i| * e_i + REL[ty] * S`, with `e_i` = `0.57 * amax_b / 127`
//!    for Q8_0/Q8_1 (half a quant step, plus the f16 rounding of the scale: `127 * 2^-11` of
//!    a step), `0.51 * amax_b / 127` for Q8_K (f32 scale), `2^-11 |x_i|` for F16, `2^-8 |x_i|`
//!    for BF16, 0 for F32; `amax_b` is the largest `|x|` of the value's activation block.

mod common;
use common::rng::Rng;

use minfer::quants::*;

/// Relative budget (of `S = Σ|w_i a_i|`) of `vec_dot_row` against the f64 dot of the
/// dequantized rows, per weight type.
fn rel_budget(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-6,
        GgmlType::Q4_1 | GgmlType::Q5_1 => 1e-3,
        _ => 1e-5,
    }
}

/// Per-value bound on the activation quantization error, see the module docs.
fn act_error(act: GgmlType, x: &[f32]) -> Vec<f64> {
    let blockwise = |bs: usize, frac: f64| -> Vec<f64> {
        x.chunks(bs)
            .flat_map(|b| {
                let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                std::iter::repeat_n(frac * amax / 127.0, b.len())
            })
            .collect()
    };
    match act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => blockwise(32, 0.57),
        GgmlType::Q8K => blockwise(256, 0.51),
        GgmlType::F16 => x.iter().map(|v| v.abs() as f64 * 2f64.powi(-11)).collect(),
        GgmlType::BF16 => x.iter().map(|v| v.abs() as f64 * 2f64.powi(-8)).collect(),
        _ => vec![0.0; x.len()],
    }
}


/// Byte offsets of a block's f16 fields: (scale, min-or-offset).
fn f16_fields(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (0, None),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => (0, Some(2)),
        GgmlType::Q2K => (80, Some(82)),
        GgmlType::Q3K => (108, None),
        GgmlType::Q6K => (208, None),
        _ => unreachable!(),
    }
}

/// A random row of `n` values of weight type `ty`: random quant bits, scales of realistic size.
fn random_weights(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let put16 = |b: &mut [u8], v: f32| b.copy_from_slice(&F16Le::from_f32(v).0);
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (rng.normal() * 0.05).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| F16Le::from_f32(rng.normal() * 0.05).0)
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| Bf16Le::from_f32(rng.normal() * 0.05).0)
            .collect(),
        _ => {
            let ts = ty.type_size();
            let mut bytes: Vec<u8> = (0..n / ty.block_size() * ts)
                .map(|_| rng.next() as u8)
                .collect();
            let (d_at, m_at) = f16_fields(ty);
            let k_quant = ty.block_size() == 256;
            for b in bytes.chunks_mut(ts) {
                let mut d = 0.002 + rng.uniform() * 0.02;
                if ty == GgmlType::Q6K {
                    d *= 0.05; // int8 sub-scales
                } else if !k_quant && m_at.is_none() && rng.next().is_multiple_of(2) {
                    d = -d;
                }
                put16(&mut b[d_at..d_at + 2], d);
                if let Some(m_at) = m_at {
                    // K-quants subtract dmin * m (dmin > 0); Q4_1/Q5_1 add a negative m.
                    let m = if k_quant {
                        0.001 + rng.uniform() * 0.01
                    } else {
                        -(0.01 + rng.uniform() * 0.2)
                    };
                    put16(&mut b[m_at..m_at + 2], m);
                }
            }
            bytes
        }
    }
}

fn random_activations(n: usize, scale: f32, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = rng.normal() * scale;
            if rng.next().is_multiple_of(100) {
                v * 30.0
            } else {
                v
            }
        })
        .collect()
}

const WEIGHT_TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

/// Checks both budgets for one weight row and one activation row; returns the two relative
/// errors (of `S`) for reporting.
fn check(ty: GgmlType, w: &[u8], x: &[f32]) -> (f64, f64) {
    let act = ActRow::for_weight(ty, x).unwrap();
    let dot = vec_dot_row(ty, w, &act).unwrap() as f64;
    let mut wf = vec![0.0f32; x.len()];
    dequantize_row(ty, w, &mut wf).unwrap();
    let af = act.dequantize();
    let exact_q: f64 = wf.iter().zip(&af).map(|(&w, &a)| w as f64 * a as f64).sum();
    let s: f64 = wf
        .iter()
        .zip(&af)
        .map(|(&w, &a)| (w as f64 * a as f64).abs())
        .sum();
    let exact_x: f64 = wf.iter().zip(x).map(|(&w, &x)| w as f64 * x as f64).sum();
    let e = act_error(act.act_type(), x);
    let act_budget: f64 = wf.iter().zip(&e).map(|(&w, &e)| w.abs() as f64 * e).sum();

    let budget1 = rel_budget(ty) * s;
    let err1 = (dot - exact_q).abs();
    assert!(
        err1 <= budget1,
        "{ty}: vec_dot {dot} vs w·a {exact_q}: err {err1:e} > {budget1:e}"
    );
    let err2 = (dot - exact_x).abs();
    let budget2 = act_budget + budget1;
    assert!(
        err2 <= budget2,
        "{ty}: vec_dot {dot} vs w·x {exact_x}: err {err2:e} > {budget2:e}"
    );
    (
        err1 / s.max(f64::MIN_POSITIVE),
        err2 / s.max(f64::MIN_POSITIVE),
    )
}

#[test]
fn random_rows_within_budget() {
    let mut rng = Rng(0xC0FF_EE11);
    for ty in WEIGHT_TYPES {
        let (mut worst1, mut worst2) = (0.0f64, 0.0f64);
        for trial in 0..40 {
            let n = [256, 512, 1024, 4096][trial % 4];
            let scale = 10f32.powi((trial % 5) as i32 - 2);
            let w = random_weights(ty, n, &mut rng);
            let x = random_activations(n, scale, &mut rng);
            let (r1, r2) = check(ty, &w, &x);
            worst1 = worst1.max(r1);
            worst2 = worst2.max(r2);
        }
        println!(
            "{ty:>5}: worst |dot - w·a| / S = {worst1:.2e} (budget {:.0e}), worst |dot - w·x| / S = {worst2:.2e}",
            rel_budget(ty)
        );
    }
}

/// The real blocks of `tests/data/quant-blocks.jsonl` (32 per type), as one weight row per type.
#[test]
fn reference_blocks_within_budget() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/quant-blocks.jsonl"
    ))
    .unwrap();
    let mut rows: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let ty = weight_type("ref", v["ggml_type_id"].as_u64().unwrap() as u32).unwrap();
        let hex = v["block_bytes_hex"].as_str().unwrap();
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap());
        match rows.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, row)) => row.extend(bytes),
            None => rows.push((ty, bytes.collect())),
        }
    }
    assert_eq!(rows.len(), 12);
    let mut rng = Rng(42);
    for (ty, w) in rows {
        let n = w.len() / ty.type_size() * ty.block_size();
        for scale in [0.01, 1.0, 30.0] {
            let x = random_activations(n, scale, &mut rng);
            check(ty, &w, &x);
        }
    }
}

#[test]
fn dispatcher_rejects_mismatches() {
    let x = vec![0.5f32; 256];
    let q8k = ActRow::for_weight(GgmlType::Q4K, &x).unwrap();
    assert_eq!(q8k.act_type(), GgmlType::Q8K);
    let q8_0 = ActRow::for_weight(GgmlType::Q4_0, &x).unwrap();
    let w = vec![0u8; 144];
    assert!(vec_dot_row(GgmlType::Q4K, &w, &q8k).is_ok());
    assert_eq!(
        vec_dot_row(GgmlType::Q4K, &w, &q8_0),
        Err(QuantError::ActMismatch {
            weight: GgmlType::Q4K,
            expected: GgmlType::Q8K,
            got: GgmlType::Q8_0
        })
    );
    assert_eq!(
        vec_dot_row(GgmlType::Q4K, &w[..143], &q8k),
        Err(QuantError::BadLength {
            ty: GgmlType::Q4K,
            n: 256,
            got: 143,
            expected: 144
        })
    );
    assert_eq!(
        vec_dot_row(GgmlType::Q8K, &w, &q8k),
        Err(QuantError::NotWeightType { ty: GgmlType::Q8K })
    );
    // 256 Q8_0 activations against a Q4_0 row of 288 values' bytes.
    assert!(matches!(
        vec_dot_row(GgmlType::Q4_0, &[0u8; 18 * 9], &q8_0),
        Err(QuantError::BadLength { .. })
    ));
    // Typed entry point checks lengths too.
    let blocks = [BlockQ4_0::default(); 2];
    let acts = [BlockQ8_0::default(); 3];
    assert_eq!(
        vec_dot(&blocks, &acts),
        Err(QuantError::DotLength {
            ty: GgmlType::Q4_0,
            weights: 64,
            acts: 96
        })
    );
    assert_eq!(vec_dot(&blocks, &acts[..2]), Ok(0.0));
}
