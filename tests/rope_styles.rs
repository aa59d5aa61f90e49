//! `rope_ext`'s two layouts (normal / NeoX) and partial rotation (`n_rot < head_dim`) against an
//! independent f64 rotation, plus the bitwise properties: the unrotated tail is copied bit for
//! bit, NeoX over whole heads is `rope_neox`, and ggml's own bits on a few cases.
//!
//! # Tolerance
//!
//! The reference computes `theta_i = p * base^(-2i/n_rot)`, its cos/sin and the rotation in
//! f64. The kernel, as ggml, forms `theta_i` in f32 as a running product `p * ts * ts * ...`
//! with `ts = powf(base, -2.0f/n_rot)`, so its angle is off by up to
//! `|dtheta_i| <= i * theta_i * e`, `e = 3u + |ln ts| * u` per step (`u = 2^-24`: one rounding
//! of the product, up to one ulp = 2u of `powf`, and the rounding of `-2/n_rot` in the exponent,
//! which `ts` amplifies by `|ln ts|`). A pair of norm `r` turned by a wrong angle moves by at
//! most `r * |dtheta|`; on top come `cosf`/`sinf` (one ulp each) and the two roundings of the
//! fused rotation, under `6u * r` together. The bound used, with a factor 2 of margin, is
//!
//! ```text
//! |y - y_ref| <= 2 * r * (i * theta_i * e + 6u) + 1e-30
//! ```
//!
//! for every rotated value (`r = hypot(x0, x1)` of its pair). It is absolute in the angle, so it
//! grows with the position: the f32 `theta` itself has only 24 bits (at p = 1000, `theta_1` is
//! ~562 and its ulp 6e-5; at p = 32767 it is ~18000 with ulp 2e-3), and any f32 RoPE that
//! follows ggml is that far from the exact rotation. For p <= 1 it is a few ulps of `r`. So a
//! flat `2e-6 * (1 + |x|)` holds only for small positions; the test prints the worst observed
//! error per position next to the bound. The tests below also show that the bound rejects the
//! plausible mistakes (theta scale from `head_dim` instead of `n_rot`, position off by one, the
//! other layout).

mod common;

use minfer::backends::cpu::kernels::{self, OpsError, RopeCache, RopeMode, RopeSpec};

const U: f64 = 1.0 / (1u64 << 24) as f64;
const POSITIONS: [i32; 5] = [0, 1, 7, 1000, 32767];

fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The indices of rotated pair `i` of a head.
fn pair(mode: RopeMode, n_rot: usize, i: usize) -> (usize, usize) {
    match mode {
        RopeMode::Normal => (2 * i, 2 * i + 1),
        RopeMode::Neox => (i, i + n_rot / 2),
    }
}

/// One rotated value's expected value (f64) and bound, for pair `i` of a head at position `p`;
/// `theta_dims` is the `n_dims` of the frequency formula (`n_rot` for the right one).
struct Ref {
    want: [f64; 2],
    bound: f64,
}

fn reference(x0: f32, x1: f32, p: i32, i: usize, theta_dims: usize, base: f32) -> Ref {
    let base = base as f64;
    let (x0, x1) = (x0 as f64, x1 as f64);
    let theta = p as f64 * base.powf(-2.0 * i as f64 / theta_dims as f64);
    let (s, c) = theta.sin_cos();
    let r = x0.hypot(x1);
    let ln_ts = 2.0 * base.ln() / theta_dims as f64;
    let e = 3.0 * U + ln_ts * U;
    Ref {
        want: [x0 * c - x1 * s, x0 * s + x1 * c],
        bound: 2.0 * r * (i as f64 * theta.abs() * e + 6.0 * U) + 1e-30,
    }
}

