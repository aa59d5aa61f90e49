//! The real models' graphs: the walkthrough's node census for the 0.5B (440 prefill nodes for a
//! 30-token prompt with n_out = 1, 437 decode nodes) and the Qwen3 shapes.

mod common;

use std::sync::Arc;

use minfer::gguf::GgufFile;
use minfer::graph::{CParams, GraphParams, GraphType, Op};
use minfer::models::load_model;

fn params(nt: usize, n_out: usize) -> GraphParams {
    GraphParams {
        n_tokens: nt,
        n_out,
        output: Default::default(),
        gtype: GraphType::for_tokens(nt),
        cparams: CParams { n_ctx: 4096, n_seq: 1, gpu: false, kv_type: Default::default() },
        weights_version: 1,
    }
}

fn model(name: &str) -> minfer::models::Model {
    let f = GgufFile::open(common::model_path(name)).expect("model opens");
    load_model(Arc::new(f)).expect("model loads")
}

#[test]
fn qwen2_05b_census_matches_the_design() {
    let m = model(common::QWEN2_05B);
    let prefill = m.def.build_graph(&params(30, 1)).unwrap();
    assert_eq!(prefill.nodes.len(), 440);
    assert_eq!(prefill.inputs.len(), 3, "token_ids, positions, tail_ids");
    let decode = m.def.build_graph(&params(1, 1)).unwrap();
    assert_eq!(decode.nodes.len(), 437);
    assert_eq!(decode.inputs.len(), 2);
    let out = &decode.nodes[decode.outputs[0]];
    assert_eq!(out.out_shape[..2], [151936, 1]);
}

#[test]
fn qwen3_tiny_has_per_head_norms_and_tied_output() {
    let m = model(common::QWEN3_TINY);
    let g = m.def.build_graph(&params(5, 5)).unwrap();
    let qk_norms = g.nodes.iter().filter(|n| matches!(n.op, Op::QkNorm { .. })).count();
    assert_eq!(qk_norms, 2 * 4, "q and k norm in each of 4 layers");
    let out = &g.nodes[g.outputs[0]];
    assert_eq!(out.out_shape[..2], [151936, 5]);
    let q = g.nodes.iter().find(|n| n.name.contains("attn_q") && matches!(n.op, Op::MatMul { .. })).unwrap();
    assert_eq!(q.out_shape[0], 4 * 128, "q width is n_head * key_length, not n_embd");
    match &out.meta {
        minfer::graph::NodeMeta::MatMul(mm) => assert_eq!(mm.weight_name, "token_embd.weight", "tied output"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn graphs_are_deterministic_functions_of_params() {
    let m = model(common::QWEN2_05B);
    let a = m.def.build_graph(&params(7, 1)).unwrap();
    let b = m.def.build_graph(&params(7, 1)).unwrap();
    minfer::graph::cache::structural_diff(&a, &b).unwrap();
}

#[test]
fn unknown_architecture_lists_the_supported_ones() {
    use common::gguf_bytes::GgufBytes;
    let bytes = GgufBytes::default()
        .kv_str("general.architecture", "mamba")
        .kv_u32("mamba.block_count", 1)
        .kv_u32("mamba.embedding_length", 8)
        .kv_u32("mamba.attention.head_count", 2)
        .kv_u32("mamba.feed_forward_length", 16)
        .kv_u32("mamba.context_length", 64)
        .kv_f32("mamba.attention.layer_norm_rms_epsilon", 1e-5)
        .build();
    let f = GgufFile::from_bytes(bytes).unwrap();
    let e = load_model(Arc::new(f)).err().expect("mamba is refused").to_string();
    assert_eq!(e, "unsupported architecture 'mamba' (supported: qwen2, qwen3, llama, gemma3)");
}
