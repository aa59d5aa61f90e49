//! The SIMD dot kernels of `minfer::quants::simd`: bit for bit against ggml's own x86 SIMD
//! kernels where they mirror them, and against their scalar twins on random data, for every
//! weight type and every ISA this machine runs.
//!
//! # Budgets
//!
//! With `S = Σ |w_i a_i|` (f64, from the dequantized weight and activation rows as the kernels
//! see them; for Q4_1/Q5_1 plus `Σ_blocks |m| Σ|a_i|`, the magnitude of their separately added
//! min terms), every ISA's dot must satisfy `|simd - scalar| <= REL[ty] * S`:
//!
//! * quantized types, `REL = 4e-6`: inside a block both sum the same exact integers; they only
//!   differ in how the per-block f32 terms are rounded and added (ggml's x86 order: one FMA per
//!   block into 8 lanes, then a tree; the scalar reference: a running f32 sum, or 8 lane sums for
//!   Q3_K…Q6_K). Each is within `(nb + 3) * 2^-24 * S` of the exact value in the worst case
//!   (`nb` ≤ 128 blocks here: 7.8e-6), and the errors of random data add up like a random walk
//!   (observed worst: 5e-8). A wrong lane, block or scale is off by `~S / nb` or more;
//! * F32 / F16 / BF16, `REL = 2e-6`: the scalar reference sums the f32 products in f64, the SIMD
//!   kernels in f32 lanes: `n / lanes + log2(lanes) + 2` roundings of partial sums (n ≤ 1000:
//!   ~2e-6 worst case; observed 1.2e-7).
//!
//! The bit-exact tests need no budget: the x86 kernels reproduce ggml's float order.

