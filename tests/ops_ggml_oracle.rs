//! minfer's kernels against ggml's own: bit-exact on llama.cpp's AVX-512 build.
//!
//! The expected values are FNV-1a hashes of the f32 bit patterns that ggml (the llama.cpp of
//! `llama-cpp-python==0.3.36`, built as its CMake does: GCC 12, `-O3 -march=native`,
//! `-std=gnu++17`, hence `-ffp-contract=fast`, LLAMAFILE on, on an AVX-512 machine) computes on
//! the deterministic inputs below, printed by `tests/ops_ggml_oracle_driver.cpp` (its header
//! says how to build and rerun it). Each case is checked with every instruction set this CPU
//! has (all must give these bits).
//!
//! With `MINFER_OPS_ORACLE_FULL=/path/full.txt` (the driver's full dump) a failing case also
//! names its first differing value.

mod common;

use minfer::backends::cpu::kernels::{self, AttnArgs, Isa, Pool, RopeCache};

/// The driver's input generator: xorshift32, uniform in [-scale, scale).
fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

fn fnv(y: &[f32]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for v in y {
        for b in v.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The driver's output: (case, count, hash).
const EXPECTED: &[(&str, usize, u64)] = &[
    ("expf", 4112, 0x0a4352a71d68bfe1),
    ("silu_1003", 1003, 0x253f0f4fd352a455),
    ("swiglu_1003", 1003, 0x58b98f7ca6dd567d),
    ("dot_1", 1, 0xafcc0d18e169dc80),
    ("dot_15", 1, 0x353f73ae337b4730),
    ("dot_64", 1, 0xe4ab15fd5b945b8d),
    ("dot_70", 1, 0xdb7d16e8b720dd72),
    ("dot_128", 1, 0xa4ba164b6aa2b254),
    ("dot_200", 1, 0x630403e1af9398bd),
    ("dot_1000", 1, 0xf346c8ef948e944a),
    ("rms_norm", 2688, 0xe2c13e8633e25b14),
    ("rms_norm_noweight", 2688, 0xf88033c4430ded7b),
    ("qk_norm", 1536, 0x058cede6f7be751f),
    ("rope_64", 768, 0xe6abef30c4ff398f),
    ("rope_128", 512, 0x43371241c4c1c408),
    ("rope_128_b1e4", 512, 0x8fa46e83da6136db),
    ("softmax_300", 900, 0x4bbf61a8898fc4a7),
    ("softmax_causal_256", 1024, 0x9d7d264a61766e76),
    ("attn_64_pos0", 256, 0xdb7d0e9c9e32924d),
    ("attn_64_pos5", 256, 0x2f64e9b3deedb1c7),
    ("attn_64_pos15", 256, 0x8e3338be19e97a5c),
    ("attn_64_pos16", 256, 0x6bb3ec44acdf8be0),
    ("attn_64_pos63", 256, 0x8e2b3709f7e66c2e),
    ("attn_64_pos64", 256, 0x1f8e138d571720f2),
    ("attn_64_pos100", 256, 0x170cfbb6fc5c9377),
    ("attn_64_pos255", 256, 0xd41e01a06a550574),
    ("attn_128_pos0", 256, 0xc299354138518355),
    ("attn_128_pos37", 256, 0x32619c956e7837f1),
    ("attn_128_pos200", 256, 0xf1ac6887822cd41c),
];

/// minfer's outputs for every case, computed with `isa`.
fn compute(isa: Isa) -> Vec<(String, Vec<f32>)> {
    let mut out: Vec<(String, Vec<f32>)> = Vec::new();
    let mut push = |name: &str, v: Vec<f32>| out.push((name.to_string(), v));

    // ggml_v_expf, lane by lane.
    let mut x = rng(11, 4096, 110.0);
    x.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        88.7,
        88.8,
        -103.9,
        -104.0,
        89.0,
        -87.3,
        -150.0,
        1e-30,
        -1e-30,
        126.5,
        -130.0,
        0.5,
    ]);
    let mut y = vec![0.0; x.len()];
    kernels::expf::expf_row_with(isa, &x, &mut y);
    push("expf", y);

    let x = rng(12, 1003, 20.0);
    let mut y = vec![0.0; 1003];
    kernels::silu_with(isa, &x, 1003, &mut y).unwrap();
    push("silu_1003", y.clone());
    let (g, u) = (rng(13, 1003, 20.0), rng(14, 1003, 5.0));
    kernels::swiglu_with(isa, &g, &u, 1003, &mut y).unwrap();
    push("swiglu_1003", y);

    for n in [1usize, 15, 64, 70, 128, 200, 1000] {
        let (a, b) = (rng(20 + n as u32, n, 1.0), rng(40 + n as u32, n, 1.0));
        push(
            &format!("dot_{n}"),
            vec![kernels::dot_f32_with(isa, &a, &b)],
        );
    }

    let x = rng(50, 896 * 3, 2.0);
    let w = rng(51, 896, 1.0);
    let mut y = vec![0.0; 896 * 3];
    kernels::rms_norm(&x, Some(&w), 896, 1e-6, &mut y).unwrap();
    push("rms_norm", y.clone());
    kernels::rms_norm(&x, None, 896, 1e-6, &mut y).unwrap();
    push("rms_norm_noweight", y);
    let mut q = rng(52, 128 * 4 * 3, 3.0);
    kernels::qk_norm_inplace(&mut q, &rng(53, 128, 1.5), 128, 1e-6).unwrap();
    push("qk_norm", q);

    for (name, seed, hd, nh, pos, base) in [
        ("rope_64", 60, 64, 3, vec![0, 1, 17, 1000], 1e6f32),
        ("rope_128", 61, 128, 2, vec![5, 123456], 1e6),
        ("rope_128_b1e4", 62, 128, 2, vec![3, 4095], 1e4),
    ] {
        let mut x = rng(seed, hd * nh * pos.len(), 2.0);
        RopeCache::new(&pos, hd, base)
            .unwrap()
            .apply(&mut x, nh)
            .unwrap();
        push(name, x);
    }

    let a = rng(80, 900, 30.0);
    let mut y = vec![0.0; 900];
    kernels::soft_max_with(isa, &a, 300, 0.3, &mut y).unwrap();
    push("softmax_300", y);
    let b = rng(81, 1024, 30.0);
    let mut y = vec![0.0; 1024];
    for (r, n_valid) in [1, 17, 100, 256].into_iter().enumerate() {
        let row = r * 256..(r + 1) * 256;
        kernels::soft_max_row_with(isa, &b[row.clone()], 0.125, n_valid, &mut y[row]).unwrap();
    }
    push("softmax_causal_256", y);

    let pool = Pool::new(2).unwrap();
    for (hd, nh, nkv, positions) in [
        (
            64usize,
            4usize,
            2usize,
            vec![0, 5, 15, 16, 63, 64, 100, 255],
        ),
        (128, 2, 1, vec![0, 37, 200]),
    ] {
        let w = nkv * hd;
        let (kc, vc) = (
            rng(71 + hd as u32, 256 * w, 1.0),
            rng(72 + hd as u32, 256 * w, 1.0),
        );
        for p in positions {
            let q = rng(90 + p as u32, nh * hd, 1.0);
            let mut out = vec![0.0; nh * hd];
            let args = AttnArgs {
                q: &q,
                k_cache: &kc,
                v_cache: &vc,
                positions: &[p],
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window: None,
            };
            kernels::attention_with(isa, &pool, &args, &mut out).unwrap();
            push(&format!("attn_{hd}_pos{p}"), out);
        }
    }
    out
}

