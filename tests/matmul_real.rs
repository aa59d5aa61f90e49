//! `kernels::matmul` on real model weights: the first 2-D tensor of every type in the test models
//! (qwen2.5-coder-0.5b: Q4_K, Q5_0, Q6_K, Q8_0; qwen3-tiny: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16,
//! BF16; F32 from the 1-D norm weights as a one-row matrix), up to 160 rows of it.
//!
//! Checks, for every ISA this machine runs: every output within the budget of
//! `matmul_matmul.rs` of the dequantize-then-f64 reference, within `4e-6 * S` of the scalar ISA
//! (`matmul_dots.rs`), a batch of 4 tokens bit-identical to 4 single tokens, and 1 and 2 threads
//! bit-identical. The models come from `$MINFER_MODEL_DIR` or `<repo>/models`; a missing model
//! fails the test (run `scripts/fetch_models.sh`).

mod common;

use minfer::gguf::GgufFile;
use minfer::quants::simd::{Isa, supported_isas};
use minfer::quants::*;
use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul_with_isa};

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, activations, magnitude};

const MAX_ROWS: usize = 160;

/// `(name, ty, rows, cols, bytes)` of the first tensor of each type wanted, `rows` capped.
fn pick(file: &GgufFile, types: &[GgmlType]) -> Vec<(String, GgmlType, usize, usize, Vec<u8>)> {
    let mut picked = Vec::new();
    for &ty in types {
        let t = file
            .tensors()
            .iter()
            .find(|t| {
                t.ty == Some(ty) && (t.dims.len() == 2 || ty == GgmlType::F32 && t.dims.len() == 1)
            })
            .unwrap_or_else(|| panic!("no {ty} tensor in {:?}", file.path()));
        let cols = t.dims[0] as usize;
        let rows = t.dims.get(1).map_or(1, |&r| r as usize).min(MAX_ROWS);
        let data = file.tensor_data(t).expect("tensor data");
        let row_bytes = cols / ty.block_size() * ty.type_size();
        picked.push((
            t.name.clone(),
            ty,
            rows,
            cols,
            data[..rows * row_bytes].to_vec(),
        ));
    }
    picked
}

fn run(pool: &Pool, w: &WeightMatrix, x: &[f32], isa: Isa) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.len() / w.cols * w.rows];
    matmul_with_isa(pool, w, x, None, &mut out, isa).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_model(model: &str, types: &[GgmlType]) {
    let file = GgufFile::open(common::model_path(model)).expect("open model");
    let (one, two) = (Pool::new(1).unwrap(), Pool::new(2).unwrap());
    let mut rng = Rng(0x7e57_0001);
    for (name, ty, rows, cols, data) in pick(&file, types) {
        let w = WeightMatrix {
            packed: None,
            ty,
            data: &data,
            rows,
            cols,
        };
        let nt = 4;
        let x: Vec<f32> = (0..nt).flat_map(|_| activations(&mut rng, cols)).collect();
        let scalar = run(&two, &w, &x, Isa::Scalar);
        let row_bytes = w.row_bytes();
        let mut worst_vs_scalar = 0.0f64;
        for isa in supported_isas() {
            let out = run(&two, &w, &x, isa);
            assert_eq!(
                bits(&out),
                bits(&run(&one, &w, &x, isa)),
                "{name} {isa}: threads"
            );
            let single: Vec<u32> = x
                .chunks(cols)
                .flat_map(|xt| bits(&run(&one, &w, xt, isa)))
                .collect();
            assert_eq!(
                bits(&out),
                single,
                "{name} {isa}: batch of {nt} vs single tokens"
            );
            for (t, xt) in x.chunks(cols).enumerate() {
                let act = ActRow::for_weight(ty, xt).unwrap();
                for r in 0..rows {
                    let wr = &data[r * row_bytes..(r + 1) * row_bytes];
                    let s = magnitude(ty, wr, &act);
                    let got = out[t * rows + r];
                    let err = f64::from((got - scalar[t * rows + r]).abs());
                    assert!(
                        err <= 4e-6 * s,
                        "{name} {isa} t {t} r {r}: {got} vs scalar (S {s:e})"
                    );
                    if s > 0.0 {
                        worst_vs_scalar = worst_vs_scalar.max(err / s);
                    }
                    let mut wf = vec![0.0f32; cols];
                    dequantize_row(ty, wr, &mut wf).unwrap();
                    let reference: f64 = wf
                        .iter()
                        .zip(xt)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let qerr = quant_error(ty, &wf, xt);
                    let rel = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                        1e-3
                    } else {
                        1e-5
                    };
                    let budget = qerr + rel * s;
                    let err = (f64::from(got) - reference).abs();
                    assert!(
                        err <= budget,
                        "{name} {isa} t {t} r {r}: {got} vs f64 {reference} ({budget:e})"
                    );
                }
            }
        }
        println!(
            "{model}: {name} ({ty}, {rows}x{cols}): worst |isa - scalar| / S = {worst_vs_scalar:.1e}"
        );
    }
}

/// `Σ |w_i| e_i` with the per-value activation quantization bounds of `matmul_matmul.rs`.
fn quant_error(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let (bs, frac) = match vec_dot_type(ty).unwrap() {
        GgmlType::Q8_0 | GgmlType::Q8_1 => (32, 0.57),
        GgmlType::Q8K => (256, 0.51),
        GgmlType::F16 => (1, -(2f64.powi(-11))),
        GgmlType::BF16 => (1, -(2f64.powi(-8))),
        _ => return 0.0,
    };
    w.chunks(bs)
        .zip(x.chunks(bs))
        .map(|(w, x)| {
            let per_value = |xi: f32| {
                if frac < 0.0 {
                    -frac * f64::from(xi.abs())
                } else {
                    frac * f64::from(x.iter().fold(0.0f32, |m, v| m.max(v.abs()))) / 127.0
                }
            };
            w.iter()
                .zip(x)
                .map(|(&w, &xi)| f64::from(w.abs()) * per_value(xi))
                .sum::<f64>()
        })
        .sum()
}

#[test]
fn qwen25_05b_weights() {
    use GgmlType::*;
    check_model(common::QWEN2_05B, &[Q4K, Q5_0, Q6K, Q8_0, F32]);
}

#[test]
fn qwen3_tiny_weights() {
    use GgmlType::*;
    check_model(
        common::QWEN3_TINY,
        &[Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16],
    );
}
