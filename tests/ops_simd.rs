//! Every SIMD kernel of `vec_ops` against its scalar twin, bit for bit, on random data and on
//! the special values where the polynomial `expf` changes path; and the environment levers
//! that force a lower instruction set.

mod common;

use minfer::backends::cpu::kernels::{self, AttnArgs, Isa, Pool};

fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

/// Bit patterns, with every NaN folded into one (NaN payloads are not part of the contract).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() })
        .collect()
}

/// Values around every branch of `ggml_v_expf` and `silu`: zeros, infinities, subnormals, the
/// overflow and underflow edges, the `|n| > 126` (subnormal or huge result) and `|n| > 192`
/// (saturated) thresholds, and NaN.
fn specials() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
        1e-30,
        -1e-30,
    ];
    for edge in [
        88.72,
        -87.33,
        -103.97,
        126.0 * std::f32::consts::LN_2,
        133.08,
        192.5 * std::f32::consts::LN_2,
    ] {
        for d in [-0.02f32, -0.001, 0.0, 0.001, 0.02] {
            v.push(edge + d);
            v.push(-(edge + d));
        }
    }
    // Every 0.25 from -140 to 140.
    v.extend((-560..=560).map(|i| i as f32 * 0.25));
    v
}

fn others() -> Vec<Isa> {
    Isa::supported()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect()
}

#[test]
fn expf_row() {
    for x in [specials(), rng(1, 4099, 150.0), rng(2, 333, 3.0)] {
        let mut want = vec![0.0; x.len()];
        kernels::expf::expf_row_with(Isa::Scalar, &x, &mut want);
        for isa in others() {
            let mut got = vec![0.0; x.len()];
            kernels::expf::expf_row_with(isa, &x, &mut got);
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
        }
    }
}

#[test]
fn silu_and_swiglu() {
    let sp = specials();
    let n = sp.len();
    for (x, d) in [
        (sp.clone(), n),
        (rng(3, 4864 * 2, 40.0), 4864),
        (rng(4, 100 * 7, 15.0), 100),
    ] {
        let up = rng(5, x.len(), 4.0);
        let mut want = vec![0.0; x.len()];
        let mut want_sw = vec![0.0; x.len()];
        kernels::silu_with(Isa::Scalar, &x, d, &mut want).unwrap();
        kernels::swiglu_with(Isa::Scalar, &x, &up, d, &mut want_sw).unwrap();
        for isa in others() {
            let mut got = vec![0.0; x.len()];
            kernels::silu_with(isa, &x, d, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "silu {isa:?} d {d}");
            kernels::swiglu_with(isa, &x, &up, d, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want_sw), "swiglu {isa:?} d {d}");
        }
    }
}

#[test]
fn swiglu_matches_silu_then_mul() {
    for isa in Isa::supported() {
        for d in [3, 16, 40, 4864] {
            let (g, u) = (rng(6, d * 3, 30.0), rng(7, d * 3, 2.0));
            let mut fused = vec![0.0; d * 3];
            kernels::swiglu_with(isa, &g, &u, d, &mut fused).unwrap();
            let mut s = vec![0.0; d * 3];
            kernels::silu_with(isa, &g, d, &mut s).unwrap();
            let mut prod = vec![0.0; d * 3];
            kernels::mul(&s, &u, &mut prod).unwrap();
            assert_eq!(bits(&fused), bits(&prod), "{isa:?} d {d}");
        }
    }
}

#[test]
fn soft_max_rows() {
    for (d, scale) in [
        (1usize, 1.0f32),
        (16, 0.5),
        (255, 0.125),
        (256, 0.088),
        (1000, 1.0),
    ] {
        let x = rng(d as u32, d * 3, 40.0);
        let mut want = vec![0.0; d * 3];
        kernels::soft_max_with(Isa::Scalar, &x, d, scale, &mut want).unwrap();
        let mut want_c = vec![0.0; d];
        kernels::soft_max_row_with(Isa::Scalar, &x[..d], scale, d.div_ceil(3), &mut want_c)
            .unwrap();
        for isa in others() {
            let mut got = vec![0.0; d * 3];
            kernels::soft_max_with(isa, &x, d, scale, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "{isa:?} d {d}");
            let mut got_c = vec![0.0; d];
            kernels::soft_max_row_with(isa, &x[..d], scale, d.div_ceil(3), &mut got_c).unwrap();
            assert_eq!(bits(&got_c), bits(&want_c), "causal {isa:?} d {d}");
        }
    }
    // Huge spreads: most entries underflow to exactly 0, one dominates.
    let mut x = rng(9, 64, 1000.0);
    x[17] = 5000.0;
    let mut want = vec![0.0; 64];
    kernels::soft_max_with(Isa::Scalar, &x, 64, 1.0, &mut want).unwrap();
    assert_eq!(want[17], 1.0);
    for isa in others() {
        let mut got = vec![0.0; 64];
        kernels::soft_max_with(isa, &x, 64, 1.0, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "{isa:?}");
    }
}

