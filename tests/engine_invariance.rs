//! Engine-level guarantees: logits bit-identical for any thread count and for any prefill
//! chunking (batch invariance), the G3 tail reduction equal to the full-rows graph, and a
//! prefill → decode rebuild that keeps the KV.

mod common;

use std::sync::Arc;

use minfer::generate::{Engine, EngineParams};
use minfer::gguf::GgufFile;
use minfer::graph::Prepared;
use minfer::models::{Model, load_model};

fn model(name: &str) -> Arc<Model> {
    let f = GgufFile::open(common::model_path(name)).expect("model opens");
    Arc::new(load_model(Arc::new(f)).expect("model loads"))
}

fn engine(m: &Arc<Model>, threads: usize) -> Engine {
    Engine::new(m.clone(), &EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 256, n_threads: threads, backends: None, trace: false, dump: None, kv_type: Default::default() }).expect("engine")
}

/// A prompt long enough to cross tile and chunk boundaries (Qwen2.5 ids of real text).
const PROMPT: &[u32] = &[
    785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 576, 3974, 13876, 38835, 34208, 916,
    279, 15678, 5562, 1549, 323, 1549, 11, 3080, 279, 5562,
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Logits of every position after the first, fed as: prefill `ubatch`-sized chunks up to
/// `split`, then one token per decode step.
fn trajectory(e: &mut Engine, split: usize, ubatch: Option<usize>) -> Vec<Vec<u32>> {
    e.reset();
    let mut out = vec![bits(&e.prefill(&PROMPT[..split], ubatch).unwrap())];
    for t in &PROMPT[split..] {
        out.push(bits(&e.eval(&[*t], 1).unwrap()));
    }
    out
}

#[test]
fn logits_are_bit_identical_for_1_2_3_threads() {
    for name in [common::QWEN3_TINY, common::QWEN2_05B] {
        let m = model(name);
        let runs: Vec<_> = (1..=3).map(|t| trajectory(&mut engine(&m, t), 20, None)).collect();
        assert_eq!(runs[0], runs[1], "{name}: -t 1 vs -t 2");
        assert_eq!(runs[0], runs[2], "{name}: -t 1 vs -t 3");
    }
}

#[test]
fn prefill_chunking_does_not_change_a_bit() {
    for name in [common::QWEN3_TINY, common::QWEN2_05B] {
        let m = model(name);
        let mut e = engine(&m, 2);
        let n = PROMPT.len();
        let whole = bits(&e.prefill(PROMPT, None).unwrap());
        e.reset();
        let chunked = bits(&e.prefill(PROMPT, Some(7)).unwrap());
        e.reset();
        let one_by_one = bits(&e.prefill(PROMPT, Some(1)).unwrap());
        assert_eq!(whole, chunked, "{name}: whole vs --ubatch 7");
        assert_eq!(whole, one_by_one, "{name}: whole vs token by token");
        // And every later position: prefilled to 10 then decoded, vs token by token throughout.
        let a = trajectory(&mut e, 10, None);
        let b = trajectory(&mut e, 1, None);
        assert_eq!(a[..], b[9..], "{name}: positions 10..{n}");
    }
}

#[test]
fn tail_reduction_matches_full_nt() {
    let m = model(common::QWEN3_TINY);
    let mut e = engine(&m, 2);
    let all = e.eval(&PROMPT[..9], 9).unwrap(); // [9][n_vocab]
    e.reset();
    let tail = e.eval(&PROMPT[..9], 1).unwrap(); // [1][n_vocab]
    let n_vocab = e.n_vocab();
    assert_eq!(all.len(), 9 * n_vocab);
    assert_eq!(bits(&all[8 * n_vocab..]), bits(&tail));
    e.reset();
    let tail3 = e.eval(&PROMPT[..9], 3).unwrap();
    assert_eq!(bits(&all[6 * n_vocab..]), bits(&tail3));
}

#[test]
fn prefill_to_decode_rebuild_keeps_the_kv() {
    let m = model(common::QWEN3_TINY);
    let mut e = engine(&m, 2);
    e.prefill(&PROMPT[..12], None).unwrap();
    assert!(matches!(e.last_eval().unwrap().prepared, Prepared::Built { .. }));
    let first = e.eval(&PROMPT[12..13], 1).unwrap();
    assert!(matches!(e.last_eval().unwrap().prepared, Prepared::Built { .. }), "nt 12 -> 1 rebuilds");
    let second = e.eval(&PROMPT[13..14], 1).unwrap();
    assert!(matches!(e.last_eval().unwrap().prepared, Prepared::Reused { .. }), "decode reuses");
    // The decode steps saw the prefill's KV: they equal a single prefill through those tokens.
    e.reset();
    let ref13 = e.prefill(&PROMPT[..13], None).unwrap();
    e.reset();
    let ref14 = e.prefill(&PROMPT[..14], None).unwrap();
    assert_eq!(bits(&first), bits(&ref13));
    assert_eq!(bits(&second), bits(&ref14));
}

#[test]
fn context_overflow_is_an_error_before_compute() {
    let m = model(common::QWEN3_TINY);
    let mut e = Engine::new(m, &EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 8, n_threads: 1, backends: None, trace: false, dump: None, kv_type: Default::default() }).unwrap();
    let err = e.prefill(&PROMPT[..9], None).unwrap_err().to_string();
    assert!(err.contains("n_ctx 8"), "{err}");
    assert_eq!(e.n_past(), 0, "nothing was evaluated");
    assert!(e.eval(&[200_000], 1).unwrap_err().to_string().contains("not in the vocabulary"));
}