/// Worst `|y - ref| / bound` over the rotated values of `y` (kernel output for input `x`), with
/// the reference built for `ref_mode`, `ref_positions` and frequency dims `theta_dims`. Also
/// returns the worst `|y - ref|` per token.
fn worst(
    x: &[f32],
    y: &[f32],
    spec: &RopeSpec,
    ref_mode: RopeMode,
    ref_positions: &[i32],
    theta_dims: usize,
) -> (f64, Vec<f64>) {
    let (hd, nr) = (spec.head_dim, spec.n_rot);
    let mut ratio = 0.0f64;
    let mut per_token = vec![0.0f64; ref_positions.len()];
    for (t, &p) in ref_positions.iter().enumerate() {
        for h in 0..spec.n_head {
            let off = (t * spec.n_head + h) * hd;
            let (xs, ys) = (&x[off..off + hd], &y[off..off + hd]);
            for i in 0..nr / 2 {
                let (a, b) = pair(ref_mode, nr, i);
                let r = reference(xs[a], xs[b], p, i, theta_dims, spec.freq_base);
                for (k, idx) in [a, b].into_iter().enumerate() {
                    let d = (ys[idx] as f64 - r.want[k]).abs();
                    per_token[t] = per_token[t].max(d);
                    ratio = ratio.max(d / r.bound);
                }
            }
        }
    }
    (ratio, per_token)
}

fn specs() -> Vec<RopeSpec> {
    let mut v = Vec::new();
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for head_dim in [64usize, 128] {
            for n_rot in [head_dim, head_dim / 2, head_dim / 4] {
                for n_head in 1..=4 {
                    for freq_base in [1e4f32, 1e6] {
                        v.push(RopeSpec {
                            mode,
                            n_head,
                            head_dim,
                            n_rot,
                            freq_base,
                        });
                    }
                }
            }
        }
    }
    v
}

#[test]
fn styles_against_f64_and_tail_copied() {
    // Worst |error| per position over all cases, and worst error/bound.
    let mut per_pos = [0.0f64; POSITIONS.len()];
    let mut worst_ratio = 0.0f64;
    for (k, spec) in specs().iter().enumerate() {
        let n = POSITIONS.len() * spec.n_head * spec.head_dim;
        let x = rng(200 + k as u32, n, 3.0);
        let mut y = x.clone();
        kernels::rope_ext(&mut y, &POSITIONS, spec).unwrap();
        let (ratio, tok) = worst(&x, &y, spec, spec.mode, &POSITIONS, spec.n_rot);
        assert!(ratio <= 1.0, "{spec:?}: error {ratio} x the bound");
        worst_ratio = worst_ratio.max(ratio);
        for (w, t) in per_pos.iter_mut().zip(tok) {
            *w = w.max(t);
        }
        // Dims n_rot..head_dim of every head: the input's bits.
        for (hx, hy) in x.chunks(spec.head_dim).zip(y.chunks(spec.head_dim)) {
            assert_eq!(bits(&hx[spec.n_rot..]), bits(&hy[spec.n_rot..]), "{spec:?}");
        }
        // Position 0 is the identity (cos 1, sin 0, exact).
        assert_eq!(
            bits(&x[..spec.n_head * spec.head_dim]),
            bits(&y[..spec.n_head * spec.head_dim]),
            "{spec:?}"
        );
    }
    for (p, w) in POSITIONS.iter().zip(per_pos) {
        eprintln!("position {p:5}: worst |y - f64| = {w:.3e} (|x| < 3)");
    }
    eprintln!("worst error / bound = {worst_ratio:.3}");
}