#[test]
fn dot() {
    for n in [
        0usize, 1, 7, 8, 9, 16, 24, 63, 64, 65, 72, 100, 128, 191, 256, 1000, 4097,
    ] {
        let (x, y) = (rng(10 + n as u32, n, 3.0), rng(20 + n as u32, n, 3.0));
        let want = kernels::dot_f32_with(Isa::Scalar, &x, &y);
        for isa in others() {
            assert_eq!(
                kernels::dot_f32_with(isa, &x, &y).to_bits(),
                want.to_bits(),
                "{isa:?} n {n}"
            );
        }
    }
}

/// Attention arguments without a window, `(head_dim, n_head, n_head_kv)` given.
fn attn_args<'a>(
    q: &'a [f32],
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    positions: &'a [i32],
    (head_dim, n_head, n_head_kv): (usize, usize, usize),
) -> AttnArgs<'a> {
    AttnArgs {
        q,
        k_cache,
        v_cache,
        positions,
        n_head,
        n_head_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
    }
}

#[test]
fn attention() {
    let pool = Pool::new(2).unwrap();
    // (head_dim, n_head, n_head_kv): Qwen2.5-0.5B's, Qwen3's, and an odd size with leftovers.
    for (hd, nh, nkv) in [(64usize, 14usize, 2usize), (128, 4, 2), (40, 3, 1)] {
        let n_ctx = 150;
        let w = nkv * hd;
        let (kc, vc) = (rng(30, n_ctx * w, 2.0), rng(31, n_ctx * w, 2.0));
        let positions = [0, 1, 15, 16, 63, 64, 65, 127, 149];
        let q = rng(32, positions.len() * nh * hd, 2.0);
        let args = attn_args(&q, &kc, &vc, &positions, (hd, nh, nkv));
        let mut want = vec![0.0; q.len()];
        kernels::attention_with(Isa::Scalar, &pool, &args, &mut want).unwrap();
        for isa in others() {
            let mut got = vec![0.0; q.len()];
            kernels::attention_with(isa, &pool, &args, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "{isa:?} hd {hd}");
        }
    }
}

/// A prefill of 100 tokens at depth 600 runs in tiles of several queries sharing each K and V
/// chunk; every query still gets the scalar kernels' bits, for any thread count.
#[test]
fn attention_tiles_at_depth() {
    for (hd, nh, nkv) in [(64usize, 14usize, 2usize), (128, 16, 8), (80, 4, 2)] {
        let n_ctx = 700;
        let w = nkv * hd;
        let (kc, vc) = (rng(40, n_ctx * w, 2.0), rng(41, n_ctx * w, 2.0));
        let positions: Vec<i32> = (600..700).collect();
        let q = rng(42, positions.len() * nh * hd, 2.0);
        let args = attn_args(&q, &kc, &vc, &positions, (hd, nh, nkv));
        let mut want = vec![0.0; q.len()];
        kernels::attention_with(Isa::Scalar, &Pool::new(1).unwrap(), &args, &mut want).unwrap();
        // The last token alone (a decode step) is the last row of the prefill.
        let last = AttnArgs { q: &q[q.len() - nh * hd..], positions: &positions[99..], ..args };
        let mut one = vec![0.0; nh * hd];
        kernels::attention_with(Isa::Scalar, &Pool::new(2).unwrap(), &last, &mut one).unwrap();
        assert_eq!(bits(&one), bits(&want[q.len() - nh * hd..]), "decode vs prefill hd {hd}");
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads).unwrap();
            for isa in std::iter::once(Isa::Scalar).chain(others()) {
                let mut got = vec![0.0; q.len()];
                kernels::attention_with(isa, &pool, &args, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&want), "{isa:?} hd {hd} threads {threads}");
            }
        }
    }
}

/// Prints the detected instruction set; run by `env_levers_force_lower_paths` in a child
/// process with the levers set.
#[test]
#[ignore = "helper for env_levers_force_lower_paths"]
fn report_detected_isa() {
    println!("DETECTED_ISA={}", Isa::detected().name());
}

#[test]
fn env_levers_force_lower_paths() {
    let detected_with = |vars: &[(&str, &str)]| -> String {
        let mut cmd = common::rerun_self();
        cmd.args([
            "--ignored",
            "--exact",
            "report_detected_isa",
            "--nocapture",
            "--test-threads=1",
        ]);
        cmd.env_remove("MINFER_NO_AVX2")
            .env_remove("MINFER_NO_AVX512")
            .env_remove("MINFER_NO_NEON");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let found = text
            .split("DETECTED_ISA=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next());
        found
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no report in {text}"))
    };
    let best = Isa::supported().into_iter().max().unwrap_or(Isa::Scalar);
    assert_eq!(detected_with(&[]), best.name());
    if cfg!(target_arch = "aarch64") {
        assert_eq!(detected_with(&[("MINFER_NO_NEON", "1")]), "scalar");
        assert_eq!(detected_with(&[("MINFER_NO_AVX2", "1")]), best.name());
        return;
    }
    assert_eq!(detected_with(&[("MINFER_NO_AVX2", "1")]), "scalar");
    let no512 = if Isa::Avx2.is_supported() {
        "avx2"
    } else {
        "scalar"
    };
    assert_eq!(detected_with(&[("MINFER_NO_AVX512", "1")]), no512);
    assert_eq!(detected_with(&[("MINFER_NO_AVX512", "0")]), best.name());
}