use minfer::quants::simd::{Isa, SimdError, supported_isas, vec_dot_row_isa};
use minfer::quants::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn f32_hex(s: &str) -> f32 {
    let b = hex(s);
    f32::from_bits(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn oracle(kind: &str) -> Vec<serde_json::Value> {
    oracle_at(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/q8-oracle.jsonl"),
        kind,
    )
}

fn oracle_at(path: &str, kind: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .filter(|v| v["kind"] == kind)
        .collect()
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_else(|| panic!("missing {k}"))
}

fn act_row(ty: GgmlType, a: &[u8]) -> ActRow {
    match vec_dot_type(ty).unwrap() {
        GgmlType::Q8_0 => ActRow::Q8_0(bytemuck::cast_slice(a).to_vec()),
        GgmlType::Q8_1 => ActRow::Q8_1(bytemuck::cast_slice(a).to_vec()),
        GgmlType::Q8K => ActRow::Q8K(
            a.chunks_exact(292)
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
        GgmlType::F16 => ActRow::F16(bytemuck::cast_slice(a).to_vec()),
        GgmlType::BF16 => ActRow::BF16(bytemuck::cast_slice(a).to_vec()),
        GgmlType::F32 => ActRow::F32(
            a.chunks_exact(4)
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
        t => panic!("{t}"),
    }
}

fn type_named(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .expect("known type")
}

/// The x86 ISAs this machine runs (ggml's x86 kernels are what they mirror).
fn x86_isas() -> Vec<Isa> {
    supported_isas()
        .into_iter()
        .filter(|i| matches!(i, Isa::Avx2 | Isa::Avx512))
        .collect()
}

/// Checks every row of `rows` (oracle lines of kind `dot` or `fdot`) with every ISA of `isas`,
/// bit for bit; returns how many dots were compared.
fn check_bit_exact(rows: &[serde_json::Value], isas: &[Isa]) -> usize {
    let mut exact = 0;
    for r in rows {
        let ty = type_named(field(r, "type"));
        let w = hex(field(r, "w"));
        let act = act_row(ty, &hex(field(r, "a")));
        let ggml = f32_hex(field(r, "simd_fast"));
        for &isa in isas {
            let ours = vec_dot_row_isa(isa, ty, &w, &act).unwrap();
            let n = act.len();
            assert_eq!(
                ours.to_bits(),
                ggml.to_bits(),
                "{ty} n {n} row {} {isa}: {ours} vs ggml {ggml}",
                r["row"]
            );
            exact += 1;
        }
    }
    exact
}

/// A larger oracle than the shipped one, made on demand from ggml's C sources by the driver in
/// the doc comment of [`ggml_dev_oracle`]: `MINFER_GGML_ORACLE_AVX512` / `MINFER_GGML_ORACLE_AVX2`
/// name the JSON-lines outputs of ggml built with `-march=native` on an AVX-512 machine and with
/// `-march=native -mno-avx512f`. Ignored by default (it needs those files); when run, a missing
/// variable is a failure, not a skip.
///
/// The driver (kept out of the tree's data; see `tests/data/ggml-oracle/build.sh` for the build
/// recipe it shares) writes `dot` lines for 40 random rows of 4096 values per quantized type and
/// `fdot` lines for F32/F16/BF16 rows of 4096, 896, 1000, 37, 64 and 130 values.
#[test]
#[ignore = "needs MINFER_GGML_ORACLE_AVX512 / _AVX2 files made from ggml's C sources"]
fn ggml_dev_oracle() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("set {name} to the oracle file"))
    };
    let avx512 = var("MINFER_GGML_ORACLE_AVX512");
    let avx2 = var("MINFER_GGML_ORACLE_AVX2");
    let quant = check_bit_exact(&oracle_at(&avx512, "dot"), &x86_isas())
        + check_bit_exact(&oracle_at(&avx2, "dot"), &x86_isas());
    let mut float = check_bit_exact(&oracle_at(&avx2, "fdot"), &[Isa::Avx2]);
    if Isa::Avx512.is_supported() {
        float += check_bit_exact(&oracle_at(&avx512, "fdot"), &[Isa::Avx512]);
    }
    println!("{quant} quantized and {float} float dots bit-exact against ggml's x86 builds");
}

#[test]
fn quantized_dots_match_ggml_x86_simd_bit_for_bit() {
    let rows = oracle("dot");
    let isas = x86_isas();
    let exact = check_bit_exact(&rows, &isas);
    println!("{exact} quantized SIMD dots bit-exact against ggml's x86 kernels ({isas:?})");
    if Isa::Avx2.is_supported() {
        assert_eq!(exact, rows.len() * isas.len());
        assert!(exact > 0);
    }
}

#[test]
fn float_dots_match_ggml_avx512_build_bit_for_bit() {
    let rows = oracle("fdot");
    if !Isa::Avx512.is_supported() {
        println!(
            "no AVX-512 here: the fdot oracle rows (from ggml's AVX-512 build) are not checked"
        );
        return;
    }
    check_bit_exact(&rows, &[Isa::Avx512]);
    println!(
        "{} F16/BF16 AVX-512 dots bit-exact against ggml's AVX-512 build",
        rows.len()
    );
}

#[test]
fn unsupported_isa_is_a_typed_error() {
    let act = ActRow::for_weight(GgmlType::Q8_0, &[0.0; 32]).unwrap();
    let w = [0u8; 34];
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
        assert_eq!(
            vec_dot_row_isa(isa, GgmlType::Q8_0, &w, &act),
            Err(SimdError::Unsupported { isa })
        );
    }
    let err = vec_dot_row_isa(Isa::Scalar, GgmlType::Q8_0, &w[..33], &act).unwrap_err();
    assert!(
        matches!(err, SimdError::Quant(QuantError::BadLength { .. })),
        "{err:?}"
    );
}

#[path = "matmul_gen.rs"]
mod generate;
use generate::{Rng, magnitude, weight_row};

/// Relative budget of any ISA's dot against the scalar reference (see the module docs).
fn rel_budget(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 2e-6,
        _ => 4e-6,
    }
}

/// Row lengths per type: short, odd block counts, and a long row.
fn lengths(ty: GgmlType) -> &'static [usize] {
    match ty.block_size() {
        1 => &[1, 7, 37, 64, 130, 896, 1000],
        32 => &[32, 64, 96, 288, 896, 4096],
        _ => &[256, 512, 768, 4096],
    }
}

const WEIGHT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

