//! The element-wise and row kernels against plain f64 references (budgets), plus their
//! error cases. (Bit-exactness against ggml itself is in `ops_ggml_oracle.rs`.)

mod common;

use minfer::quants::GgmlType;
use minfer::backends::cpu::kernels::{self, OpsError, RopeCache};

fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

#[test]
fn rms_norm_against_f64() {
    let d = 896;
    let eps = 1e-6f32;
    let x = rng(1, d * 4, 3.0);
    let w = rng(2, d, 2.0);
    let mut y = vec![0.0; x.len()];
    kernels::rms_norm(&x, Some(&w), d, eps, &mut y).unwrap();
    for (xr, yr) in x.chunks(d).zip(y.chunks(d)) {
        let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((xv, yv), wv) in xr.iter().zip(yr).zip(&w) {
            let want = *xv as f64 * inv * *wv as f64;
            // Rounded f32 squares, the f32 mean and rsqrt, then two products: a few ulp.
            assert!(
                (*yv as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * want.abs().max(1e-30),
                "{yv} vs {want}"
            );
        }
    }
}

#[test]
fn rms_norm_replicates_ggml_step_by_step() {
    // The formula of ggml_compute_forward_rms_norm_f32 then ggml_mul, written out for one row.
    let x = rng(3, 128, 5.0);
    let w = rng(4, 128, 1.0);
    let mut sum = 0.0f64;
    for v in &x {
        sum += (v * v) as f64;
    }
    let mean = (sum / 128.0) as f32;
    let scale = 1.0f32 / (mean + 1e-5f32).sqrt();
    let want: Vec<u32> = x
        .iter()
        .zip(&w)
        .map(|(v, wv)| ((v * scale) * wv).to_bits())
        .collect();
    let mut y = vec![0.0; 128];
    kernels::qk_norm(&x, &w, 128, 1e-5, &mut y).unwrap();
    assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    let mut inplace = x.clone();
    kernels::rms_norm_inplace(&mut inplace, Some(&w), 128, 1e-5).unwrap();
    assert_eq!(inplace, y);
}

#[test]
fn qk_norm_is_per_head() {
    // [2 tokens][3 heads * 4]: every head normalized on its own.
    let x = rng(5, 24, 4.0);
    let w = [1.0, 2.0, 0.5, -1.0];
    let mut y = vec![0.0; 24];
    kernels::qk_norm(&x, &w, 4, 1e-6, &mut y).unwrap();
    for (hx, hy) in x.chunks(4).zip(y.chunks(4)) {
        let mut one = [0.0; 4];
        kernels::rms_norm(hx, Some(&w), 4, 1e-6, &mut one).unwrap();
        assert_eq!(hy, one);
    }
}

#[test]
fn rope_against_f64_rotation() {
    let (hd, nh) = (128usize, 3usize);
    let base = 1_000_000.0f32;
    let positions = [0, 1, 2, 7, 31, 100, 511];
    let x = rng(6, positions.len() * nh * hd, 2.0);
    let mut y = x.clone();
    kernels::rope_neox(&mut y, &positions, nh, hd, base).unwrap();
    let half = hd / 2;
    for (t, &p) in positions.iter().enumerate() {
        // ggml's theta is an f32 running product: error up to ~(pairs + 1) ulp of theta.
        let budget = (p as f64 * (half as f64 + 2.0) * f32::EPSILON as f64
            + 4.0 * f32::EPSILON as f64)
            * 2.0
            * 2.0;
        for h in 0..nh {
            let xs = &x[(t * nh + h) * hd..][..hd];
            let ys = &y[(t * nh + h) * hd..][..hd];
            for i in 0..half {
                let theta = p as f64 * (base as f64).powf(-2.0 * i as f64 / hd as f64);
                let (s, c) = theta.sin_cos();
                let (x0, x1) = (xs[i] as f64, xs[i + half] as f64);
                let (w0, w1) = (x0 * c - x1 * s, x0 * s + x1 * c);
                assert!(
                    (ys[i] as f64 - w0).abs() <= budget,
                    "t {t} i {i}: {} vs {w0}",
                    ys[i]
                );
                assert!(
                    (ys[i + half] as f64 - w1).abs() <= budget,
                    "t {t} i {i}: {} vs {w1}",
                    ys[i + half]
                );
                // The rotation keeps the pair's norm.
                let (n0, n1) = (
                    (x0 * x0 + x1 * x1).sqrt(),
                    ((ys[i] as f64).powi(2) + (ys[i + half] as f64).powi(2)).sqrt(),
                );
                assert!(
                    (n0 - n1).abs() <= 4.0 * f32::EPSILON as f64 * n0.max(1e-30),
                    "norm {n0} -> {n1}"
                );
            }
        }
    }
}

#[test]
fn rope_cache_matches_per_call_and_is_batch_invariant() {
    let (hd, nh) = (64usize, 2usize);
    let positions = [3, 9, 4000];
    let x = rng(7, positions.len() * nh * hd, 1.0);
    let mut all = x.clone();
    kernels::rope_neox(&mut all, &positions, nh, hd, 1e4).unwrap();
    let cache = RopeCache::new(&positions, hd, 1e4).unwrap();
    assert_eq!(cache.n_tokens(), 3);
    let mut via_cache = x.clone();
    cache.apply(&mut via_cache, nh).unwrap();
    assert_eq!(all, via_cache);
    // One token at a time gives the same bits.
    for (t, &p) in positions.iter().enumerate() {
        let mut one = x[t * nh * hd..][..nh * hd].to_vec();
        kernels::rope_neox(&mut one, &[p], nh, hd, 1e4).unwrap();
        assert_eq!(one, all[t * nh * hd..][..nh * hd]);
    }
    assert!(matches!(
        cache.apply(&mut via_cache[..10], nh),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        RopeCache::new(&[0], 0, 1e4),
        Err(OpsError::BadDim { .. })
    ));
}

#[test]
fn swiglu_and_softmax_against_f64() {
    let (g, u) = (rng(8, 1000, 20.0), rng(9, 1000, 3.0));
    let mut y = vec![0.0; 1000];
    kernels::swiglu(&g, &u, 100, &mut y).unwrap();
    for ((gv, uv), yv) in g.iter().zip(&u).zip(&y) {
        let (gv, uv) = (*gv as f64, *uv as f64);
        let want = gv / (1.0 + (-gv).exp()) * uv;
        // The polynomial expf is within 2.5 ulp, then a division and a product.
        assert!(
            (*yv as f64 - want).abs() <= 5.0 * f32::EPSILON as f64 * want.abs().max(1e-6),
            "{yv} vs {want}"
        );
    }
    let x = rng(10, 300, 30.0);
    let mut p = vec![0.0; 300];
    kernels::soft_max_row(&x, 0.2, 250, &mut p).unwrap();
    let m = x[..250]
        .iter()
        .map(|v| *v as f64 * 0.2)
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = x[..250].iter().map(|v| (*v as f64 * 0.2 - m).exp()).sum();
    for (i, (xv, pv)) in x.iter().zip(&p).enumerate() {
        if i >= 250 {
            assert_eq!(pv.to_bits(), 0);
            continue;
        }
        let want = (*xv as f64 * 0.2 - m).exp() / z;
        assert!(
            (*pv as f64 - want).abs() <= 1e-6 * want + 1e-12,
            "{pv} vs {want}"
        );
    }
}

#[test]
fn get_rows_dequantizes_the_selected_rows() {
    // An F16 matrix of 3 rows of 4: row r holds r*4 + i.
    let data: Vec<u8> = (0..12)
        .flat_map(|v| half::f16::from_f32(v as f32).to_le_bytes())
        .collect();
    let mut out = vec![0.0; 8];
    kernels::get_rows(GgmlType::F16, &data, 4, &[2, 0], &mut out).unwrap();
    assert_eq!(out, [8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
    // F32 rows are copied.
    let f: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut one = [0.0; 1];
    kernels::get_rows(GgmlType::F32, &f, 1, &[1], &mut one).unwrap();
    assert_eq!(one, [-2.0]);
}

#[test]
fn get_rows_errors() {
    let data = vec![0u8; 24];
    let mut out = vec![0.0; 4];
    assert_eq!(
        kernels::get_rows(GgmlType::F16, &data, 4, &[3], &mut out),
        Err(OpsError::RowId {
            index: 0,
            id: 3,
            n_rows: 3
        })
    );
    assert_eq!(
        kernels::get_rows(GgmlType::F16, &data, 4, &[i32::MIN], &mut out),
        Err(OpsError::RowId {
            index: 0,
            id: i32::MIN,
            n_rows: 3
        })
    );
    assert!(matches!(
        kernels::get_rows(GgmlType::F16, &data, 5, &[0], &mut [0.0; 5]),
        Err(OpsError::Ragged { .. })
    ));
    assert!(matches!(
        kernels::get_rows(GgmlType::Q4K, &data, 4, &[0], &mut out),
        Err(OpsError::Ragged { .. })
    ));
    assert!(matches!(
        kernels::get_rows(GgmlType::F16, &data, 4, &[0, 1], &mut out),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::get_rows(GgmlType::F16, &data, 0, &[], &mut []),
        Err(OpsError::Ragged { .. })
    ));
    // Nothing selected is fine.
    kernels::get_rows(GgmlType::F16, &data, 4, &[], &mut []).unwrap();
    assert!(matches!(
        kernels::select_rows(&[0.0; 6], 3, &[-1], &mut [0.0; 3]),
        Err(OpsError::RowId { .. })
    ));
    assert!(matches!(
        kernels::select_rows(&[0.0; 6], 3, &[0], &mut [0.0; 2]),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::select_rows(&[0.0; 6], 0, &[0], &mut []),
        Err(OpsError::BadDim { .. })
    ));
}

#[test]
fn shape_errors_are_typed() {
    let mut out = vec![0.0; 6];
    assert!(matches!(
        kernels::rms_norm(&[1.0; 6], None, 4, 1e-6, &mut out),
        Err(OpsError::Ragged { .. })
    ));
    assert!(matches!(
        kernels::swiglu(&[1.0; 6], &[1.0; 5], 3, &mut out),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::soft_max(&[1.0; 6], 0, 1.0, &mut out),
        Err(OpsError::BadDim { .. })
    ));
    assert!(matches!(
        kernels::add_inplace(&mut out, &[]),
        Err(OpsError::BadDim { .. })
    ));
    assert!(matches!(
        kernels::rope_neox(&mut out, &[0], 1, 5, 1e4),
        Err(OpsError::BadDim { .. })
    ));
    let e = kernels::rms_norm(&[1.0; 6], Some(&[1.0; 2]), 3, 1e-6, &mut out).unwrap_err();
    assert_eq!(
        e,
        OpsError::Length {
            what: "rms_norm weight",
            expected: 3,
            got: 2
        }
    );
    assert_eq!(e.to_string(), "rms_norm weight: expected 3 values, got 2");
}
