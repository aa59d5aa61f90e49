//! Several sequences in one forward pass (`Engine::eval_batch`, KV regions shared by `n_seq`
//! sequences): every sequence's logits are bit-identical to the same sequence evaluated alone
//! in an engine of its own — with decode tokens and prefill chunks of other sequences in the
//! same pass, sequences joining and leaving, a sequence cut back to a cached prefix, and past a
//! sliding window (Gemma 3).

mod common;

use std::sync::Arc;

use minfer::generate::{Engine, EngineError, EngineParams, SeqChunk};
use minfer::gguf::GgufFile;
use minfer::models::{Model, load_model};

fn model(name: &str) -> Arc<Model> {
    let f = GgufFile::open(common::model_path(name)).expect("model opens");
    Arc::new(load_model(Arc::new(f)).expect("model loads"))
}

fn engine(m: &Arc<Model>, n_ctx: usize, n_seq: usize) -> Engine {
    let p = EngineParams { n_ctx, n_seq, n_threads: 2, ..EngineParams::default() };
    Engine::new(m.clone(), &p).expect("engine")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A token stream for sequence `s`: distinct ids for each sequence, inside every test model's
/// vocabulary.
fn stream(s: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + 37 * s as u32 + ((i as u32 * 7919 + s as u32 * 104_729) % 20_000)).collect()
}

/// One sequence's plan: the chunk sizes it is fed in (prefill chunks, then single tokens), and
/// the step it joins at.
struct Plan {
    start: usize,
    chunks: Vec<usize>,
}

/// Runs the plans: alone (one engine per sequence, its chunks in order) and batched (one
/// engine, at each step every active sequence's next chunk in one pass); asserts the logits
/// of every chunk are the same bits.
fn check(name: &str, plans: &[Plan], n_ctx: usize) {
    let m = model(name);
    let tokens: Vec<Vec<u32>> = plans.iter().enumerate().map(|(s, p)| stream(s, p.chunks.iter().sum())).collect();
    let mut alone: Vec<Vec<Vec<u32>>> = Vec::new();
    for (s, p) in plans.iter().enumerate() {
        let mut e = engine(&m, n_ctx, 1);
        let mut at = 0;
        let mut rows = Vec::new();
        for &c in &p.chunks {
            rows.push(bits(&e.eval(&tokens[s][at..at + c], 1).unwrap()));
            at += c;
        }
        alone.push(rows);
    }
    let mut e = engine(&m, n_ctx, plans.len());
    let n_vocab = e.n_vocab();
    let (mut next, mut at) = (vec![0usize; plans.len()], vec![0usize; plans.len()]);
    let mut step = 0;
    let mut mixed = 0;
    while next.iter().zip(plans).any(|(n, p)| *n < p.chunks.len()) {
        let active: Vec<usize> = (0..plans.len()).filter(|&s| plans[s].start <= step && next[s] < plans[s].chunks.len()).collect();
        let chunks: Vec<SeqChunk> = active.iter().map(|&s| SeqChunk { seq: s, tokens: &tokens[s][at[s]..at[s] + plans[s].chunks[next[s]]] }).collect();
        if chunks.iter().any(|c| c.tokens.len() > 1) && chunks.iter().any(|c| c.tokens.len() == 1) {
            mixed += 1;
        }
        if !chunks.is_empty() {
            let logits = e.eval_batch(&chunks).unwrap();
            assert_eq!(logits.len(), chunks.len() * n_vocab);
            for (row, &s) in logits.chunks_exact(n_vocab).zip(&active) {
                assert!(bits(row) == alone[s][next[s]], "{name}: sequence {s}, chunk {} differs from the sequence alone", next[s]);
                at[s] += plans[s].chunks[next[s]];
                next[s] += 1;
            }
        }
        step += 1;
    }
    assert!(mixed > 0, "the plans must mix prefill chunks and decode tokens in one pass");
    for (s, t) in tokens.iter().enumerate() {
        assert_eq!(e.seq_tokens(s).unwrap(), &t[..], "{name}: sequence {s}'s tokens");
    }
}

fn plan(start: usize, prefill: &[usize], decode: usize) -> Plan {
    let mut chunks = prefill.to_vec();
    chunks.extend(std::iter::repeat_n(1, decode));
    Plan { start, chunks }
}

#[test]
fn four_sequences_in_one_pass_match_each_alone() {
    for name in [common::QWEN2_05B, common::QWEN3_TINY, common::SMOLLM2] {
        let plans = [plan(0, &[23], 6), plan(0, &[5], 9), plan(2, &[9, 9, 4], 5), plan(4, &[31], 3)];
        check(name, &plans, 96);
    }
}

#[test]
fn gemma3_sequences_match_alone_past_the_sliding_window() {
    // Gemma 3 270M's local layers attend 512 cells: sequence 1 goes past them while the others
    // decode beside it.
    let plans = [plan(0, &[12], 10), plan(0, &[256, 256, 20], 6), plan(1, &[7], 8)];
    check(common::GEMMA3, &plans, 640);
}

