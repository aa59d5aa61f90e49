//! Bit-exactness against ggml's own C code, run on deterministic inputs by
//! `tests/data/ggml-oracle/` (see its `build.sh`) and recorded in `tests/data/q8-oracle.jsonl`:
//!
//! * activation quantizers: `quantize_row_q8_0/q8_1` against ggml's x86 build (GCC defaults,
//!   `_fast`), the `_ref` variants against the strict build (`_off`); `quantize_row_q8_k`
//!   against the strict build (`_off`: llama.cpp's reference build compiles `ggml-quants.c`,
//!   part of `ggml-base`, without FMA) and `quantize_row_q8_k_fma` against the contracted one
//!   (`_fast`); inputs include all-zero rows, exact halves, tiny (scale overflow), huge and
//!   non-finite values, and values where FMA contraction changes Q8_K's rounding;
//! * `vec_dot_row` against ggml's generic kernels (strict build) bit for bit, and against the
//!   x86 SIMD kernels within a stated budget (they sum in another order);
//! * `dequantize_row` on random blocks against ggml's C dequantizers.

use minfer::quants::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f32s(s: &str) -> Vec<f32> {
    hex(s)
        .chunks_exact(4)
        .map(|c| f32::from_bits(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

fn lines(kind: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/q8-oracle.jsonl"
    ))
    .unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or_else(|| panic!("missing {k}"))
}

fn q8k_blocks(bytes: &[u8]) -> Vec<BlockQ8K> {
    bytes
        .chunks_exact(292)
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// Q8_K blocks equal, except that for an all-zero input block ggml leaves stale `bsums` (the
/// oracle pre-fills them with 0x5555) where we write zeros; they only meet `d = 0`.
fn same_q8k(ours: &BlockQ8K, ggml: &BlockQ8K) -> bool {
    let zero_block = ggml.d == 0.0 && ggml.qs.iter().all(|&q| q == 0);
    ours.d.to_bits() == ggml.d.to_bits()
        && ours.qs == ggml.qs
        && (ours.bsums == ggml.bsums || zero_block && ours.bsums == [0; 16])
}

#[test]
fn activation_quantizers_match_ggml_bit_for_bit() {
    let rows = lines("quant");
    assert!(rows.len() >= 16);
    let mut checked = 0;
    for r in &rows {
        let row = &r["row"];
        let x = f32s(field(r, "x"));
        let mut q0 = vec![BlockQ8_0::default(); x.len() / 32];
        quantize_row_q8_0(&x, &mut q0).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&q0),
            hex(field(r, "q8_0_fast")),
            "q8_0 row {row}"
        );
        quantize_row_q8_0_ref(&x, &mut q0).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&q0),
            hex(field(r, "q8_0_ref_off")),
            "q8_0_ref row {row}"
        );

        let mut q1 = vec![BlockQ8_1::default(); x.len() / 32];
        quantize_row_q8_1(&x, &mut q1).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&q1),
            hex(field(r, "q8_1_fast")),
            "q8_1 row {row}"
        );
        quantize_row_q8_1_ref(&x, &mut q1).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&q1),
            hex(field(r, "q8_1_ref_off")),
            "q8_1_ref row {row}"
        );

        let mut qk = vec![BlockQ8K::default(); x.len() / 256];
        quantize_row_q8_k(&x, &mut qk).unwrap();
        let ggml = q8k_blocks(&hex(field(r, "q8_k_off")));
        assert!(
            qk.iter().zip(&ggml).all(|(a, b)| same_q8k(a, b)),
            "q8_k row {row}"
        );
        quantize_row_q8_k_fma(&x, &mut qk).unwrap();
        let ggml = q8k_blocks(&hex(field(r, "q8_k_fast")));
        assert!(
            qk.iter().zip(&ggml).all(|(a, b)| same_q8k(a, b)),
            "q8_k_fma row {row}"
        );
        checked += 1;
    }
    let summary = format!("{checked} rows x 6 quantizers bit-exact against ggml's C\n");
    std::io::Write::write_all(&mut std::io::stdout(), summary.as_bytes()).unwrap();
}

