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

mod common;

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

/// A larger oracle than the shipped one, built on demand from ggml's own C sources: set
/// `MINFER_GGML_SRC` to the `ggml` directory of the llama.cpp the reference logits came from
/// (llama-cpp-python 0.3.36's `vendor/llama.cpp/ggml`) and run
/// `cargo test --release --test matmul_dots -- --ignored`. Needs gcc/g++ on an x86-64 host.
///
/// [`DEV_ORACLE_DRIVER`] is compiled with ggml twice, with the flags of
/// `tests/data/ggml-oracle/build.sh` (`-O3 -std=gnu11 -march=native`, hence GCC's FMA
/// contraction): natively (the AVX-512 build on an AVX-512 host) and with `-mno-avx512f` (the
/// AVX2 build). It writes `dot` lines for 40 random rows of 4096 values per quantized type and
/// `fdot` lines for F32/F16/BF16 rows of 4096, 896, 1000, 37, 64 and 130 values. Every
/// quantized row must match both x86 ISAs bit for bit, the float rows the ISA of their build.
#[test]
#[ignore = "needs gcc and MINFER_GGML_SRC=<llama.cpp>/ggml"]
fn ggml_dev_oracle() {
    use std::process::Command;
    let ggml =
        std::env::var("MINFER_GGML_SRC").expect("set MINFER_GGML_SRC to llama.cpp's ggml dir");
    let dir = std::env::temp_dir().join(format!("minfer-ggml-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("drv.c"), DEV_ORACLE_DRIVER).unwrap();
    let stubs = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/ggml-oracle/stubs.c"
    );
    let inc = [
        format!("-I{ggml}/include"),
        format!("-I{ggml}/src"),
        format!("-I{ggml}/src/ggml-cpu"),
    ];
    let sh = |cmd: &mut Command| {
        let out = cmd.output().expect("run the compiler");
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let mut builds = Vec::new();
    for (tag, arch) in [
        ("native", &["-march=native"][..]),
        ("avx2", &["-march=native", "-mno-avx512f"][..]),
    ] {
        let o = |name: &str| dir.join(format!("{tag}_{name}.o"));
        let c_files = [
            ("quants", format!("{ggml}/src/ggml-quants.c")),
            ("cpu_quants", format!("{ggml}/src/ggml-cpu/quants.c")),
            (
                "x86_quants",
                format!("{ggml}/src/ggml-cpu/arch/x86/quants.c"),
            ),
            ("driver", dir.join("drv.c").display().to_string()),
            ("stubs", stubs.to_string()),
        ];
        for (name, file) in &c_files {
            sh(Command::new("gcc")
                .args(["-O3", "-DNDEBUG", "-std=gnu11", "-D_GNU_SOURCE", "-c"])
                .args(arch)
                .args(&inc)
                .arg(file)
                .arg("-o")
                .arg(o(name)));
        }
        sh(Command::new("g++")
            .args(["-O3", "-DNDEBUG", "-std=gnu++17", "-c"])
            .args(arch)
            .args(&inc)
            .arg(format!("{ggml}/src/ggml-cpu/vec.cpp"))
            .arg("-o")
            .arg(o("vec")));
        let exe = dir.join(format!("{tag}_driver"));
        let mut link = Command::new("g++");
        link.args(c_files.iter().map(|(n, _)| o(n)))
            .arg(o("vec"))
            .arg("-lm")
            .arg("-o")
            .arg(&exe);
        sh(&mut link);
        let text = String::from_utf8(sh(&mut Command::new(&exe))).unwrap();
        let path = dir.join(format!("{tag}.jsonl"));
        std::fs::write(&path, text).unwrap();
        builds.push(path.display().to_string());
    }
    let (native, avx2) = (&builds[0], &builds[1]);
    let quant = check_bit_exact(&oracle_at(native, "dot"), &x86_isas())
        + check_bit_exact(&oracle_at(avx2, "dot"), &x86_isas());
    let mut float = check_bit_exact(&oracle_at(avx2, "fdot"), &[Isa::Avx2]);
    if Isa::Avx512.is_supported() {
        float += check_bit_exact(&oracle_at(native, "fdot"), &[Isa::Avx512]);
    }
    println!("{quant} quantized and {float} float dots bit-exact against ggml's x86 builds");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The C driver of [`ggml_dev_oracle`]: ggml's x86 SIMD `vec_dot` kernels on random rows.
const DEV_ORACLE_DRIVER: &str = r#"// Larger dev oracle: ggml's own x86 SIMD vec_dot kernels on many random rows.
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-impl.h"
#include "ggml-cpu/quants.h"
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>
void ggml_vec_dot_bf16(int n, float * s, size_t bs, ggml_bf16_t * x, size_t bx, ggml_bf16_t * y, size_t by, int nrc);
void ggml_vec_dot_f16(int n, float * s, size_t bs, ggml_fp16_t * x, size_t bx, ggml_fp16_t * y, size_t by, int nrc);
void ggml_vec_dot_f32(int n, float * s, size_t bs, const float * x, size_t bx, const float * y, size_t by, int nrc);
static uint32_t rng = 0x12345678u;
static uint32_t xs(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float uni(void) { return (xs() >> 8) * (1.0f / 16777216.0f); }
static float gauss(void) { float s = 0; for (int i = 0; i < 4; i++) s += uni(); return (s - 2.0f) * 1.7f; }
static void hex(const char *key, const void *p, size_t n, int comma) {
    const uint8_t *b = p; printf("\"%s\":\"", key);
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\"%s", comma ? "," : "");
}
static void f32bits(const char *key, float v) { uint32_t u; memcpy(&u, &v, 4); printf("\"%s\":\"%08x\"", key, u); }
static uint16_t f16(float f) { return _cvtss_sh(f, 0); }
static void fill_weights(int type, uint8_t *w, int nb, size_t bsz) {
    for (size_t i = 0; i < nb * bsz; i++) w[i] = xs() & 0xff;
    for (int b = 0; b < nb; b++) {
        uint8_t *p = w + b * bsz;
        float d = (0.002f + uni() * 0.05f) * ((xs() & 1) ? -1 : 1);
        float m = -(0.01f + uni() * 0.3f);
        uint16_t hd = f16(d), hm = f16(m), hmin = f16(0.001f + uni() * 0.02f);
        switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: memcpy(p, &hd, 2); break;
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: memcpy(p, &hd, 2); memcpy(p + 2, &hm, 2); break;
        case GGML_TYPE_Q2_K: memcpy(p + 80, &hd, 2); memcpy(p + 82, &hmin, 2); break;
        case GGML_TYPE_Q3_K: memcpy(p + 108, &hd, 2); break;
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: memcpy(p, &hd, 2); memcpy(p + 2, &hmin, 2); break;
        case GGML_TYPE_Q6_K: { uint16_t h6 = f16(d * 0.05f); memcpy(p + 208, &h6, 2); } break;
        }
    }
}
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
struct wt { int type; const char *name; size_t bsz; int qk; dot_fn simd; int act; };
int main(void) {
    struct wt wts[] = {
        {GGML_TYPE_Q4_0, "Q4_0", 18, 32, ggml_vec_dot_q4_0_q8_0, 0},
        {GGML_TYPE_Q4_1, "Q4_1", 20, 32, ggml_vec_dot_q4_1_q8_1, 1},
        {GGML_TYPE_Q5_0, "Q5_0", 22, 32, ggml_vec_dot_q5_0_q8_0, 0},
        {GGML_TYPE_Q5_1, "Q5_1", 24, 32, ggml_vec_dot_q5_1_q8_1, 1},
        {GGML_TYPE_Q8_0, "Q8_0", 34, 32, ggml_vec_dot_q8_0_q8_0, 0},
        {GGML_TYPE_Q2_K, "Q2_K", 84, 256, ggml_vec_dot_q2_K_q8_K, 2},
        {GGML_TYPE_Q3_K, "Q3_K", 110, 256, ggml_vec_dot_q3_K_q8_K, 2},
        {GGML_TYPE_Q4_K, "Q4_K", 144, 256, ggml_vec_dot_q4_K_q8_K, 2},
        {GGML_TYPE_Q5_K, "Q5_K", 176, 256, ggml_vec_dot_q5_K_q8_K, 2},
        {GGML_TYPE_Q6_K, "Q6_K", 210, 256, ggml_vec_dot_q6_K_q8_K, 2},
    };
    enum { N = 4096, R = 40 };
    static uint8_t w[N / 32 * 210];
    static float xa[N];
    for (size_t t = 0; t < sizeof wts / sizeof wts[0]; t++) {
        for (int r = 0; r < R; r++) {
            int nb = N / wts[t].qk;
            fill_weights(wts[t].type, w, nb, wts[t].bsz);
            float sc = powf(10.0f, (float)((int)(xs() % 5) - 2));
            for (int i = 0; i < N; i++) xa[i] = gauss() * sc;
            static union { block_q8_0 q0[N / 32]; block_q8_1 q1[N / 32]; block_q8_K qk[N / 256]; } act;
            size_t asz;
            if (wts[t].act == 0) { quantize_row_q8_0(xa, act.q0, N); asz = sizeof act.q0; }
            else if (wts[t].act == 1) { quantize_row_q8_1(xa, act.q1, N); asz = sizeof act.q1; }
            else { quantize_row_q8_K(xa, act.qk, N); asz = sizeof act.qk; }
            float s; wts[t].simd(N, &s, 0, w, 0, &act, 0, 1);
            printf("{\"kind\":\"dot\",\"type\":\"%s\",\"row\":%d,", wts[t].name, r);
            hex("w", w, nb * wts[t].bsz, 1); hex("a", &act, asz, 1); f32bits("simd_fast", s); printf("}\n");
        }
    }
    int ns[] = {4096, 896, 1000, 37, 64, 130};
    for (int k = 0; k < 6; k++) for (int r = 0; r < 8; r++) {
        int n = ns[k];
        static ggml_fp16_t hw[4096], hx[4096]; static ggml_bf16_t bw[4096], bx[4096]; static float fw[4096], fx[4096];
        for (int i = 0; i < n; i++) {
            float a = gauss() * 0.1f, b = gauss();
            hw[i] = f16(a); hx[i] = f16(b); bw[i] = GGML_FP32_TO_BF16(a); bx[i] = GGML_FP32_TO_BF16(b); fw[i] = a; fx[i] = b;
        }
        float s;
        ggml_vec_dot_f16(n, &s, 0, hw, 0, hx, 0, 1);
        printf("{\"kind\":\"fdot\",\"type\":\"F16\",\"row\":%d,", r); hex("w", hw, 2*n, 1); hex("a", hx, 2*n, 1); f32bits("simd_fast", s); printf("}\n");
        ggml_vec_dot_bf16(n, &s, 0, bw, 0, bx, 0, 1);
        printf("{\"kind\":\"fdot\",\"type\":\"BF16\",\"row\":%d,", r); hex("w", bw, 2*n, 1); hex("a", bx, 2*n, 1); f32bits("simd_fast", s); printf("}\n");
        ggml_vec_dot_f32(n, &s, 0, fw, 0, fx, 0, 1);
        printf("{\"kind\":\"fdot\",\"type\":\"F32\",\"row\":%d,", r); hex("w", fw, 4*n, 1); hex("a", fx, 4*n, 1); f32bits("simd_fast", s); printf("}\n");
    }
    return 0;
}
"#;

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

const WEIGHT_TYPES: [GgmlType; 13] = GgmlType::WEIGHT_TYPES;

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
        let mut cmd = common::rerun_self();
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
                 emulator the test binary must be directly executable (binfmt) or \
                 MINFER_TEST_RUNNER must name the emulator",
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