#[test]
fn every_isa_matches_the_scalar_reference_within_budget() {
    let isas = supported_isas();
    let mut rng = Rng(0x5eed_1234);
    let mut checked = 0;
    for ty in WEIGHT_TYPES {
        let mut worst = 0.0f64;
        for &n in lengths(ty) {
            for _ in 0..6 {
                let w = weight_row(&mut rng, ty, n);
                let x = generate::activations(&mut rng, n);
                let act = ActRow::for_weight(ty, &x).unwrap();
                let reference = vec_dot_row(ty, &w, &act).unwrap();
                let s = magnitude(ty, &w, &act);
                for &isa in &isas {
                    let got = vec_dot_row_isa(isa, ty, &w, &act).unwrap();
                    if matches!(isa, Isa::Neon | Isa::NeonDotprod) && ty.block_size() > 1 {
                        // The NEON quantized kernels keep the scalar float order.
                        assert_eq!(got.to_bits(), reference.to_bits(), "{ty} n {n} {isa}");
                    }
                    let err = f64::from((got - reference).abs());
                    assert!(
                        err <= rel_budget(ty) * s,
                        "{ty} n {n} {isa}: {got} vs scalar {reference} (S {s:e})"
                    );
                    if s > 0.0 {
                        worst = worst.max(err / s);
                    }
                    checked += 1;
                }
            }
        }
        println!(
            "{ty:>5}: worst |simd - scalar| / S = {worst:.2e} (budget {:.0e})",
            rel_budget(ty)
        );
    }
    println!("{checked} dots on {isas:?}");
}

#[test]
fn all_zero_rows_give_zero_on_every_isa() {
    for ty in WEIGHT_TYPES {
        let n = lengths(ty)[1];
        let w = vec![0u8; n / ty.block_size() * ty.type_size()];
        let act = ActRow::for_weight(ty, &vec![1.5; n]).unwrap();
        let zero_act = ActRow::for_weight(ty, &vec![0.0; n]).unwrap();
        let mut rng = Rng(7);
        let w_rand = weight_row(&mut rng, ty, n);
        for isa in supported_isas() {
            assert_eq!(
                vec_dot_row_isa(isa, ty, &w, &act).unwrap(),
                0.0,
                "{ty} {isa}"
            );
            assert_eq!(
                vec_dot_row_isa(isa, ty, &w_rand, &zero_act).unwrap(),
                0.0,
                "{ty} {isa}"
            );
        }
    }
}

/// Prints the active ISA; run by [`env_levers_steer_the_active_isa`] in child processes.
#[test]
fn print_active_isa() {
    println!("ACTIVE_ISA={}", minfer::quants::simd::active_isa());
}

#[test]
fn env_levers_steer_the_active_isa() {
    let levers = ["MINFER_NO_AVX2", "MINFER_NO_AVX512", "MINFER_NO_NEON"];
    // The ISA the test binary reports in a fresh process with `lever=1` (or none).
    let active_with = |lever: Option<&str>| -> String {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "--exact",
            "print_active_isa",
            "--nocapture",
            "--test-threads=1",
        ]);
        for l in levers {
            cmd.env_remove(l);
        }
        if let Some(l) = lever {
            cmd.env(l, "1");
        }
        let out = cmd.output().expect("run the test binary again");
        let text = String::from_utf8_lossy(&out.stdout);
        // libtest may print the test name on the same line first.
        let line = text
            .lines()
            .find_map(|l| l.split_once("ACTIVE_ISA=").map(|(_, isa)| isa.trim()));
        let why = || {
            panic!(
                "no ACTIVE_ISA line from the child test process ({}; stderr: {}); under an \
                 emulator the test binary must be directly executable (binfmt)",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        };
        line.unwrap_or_else(why).to_string()
    };
    let best = |order: &[Isa]| {
        order
            .iter()
            .copied()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Scalar)
            .to_string()
    };
    if cfg!(target_arch = "x86_64") {
        assert_eq!(active_with(None), best(&[Isa::Avx512, Isa::Avx2]));
        assert_eq!(active_with(Some("MINFER_NO_AVX512")), best(&[Isa::Avx2]));
        assert_eq!(active_with(Some("MINFER_NO_AVX2")), "scalar");
        assert_eq!(
            active_with(Some("MINFER_NO_NEON")),
            best(&[Isa::Avx512, Isa::Avx2])
        );
    } else if cfg!(target_arch = "aarch64") {
        assert_eq!(active_with(None), best(&[Isa::NeonDotprod, Isa::Neon]));
        assert_eq!(active_with(Some("MINFER_NO_NEON")), "scalar");
        assert_eq!(
            active_with(Some("MINFER_NO_AVX2")),
            best(&[Isa::NeonDotprod, Isa::Neon])
        );
    }
}