#[test]
fn tail_keeps_any_bits() {
    // NaN payloads, infinities, signed zeros and subnormals past n_rot come through untouched.
    let specials = [
        f32::from_bits(0x7fc0_1234),
        f32::from_bits(0xffa0_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        f32::from_bits(1),
        -f32::MIN_POSITIVE / 3.0,
    ];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let spec = RopeSpec {
            mode,
            n_head: 3,
            head_dim: 64,
            n_rot: 16,
            freq_base: 1e4,
        };
        let mut x = rng(7, POSITIONS.len() * 3 * 64, 2.0);
        for head in x.chunks_mut(64) {
            for (j, v) in head[16..].iter_mut().enumerate() {
                if j % 3 == 0 {
                    *v = specials[j % specials.len()];
                }
            }
        }
        let mut y = x.clone();
        kernels::rope_ext(&mut y, &POSITIONS, &spec).unwrap();
        for (hx, hy) in x.chunks(64).zip(y.chunks(64)) {
            assert_eq!(bits(&hx[16..]), bits(&hy[16..]));
            assert!(hy[..16].iter().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn neox_full_is_rope_neox_bitwise() {
    for (seed, hd, nh, base) in [
        (1u32, 64usize, 1usize, 1e4f32),
        (2, 64, 3, 1e6),
        (3, 128, 4, 1e6),
        (4, 128, 2, 5e5),
    ] {
        let x = rng(seed, POSITIONS.len() * nh * hd, 2.0);
        let mut a = x.clone();
        let mut b = x.clone();
        let mut c = x.clone();
        kernels::rope_neox(&mut a, &POSITIONS, nh, hd, base).unwrap();
        let spec = RopeSpec {
            mode: RopeMode::Neox,
            n_head: nh,
            head_dim: hd,
            n_rot: hd,
            freq_base: base,
        };
        kernels::rope_ext(&mut b, &POSITIONS, &spec).unwrap();
        RopeCache::new(&POSITIONS, hd, base)
            .unwrap()
            .apply(&mut c, nh)
            .unwrap();
        assert_eq!(bits(&a), bits(&b));
        assert_eq!(bits(&a), bits(&c));
        assert_ne!(bits(&a), bits(&x));
    }
}

#[test]
fn layouts_differ_and_the_bound_rejects_mistakes() {
    for (hd, nr) in [(64usize, 64usize), (128, 64), (128, 32)] {
        let x = rng(9, POSITIONS.len() * 2 * hd, 2.0);
        let spec = |mode| RopeSpec {
            mode,
            n_head: 2,
            head_dim: hd,
            n_rot: nr,
            freq_base: 1e4,
        };
        let (mut yn, mut yx) = (x.clone(), x.clone());
        kernels::rope_ext(&mut yn, &POSITIONS, &spec(RopeMode::Normal)).unwrap();
        kernels::rope_ext(&mut yx, &POSITIONS, &spec(RopeMode::Neox)).unwrap();
        assert_ne!(bits(&yn), bits(&yx), "hd {hd} n_rot {nr}");
        // Each output is within the bound of its own layout's reference only.
        let s = spec(RopeMode::Normal);
        assert!(worst(&x, &yn, &s, RopeMode::Normal, &POSITIONS, nr).0 <= 1.0);
        assert!(worst(&x, &yn, &s, RopeMode::Neox, &POSITIONS, nr).0 > 1e3);
        let s = spec(RopeMode::Neox);
        assert!(worst(&x, &yx, &s, RopeMode::Neox, &POSITIONS, nr).0 <= 1.0);
        assert!(worst(&x, &yx, &s, RopeMode::Normal, &POSITIONS, nr).0 > 1e3);
        // A position off by one fails at every position (the 0 -> 1 step included).
        let shifted: Vec<i32> = POSITIONS.iter().map(|p| p + 1).collect();
        assert!(worst(&x, &yx, &s, RopeMode::Neox, &shifted, nr).0 > 10.0);
        // Partial rotation: frequencies from head_dim instead of n_rot are rejected.
        if nr < hd {
            for mode in [RopeMode::Normal, RopeMode::Neox] {
                let y = if mode == RopeMode::Normal { &yn } else { &yx };
                let (ratio, _) = worst(&x, y, &spec(mode), mode, &POSITIONS, hd);
                assert!(ratio > 10.0, "{mode:?} hd {hd} n_rot {nr}: {ratio}");
            }
        }
    }
}

#[test]
fn rotations_compose() {
    // R(b) R(a) x == R(a+b) x up to the bounds: the first rotation's error (a 2-vector, turned
    // by R(b): at most sqrt(2) x its per-component bound in either component), the second's,
    // and that of the direct R(a+b) x.
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (hd, nr) in [(64usize, 64usize), (128, 32)] {
            let spec = RopeSpec {
                mode,
                n_head: 2,
                head_dim: hd,
                n_rot: nr,
                freq_base: 1e4,
            };
            for (a, b) in [(1, 6), (7, 1000), (1000, 31767), (16384, 16383)] {
                let x = rng(a as u32 ^ b as u32, 2 * hd, 2.0);
                let mut two = x.clone();
                kernels::rope_ext(&mut two, &[a], &spec).unwrap();
                let mid = two.clone();
                kernels::rope_ext(&mut two, &[b], &spec).unwrap();
                let mut one = x.clone();
                kernels::rope_ext(&mut one, &[a + b], &spec).unwrap();
                for h in 0..2 {
                    let o = h * hd;
                    for i in 0..nr / 2 {
                        let (i0, i1) = pair(mode, nr, i);
                        let ba = reference(x[o + i0], x[o + i1], a, i, nr, 1e4).bound;
                        let bb = reference(mid[o + i0], mid[o + i1], b, i, nr, 1e4).bound;
                        let bab = reference(x[o + i0], x[o + i1], a + b, i, nr, 1e4).bound;
                        let tol = 1.5 * ba + bb + bab;
                        for idx in [i0, i1] {
                            let d = (two[o + idx] as f64 - one[o + idx] as f64).abs();
                            assert!(d <= tol, "{mode:?} {a}+{b} i {i}: {d} > {tol}");
                        }
                    }
                    assert_eq!(bits(&two[o + nr..o + hd]), bits(&x[o + nr..o + hd]));
                }
            }
        }
    }
}

#[test]
fn batch_invariant() {
    // A token's output does not depend on the other tokens of the batch.
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let spec = RopeSpec {
            mode,
            n_head: 3,
            head_dim: 128,
            n_rot: 64,
            freq_base: 1e6,
        };
        let w = 3 * 128;
        let x = rng(11, POSITIONS.len() * w, 2.0);
        let mut all = x.clone();
        kernels::rope_ext(&mut all, &POSITIONS, &spec).unwrap();
        let cache = RopeCache::with_spec(&POSITIONS, &spec).unwrap();
        let mut via = x.clone();
        cache.apply(&mut via, 3).unwrap();
        assert_eq!(bits(&all), bits(&via));
        for (t, &p) in POSITIONS.iter().enumerate() {
            let mut one = x[t * w..(t + 1) * w].to_vec();
            kernels::rope_ext(&mut one, &[p], &spec).unwrap();
            assert_eq!(bits(&one), bits(&all[t * w..(t + 1) * w]));
        }
    }
}

#[test]
fn errors() {
    let mut x = vec![1.0f32; 2 * 2 * 16];
    let spec = |n_head, head_dim, n_rot| RopeSpec {
        mode: RopeMode::Normal,
        n_head,
        head_dim,
        n_rot,
        freq_base: 1e4,
    };
    let bad = |r: Result<(), OpsError>, name: &str| {
        assert!(
            matches!(r, Err(OpsError::BadDim { what, .. }) if what == name),
            "{name}: {r:?}"
        );
    };
    bad(kernels::rope_ext(&mut x, &[0, 1], &spec(2, 16, 0)), "n_rot");
    bad(kernels::rope_ext(&mut x, &[0, 1], &spec(2, 16, 7)), "n_rot");
    bad(
        kernels::rope_ext(&mut x, &[0, 1], &spec(2, 16, 18)),
        "n_rot",
    );
    bad(
        kernels::rope_ext(&mut x, &[0, 1], &spec(0, 16, 8)),
        "n_head",
    );
    bad(
        kernels::rope_ext(&mut x, &[0, 1], &spec(2, 0, 0)),
        "head_dim",
    );
    assert!(matches!(
        kernels::rope_ext(&mut x, &[0], &spec(2, 16, 8)),
        Err(OpsError::Length { .. })
    ));
    assert!(matches!(
        kernels::rope_ext(&mut x[..60], &[0, 1], &spec(2, 16, 8)),
        Err(OpsError::Ragged { .. })
    ));
    assert!(x.iter().all(|&v| v == 1.0));
}

/// FNV-1a of the f32 bits, as tests/ops_ggml_oracle.rs hashes.
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

/// ggml's own `ggml_rope_ext(x, pos, NULL, n_rot, mode, 32768, base, 1, 0, 1, 32, 1)` on
/// `[5 tokens at POSITIONS][n_head][head_dim]` of `symmetric(seed, n, 2.0)`: the hashes of its
/// output, from the llama.cpp of `llama-cpp-python==0.3.36` (ggml-cpu built with GCC `-O3`
/// and FMA, so `-ffp-contract=fast` fuses `rotate_pairs` as `rot` does; glibc `cosf`/`sinf`),
/// one thread. Like tests/ops_ggml_oracle.rs these pin glibc's libm.
/// (name, seed, mode, head_dim, n_rot, n_head, base, count, hash)
#[allow(clippy::type_complexity)]
const GGML: &[(&str, u32, RopeMode, usize, usize, usize, f32, usize, u64)] = &[
    (
        "normal_64_64",
        101,
        RopeMode::Normal,
        64,
        64,
        3,
        1e4,
        960,
        0x4e6ee1cd1bab8886,
    ),
    (
        "normal_128_128",
        102,
        RopeMode::Normal,
        128,
        128,
        2,
        5e5,
        1280,
        0xa9c7776030def5f3,
    ),
    (
        "neox_128_64",
        103,
        RopeMode::Neox,
        128,
        64,
        2,
        1e4,
        1280,
        0x0620dfc7e8f46c89,
    ),
    (
        "neox_128_32",
        104,
        RopeMode::Neox,
        128,
        32,
        2,
        1e6,
        1280,
        0x9084ef8eb240adfd,
    ),
    (
        "normal_128_64",
        105,
        RopeMode::Normal,
        128,
        64,
        2,
        1e4,
        1280,
        0x2e6b1395b2a1df47,
    ),
    (
        "normal_64_32",
        106,
        RopeMode::Normal,
        64,
        32,
        4,
        1e4,
        1280,
        0x03d6a42cbaa6a3b3,
    ),
    (
        "neox_64_64",
        107,
        RopeMode::Neox,
        64,
        64,
        1,
        1e4,
        320,
        0xb4588ca970e135d9,
    ),
    (
        "neox_80_48",
        108,
        RopeMode::Neox,
        80,
        48,
        2,
        1e4,
        800,
        0x3ce8ebc46f24541d,
    ),
    (
        "normal_96_24",
        109,
        RopeMode::Normal,
        96,
        24,
        3,
        1e6,
        1440,
        0x5f1cee9e988a4fa1,
    ),
];

#[test]
fn matches_ggml_bits() {
    let mut bad = Vec::new();
    for &(name, seed, mode, head_dim, n_rot, n_head, freq_base, count, hash) in GGML {
        let spec = RopeSpec {
            mode,
            n_head,
            head_dim,
            n_rot,
            freq_base,
        };
        let mut x = rng(seed, POSITIONS.len() * n_head * head_dim, 2.0);
        assert_eq!(x.len(), count, "{name}");
        kernels::rope_ext(&mut x, &POSITIONS, &spec).unwrap();
        if fnv(&x) != hash {
            bad.push(format!("{name}: {:016x} != ggml {hash:016x}", fnv(&x)));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