#[test]
fn a_sequence_cut_back_to_a_prefix_continues_as_if_fresh() {
    let m = model(common::QWEN2_05B);
    let (a, b) = (stream(0, 30), stream(1, 12));
    let mut e = engine(&m, 64, 2);
    e.eval_batch(&[SeqChunk { seq: 0, tokens: &a }, SeqChunk { seq: 1, tokens: &b }]).unwrap();
    // Keep 17 tokens of sequence 0, then feed a different continuation.
    e.seq_truncate(0, 17).unwrap();
    let tail = stream(3, 8);
    let cached = bits(&e.eval_batch(&[SeqChunk { seq: 0, tokens: &tail }, SeqChunk { seq: 1, tokens: &[42] }]).unwrap()[..e.n_vocab()]);
    let mut fresh = engine(&m, 64, 1);
    fresh.eval(&a[..17], 1).unwrap();
    assert!(cached == bits(&fresh.eval(&tail, 1).unwrap()), "a cached prefix plus new tokens must equal the whole prompt evaluated fresh");
    assert_eq!(e.seq_tokens(0).unwrap().len(), 25);
}

#[test]
fn bad_batches_are_typed_errors_and_change_nothing() {
    let m = model(common::QWEN3_TINY);
    let mut e = engine(&m, 16, 2);
    let t = [5u32, 6, 7];
    let twice = e.eval_batch(&[SeqChunk { seq: 1, tokens: &t }, SeqChunk { seq: 1, tokens: &t }]).unwrap_err();
    assert!(matches!(twice, EngineError::SequenceTwice { seq: 1 }), "{twice}");
    let missing = e.eval_batch(&[SeqChunk { seq: 2, tokens: &t }]).unwrap_err();
    assert!(matches!(missing, EngineError::NoSequence { seq: 2, n_seq: 2 }), "{missing}");
    let long = [1u32; 17];
    let full = e.eval_batch(&[SeqChunk { seq: 0, tokens: &t }, SeqChunk { seq: 1, tokens: &long }]).unwrap_err();
    assert!(matches!(full, EngineError::ContextFull { n_past: 0, n_tokens: 17, n_ctx: 16 }), "{full}");
    assert!(matches!(e.eval_batch(&[]).unwrap_err(), EngineError::NoTokens));
    assert!(matches!(e.eval_batch(&[SeqChunk { seq: 0, tokens: &[] }]).unwrap_err(), EngineError::NoTokens));
    assert_eq!(e.seq_tokens(0).unwrap().len() + e.seq_tokens(1).unwrap().len(), 0, "a refused batch evaluates nothing");
    assert!(matches!(e.seq_truncate(5, 0).unwrap_err(), EngineError::NoSequence { seq: 5, n_seq: 2 }));
}

/// A sequence's KV copied out (`seq_snapshot`) and into another sequence of another engine
/// (`seq_restore`) continues with the same logits, to the bit, as the original; the other
/// sequences are untouched, and a snapshot that does not fit changes nothing.
#[test]
fn a_sequence_moves_between_slots_through_its_snapshot() {
    let m = model(common::QWEN2_05B);
    let (a_tokens, b_tokens) = (stream(0, 9), stream(1, 5));
    let mut a = engine(&m, 64, 2);
    a.eval_batch(&[SeqChunk { seq: 0, tokens: &b_tokens }, SeqChunk { seq: 1, tokens: &a_tokens }]).unwrap();
    let snap = a.seq_snapshot(1).unwrap();
    assert_eq!(snap.tokens, a_tokens);
    let mut b = engine(&m, 64, 3);
    b.eval_batch(&[SeqChunk { seq: 0, tokens: &b_tokens }]).unwrap();
    b.seq_restore(2, &snap).unwrap();
    assert_eq!(b.seq_tokens(2), Some(&a_tokens[..]));
    assert_eq!(b.seq_tokens(0), Some(&b_tokens[..]));
    let next = [4242u32];
    let want = a.eval_batch(&[SeqChunk { seq: 1, tokens: &next }]).unwrap();
    let got = b.eval_batch(&[SeqChunk { seq: 2, tokens: &next }]).unwrap();
    assert_eq!(bits(&got), bits(&want));
    // Too long for a 4-cell sequence: refused, the sequence keeps its tokens.
    let mut small = engine(&m, 4, 2);
    small.eval_batch(&[SeqChunk { seq: 1, tokens: &next }]).unwrap();
    assert!(matches!(small.seq_restore(1, &snap), Err(EngineError::ContextFull { .. })));
    assert_eq!(small.seq_tokens(1), Some(&next[..]));
    assert!(matches!(small.seq_restore(2, &snap), Err(EngineError::NoSequence { .. })));
}
