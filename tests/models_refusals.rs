//! What a model file asks for that minfer does not compute is refused at load with one line
//! naming it, never run wrong: RoPE scaling, Llama 3 `rope_freqs`, a fused `attn_qkv`, experts,
//! Gemma's logit soft-capping, a Llama `rope.dimension_count` below the head size. And the
//! window rules: a Gemma 3 file's window and layer pattern from its keys, a Llama file's window
//! key ignored (llama.cpp has no windowed Llama layers).

mod common;

use std::sync::Arc;

use common::gguf_bytes::GgufBytes;
use minfer::gguf::GgufFile;
use minfer::models::{HParams, load_model};

/// The hyper-parameter keys of a one-layer model of `arch` (64 wide, 2 heads of 32).
fn file(arch: &str) -> GgufBytes {
    layers(arch, 1)
}

/// [`file`] with `n_layer` layers.
fn layers(arch: &str, n_layer: u32) -> GgufBytes {
    let k = |s: &str| format!("{arch}.{s}");
    GgufBytes::default()
        .kv_str("general.architecture", arch)
        .kv_u32(&k("block_count"), n_layer)
        .kv_u32(&k("embedding_length"), 64)
        .kv_u32(&k("attention.head_count"), 2)
        .kv_u32(&k("feed_forward_length"), 128)
        .kv_u32(&k("context_length"), 256)
        .kv_f32(&k("attention.layer_norm_rms_epsilon"), 1e-5)
}

fn load_err(b: GgufBytes) -> String {
    let f = GgufFile::from_bytes(b.build()).expect("a well-formed GGUF");
    match load_model(Arc::new(f)) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e.to_string(),
    }
}

fn hparams(b: GgufBytes) -> HParams {
    HParams::from_gguf(&GgufFile::from_bytes(b.build()).expect("a well-formed GGUF")).expect("hparams")
}

#[test]
fn rope_scaling_is_refused() {
    let e = load_err(file("llama").kv_str("llama.rope.scaling.type", "yarn").kv_f32("llama.rope.scaling.factor", 4.0));
    assert_eq!(e, "RoPE scaling is not supported (found llama.rope.scaling.type = \"yarn\")");
    let e = load_err(file("llama").kv_str("llama.rope.scaling.type", "linear").kv_f32("llama.rope.scaling.factor", 2.0));
    assert_eq!(e, "linear RoPE scaling is not supported (found factor 2)");
    // Linear with factor 1 (or none) is plain RoPE.
    assert_eq!(hparams(file("llama").kv_str("llama.rope.scaling.type", "linear").kv_f32("llama.rope.scaling.factor", 1.0)).n_rot, 32);
}

#[test]
fn llama_tensors_it_cannot_compute_are_refused() {
    let e = load_err(file("llama").tensor("rope_freqs.weight", &[16], 0, 0).data(vec![0; 64]));
    assert_eq!(e, "a Llama file with this tensor is not supported (found rope_freqs.weight: Llama 3 RoPE frequency factors (rope_freqs))");
    let e = load_err(file("llama").tensor("blk.0.attn_qkv.weight", &[64, 192], 0, 0).data(vec![0; 64 * 192 * 4]));
    assert!(e.contains("a fused attn_qkv projection"), "{e}");
    let e = load_err(file("llama").kv_u32("llama.expert_count", 8));
    assert_eq!(e, "a mixture-of-experts Llama model is not supported (found llama.expert_count = 8)");
}

#[test]
fn llama_rotates_whole_heads() {
    let e = load_err(file("llama").kv_u32("llama.rope.dimension_count", 16));
    assert_eq!(e, "llama.rope.dimension_count = 16 is invalid: this architecture rotates whole heads (rope.dimension_count must equal the head dim)");
    // Another architecture may rotate part of its heads.
    assert_eq!(hparams(file("qwen2").kv_u32("qwen2.rope.dimension_count", 16)).n_rot, 16);
}

#[test]
fn gemma3_soft_capping_is_refused() {
    let e = load_err(file("gemma3").kv_f32("gemma3.final_logit_softcapping", 30.0));
    assert_eq!(e, "final logit soft-capping is not supported (found gemma3.final_logit_softcapping = 30)");
}

#[test]
fn windows_follow_the_architecture_and_the_keys() {
    // Gemma 3: the window, every sixth layer global by default, or the file's own pattern.
    let g = hparams(layers("gemma3", 7).kv_u32("gemma3.attention.sliding_window", 4));
    assert_eq!(g.n_swa, 4);
    assert_eq!(g.swa_layers, [true, true, true, true, true, false, true]);
    assert_eq!(g.rope_freq_base_swa, 10000.0);
    let g = hparams(
        layers("gemma3", 4)
            .kv_u32("gemma3.attention.sliding_window", 4)
            .kv_u32("gemma3.attention.sliding_window_pattern", 2)
            .kv_f32("gemma3.rope.freq_base_swa", 5000.0),
    );
    assert_eq!(g.swa_layers, [true, false, true, false]);
    assert_eq!(g.rope_freq_base_swa, 5000.0);
    // No window key: no windowed layer.
    assert!(hparams(file("gemma3")).swa_layers.iter().all(|w| !w));
    // Llama ignores a window key, as llama.cpp does.
    let l = hparams(file("llama").kv_u32("llama.attention.sliding_window", 4096));
    assert_eq!(l.n_swa, 0);
    assert!(!l.is_swa(0));
}