/// The prompt ids of record `id` of a reference file (llama.cpp's tokenization).
fn reference_prompt(file: &str, id: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(common::data_path(file)).expect("reference file");
    let rec = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("{file} has no record {id}"));
    rec["prompt_ids"].as_array().expect("prompt_ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn engine_ctx(m: &Arc<Model>, threads: usize, n_ctx: usize) -> Engine {
    Engine::new(m.clone(), &EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx, n_threads: threads, backends: None, trace: false, dump: None, kv_type: Default::default() }).expect("engine")
}

/// Logits after prefilling `ids[..split]` in chunks of `ubatch`, then one per decode step.
fn run(e: &mut Engine, ids: &[u32], split: usize, ubatch: Option<usize>) -> Vec<Vec<u32>> {
    e.reset();
    let mut out = vec![bits(&e.prefill(&ids[..split], ubatch).unwrap())];
    for t in &ids[split..] {
        out.push(bits(&e.eval(&[*t], 1).unwrap()));
    }
    out
}

/// SmolLM2 (llama, normal RoPE) and Gemma 3 (windowed layers) keep the invariances: any thread
/// count, any prefill chunking, prefill = decode. Gemma's prompt (769 tokens) runs past its
/// 512-cell window, so the windowed and the global layers both see cells the window drops.
#[test]
fn llama_and_gemma3_are_thread_and_chunking_invariant() {
    for (name, file, id, split) in [
        (common::SMOLLM2, "smollm2-135m.greedy.jsonl", "long_code", 200),
        (common::GEMMA3, "gemma3-270m.greedy.jsonl", "long_700", 700),
    ] {
        let m = model(name);
        let ids = reference_prompt(file, id);
        let t2 = run(&mut engine_ctx(&m, 2, 1024), &ids, split, None);
        let t1 = run(&mut engine_ctx(&m, 1, 1024), &ids, split, None);
        assert_eq!(t1, t2, "{name}: -t 1 vs -t 2");
        let mut e = engine_ctx(&m, 2, 1024);
        let chunked = run(&mut e, &ids, split, Some(96));
        assert_eq!(chunked, t2, "{name}: --ubatch 96 vs 512");
        // Prefilled further, then decoded token by token: the same bits at every position.
        let later = run(&mut e, &ids, split - 24, None);
        assert_eq!(later[24..], t2[..], "{name}: decode vs prefill past position {}", split - 24);
    }
}
