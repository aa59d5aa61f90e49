//! `minfer info` end to end: hyper-parameters of the three test models against their published
//! configurations (model cards; the Qwen3-tiny generator's constants), and malformed files giving
//! one line on stderr and a non-zero exit.

mod common;

use std::process::Command;

use common::gguf_bytes::{GgufBytes, valid};

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

fn info_json(model: &str) -> serde_json::Value {
    let path = common::model_path(model);
    let out = minfer(&["info", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("info --json prints JSON")
}

/// (block count, embedding, heads, kv heads, head dim, ffn, context, rope base, eps, vocab)
type Expected = (u64, u64, u64, u64, u64, u64, u64, f64, f64, u64);

fn check(model: &str, arch: &str, e: Expected) {
    let v = info_json(model);
    let h = &v["hparams"];
    assert_eq!(h["arch"], arch);
    let got: Expected = (
        h["n_layer"].as_u64().unwrap(),
        h["n_embd"].as_u64().unwrap(),
        h["n_head"].as_u64().unwrap(),
        h["n_head_kv"].as_u64().unwrap(),
        h["head_dim"].as_u64().unwrap(),
        h["n_ff"].as_u64().unwrap(),
        h["n_ctx_train"].as_u64().unwrap(),
        h["rope_freq_base"].as_f64().unwrap(),
        h["rms_eps"].as_f64().unwrap(),
        h["n_vocab"].as_u64().unwrap(),
    );
    assert_eq!((got.0, got.1, got.2, got.3, got.4, got.5, got.6, got.9), (e.0, e.1, e.2, e.3, e.4, e.5, e.6, e.9), "{model}");
    assert_eq!(got.7, e.7, "{model} rope base");
    assert!((got.8 - e.8).abs() < 1e-12, "{model} eps {}", got.8);
}

#[test]
fn info_qwen2_05b() {
    check(common::QWEN2_05B, "qwen2", (24, 896, 14, 2, 64, 4864, 32768, 1e6, 1e-6, 151936));
    let v = info_json(common::QWEN2_05B);
    let mix = v["quant_mix"].as_object().unwrap();
    let types: Vec<&str> = mix.keys().map(String::as_str).collect();
    assert_eq!(types, ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"], "README's tensor mix");
    assert_eq!(v["file_size"], 491400064);
}

#[test]
fn info_qwen2_15b() {
    check(common::QWEN2_15B, "qwen2", (28, 1536, 12, 2, 128, 8960, 32768, 1e6, 1e-6, 151936));
}

#[test]
fn info_qwen3_tiny() {
    check(common::QWEN3_TINY, "qwen3", (4, 256, 4, 2, 128, 768, 4096, 1e6, 1e-6, 151936));
}

#[test]
fn info_text_and_tensor_table() {
    let path = common::model_path(common::QWEN3_TINY);
    let out = minfer(&["info", "--tensors", path.to_str().unwrap()]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("architecture:      qwen3"), "{s}");
    assert!(s.contains("head dim:          128"), "{s}");
    assert!(s.lines().any(|l| l.starts_with("blk.0.attn_q.weight") && l.contains("Q4_0") && l.contains("[256, 512]")), "{s}");
}

fn assert_one_line_failure(out: &std::process::Output, needle: &str) {
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
}

#[test]
fn info_on_malformed_files_is_one_line() {
    let dir = std::env::temp_dir().join(format!("minfer-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "not a GGUF file"),
        ("magic", b"GGML\x03\0\0\0".to_vec(), "not a GGUF file"),
    ];
    let mut b = valid();
    b.version = 9;
    cases.push(("version", b.build(), "unsupported GGUF version 9"));
    let b = GgufBytes::default().tensor("t", &[16], 0, 0).data(vec![0; 8]);
    cases.push(("bounds", b.build(), "tensor 't' data"));
    let b = valid().kv_u32("tokenizer.ggml.bos_token_id", 99);
    cases.push(("special", b.build(), "tokenizer.ggml.bos_token_id = 99"));
    let bytes = valid().build();
    cases.push(("truncated", bytes[..bytes.len() / 2].to_vec(), "truncated"));
    for (name, bytes, needle) in cases {
        let p = dir.join(format!("{name}.gguf"));
        std::fs::write(&p, bytes).unwrap();
        assert_one_line_failure(&minfer(&["info", p.to_str().unwrap()]), needle);
    }
    assert_one_line_failure(&minfer(&["info", dir.join("missing.gguf").to_str().unwrap()]), "cannot read");
    assert_one_line_failure(&minfer(&["info", dir.to_str().unwrap()]), "cannot read");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_arguments_are_one_line() {
    assert_one_line_failure(&minfer(&["info"]), "required");
    assert_one_line_failure(&minfer(&["frobnicate"]), "frobnicate");
}

/// SmolLM2-135M (model card: 30 layers, 576 wide, 9 heads / 3 KV heads, rope_theta 1e5, the
/// Llama layout: normal RoPE over whole heads, no window).
#[test]
fn info_smollm2_llama() {
    check(common::SMOLLM2, "llama", (30, 576, 9, 3, 64, 1536, 8192, 1e5, 1e-5, 49152));
    let h = &info_json(common::SMOLLM2)["hparams"];
    assert_eq!((h["rope_style"].as_str(), h["n_rot"].as_u64(), h["n_swa"].as_u64()), (Some("normal"), Some(64), Some(0)));
}

/// Gemma-3-270M (config.json: 18 layers, 640 wide, 4 heads / 1 KV head of 256, sliding window
/// 512 with every sixth layer global, rope_theta 1e6 global and 1e4 local).
#[test]
fn info_gemma3() {
    check(common::GEMMA3, "gemma3", (18, 640, 4, 1, 256, 2048, 32768, 1e6, 1e-6, 262144));
    let h = &info_json(common::GEMMA3)["hparams"];
    assert_eq!((h["rope_style"].as_str(), h["n_rot"].as_u64(), h["n_swa"].as_u64()), (Some("neox"), Some(256), Some(512)));
    let global: Vec<usize> = h["swa_layers"].as_array().unwrap().iter().enumerate().filter(|(_, w)| !w.as_bool().unwrap()).map(|(i, _)| i).collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(h["rope_freq_base_swa"].as_f64(), Some(10000.0));
    let text = minfer(&["info", common::model_path(common::GEMMA3).to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("rope:              neox, whole heads"), "{text}");
    assert!(text.contains("sliding window:    512 cells on 15 of 18 layers (global: 5, 11, 17), rope base 10000 there"), "{text}");
}