fn first_difference(name: &str, got: &[f32]) -> String {
    let Ok(path) = std::env::var("MINFER_OPS_ORACLE_FULL") else {
        return String::new();
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return format!(" (cannot read {path})");
    };
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some(name) {
            continue;
        }
        for (i, (hex, g)) in it.zip(got).enumerate() {
            let want = u32::from_str_radix(hex, 16).unwrap_or(0);
            if want != g.to_bits() {
                return format!(
                    " (first difference at {i}: ggml {} = {want:08x}, minfer {g} = {:08x})",
                    f32::from_bits(want),
                    g.to_bits()
                );
            }
        }
    }
    String::new()
}

#[test]
fn kernels_match_ggml_avx512_build_bitwise() {
    let mut failures = Vec::new();
    for isa in Isa::supported() {
        let got = compute(isa);
        assert_eq!(got.len(), EXPECTED.len());
        for ((name, y), &(want_name, n, hash)) in got.iter().zip(EXPECTED) {
            assert_eq!(name, want_name);
            assert_eq!(y.len(), n, "{name}");
            if fnv(y) != hash {
                failures.push(format!(
                    "{}: {name}{}",
                    isa.name(),
                    first_difference(name, y)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "differ from ggml:\n{}",
        failures.join("\n")
    );
}