/// The x86 and ref quantizers really differ on the oracle's inputs (so the tests above tell
/// them apart), and so do Q8_K's fused and unfused roundings.
#[test]
fn oracle_inputs_separate_x86_from_ref() {
    let rows = lines("quant");
    let differ = |a: &str, b: &str| rows.iter().filter(|r| r[a] != r[b]).count();
    assert!(differ("q8_0_fast", "q8_0_ref_off") > 0);
    assert!(differ("q8_1_fast", "q8_1_ref_off") > 0);
    assert!(differ("q8_k_fast", "q8_k_off") > 0);
}

fn act_row(ty: GgmlType, a: &[u8]) -> ActRow {
    match vec_dot_type(ty).unwrap() {
        GgmlType::Q8_0 => ActRow::Q8_0(bytemuck::cast_slice(a).to_vec()),
        GgmlType::Q8_1 => ActRow::Q8_1(bytemuck::cast_slice(a).to_vec()),
        GgmlType::Q8K => ActRow::Q8K(q8k_blocks(a)),
        GgmlType::F16 => ActRow::F16(bytemuck::cast_slice(a).to_vec()),
        GgmlType::BF16 => ActRow::BF16(bytemuck::cast_slice(a).to_vec()),
        t => panic!("{t}"),
    }
}

/// Relative budget of our (generic-order) dot against ggml's x86 SIMD kernels, which sum the
/// same exact integer block sums in another order, in f32 (and the float dots with FMAs):
/// `|ours - simd| <= 1e-5 * Σ|w_i a_i|` (computed from the dequantized rows in f64).
const SIMD_BUDGET: f64 = 1e-5;

fn abs_dot(ty: GgmlType, w: &[u8], act: &ActRow) -> f64 {
    let a = act.dequantize();
    let mut wf = vec![0.0; a.len()];
    dequantize_row(ty, w, &mut wf).unwrap();
    wf.iter()
        .zip(&a)
        .map(|(&w, &a)| (f64::from(w) * f64::from(a)).abs())
        .sum()
}

#[test]
fn vec_dot_matches_ggml_generic_bit_for_bit() {
    let rows = lines("dot");
    let mut exact = 0;
    let mut deq = 0;
    for r in &rows {
        let ty = GgmlType::ALL
            .into_iter()
            .find(|t| t.name() == field(r, "type"))
            .unwrap();
        let w = hex(field(r, "w"));
        let act = act_row(ty, &hex(field(r, "a")));
        let ours = vec_dot_row(ty, &w, &act).unwrap();
        let generic = f32s(field(r, "generic_off"))[0];
        assert_eq!(
            ours.to_bits(),
            generic.to_bits(),
            "{ty} row {}: {ours} vs {generic}",
            r["row"]
        );
        exact += 1;
        let simd = f32s(field(r, "simd_fast"))[0];
        let budget = SIMD_BUDGET * abs_dot(ty, &w, &act);
        assert!(
            f64::from((ours - simd).abs()) <= budget,
            "{ty}: {ours} vs simd {simd}"
        );
        if let Some(d) = r["dequant_off"].as_str() {
            let mut out = vec![0.0f32; act.len()];
            dequantize_row(ty, &w, &mut out).unwrap();
            let expected = f32s(d);
            assert!(
                out.iter()
                    .zip(&expected)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}"
            );
            deq += 1;
        }
    }
    let summary = format!(
        "{exact} dot products bit-exact against ggml's generic kernels, \
         {deq} random rows dequantized bit-exact\n"
    );
    std::io::Write::write_all(&mut std::io::stdout(), summary.as_bytes()).unwrap();
    assert_eq!(exact, rows.len());
}

#[test]
fn float_dots_within_budget_of_ggml_simd() {
    for r in lines("fdot") {
        let ty = GgmlType::ALL
            .into_iter()
            .find(|t| t.name() == field(&r, "type"))
            .unwrap();
        let w = hex(field(&r, "w"));
        let act = act_row(ty, &hex(field(&r, "a")));
        let ours = vec_dot_row(ty, &w, &act).unwrap();
        let simd = f32s(field(&r, "simd_fast"))[0];
        let budget = SIMD_BUDGET * abs_dot(ty, &w, &act);
        assert!(
            f64::from((ours - simd).abs()) <= budget,
            "{ty}: {ours} vs simd {simd}"
        );
    }
}
