//! Embeddings against llama.cpp's own: tests/data/qwen2.5-0.5b.embeddings.json holds llama.cpp's
//! final hidden states (its embeddings API, one token per decode, f32 KV, flash attention off:
//! scripts/make_embedding_reference.sh) of four texts with Qwen2.5-Coder-0.5B, per token and
//! pooled mean, first ("cls") and last. minfer's pooled states must be within `TOL` of them, its
//! tokens equal to llama's, and its embeddings independent of how the input is chunked.

mod common;

use std::sync::Arc;

use minfer::generate::{Engine, EngineParams, Pooling, embed, normalize};
use minfer::gguf::GgufFile;
use minfer::models::{Model, load_model};
use minfer::tokenizer::Tokenizer;
use serde_json::Value;

/// Largest difference allowed between minfer's and llama.cpp's hidden states, relative to the
/// vector's largest magnitude. Measured on AMD EPYC (Zen 4): 5.5e-8, the rounding of the 8
/// significant digits the file keeps — the same bits as llama.cpp's.
const TOL: f32 = 1e-6;

fn model() -> (Arc<Model>, Tokenizer) {
    let f = Arc::new(GgufFile::open(common::model_path(common::QWEN2_05B)).expect("model opens"));
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    (Arc::new(load_model(f).expect("model loads")), tok)
}

fn engine(m: &Arc<Model>, n_ubatch: usize) -> Engine {
    let p = EngineParams { n_ctx: 256, n_seq: 2, n_ubatch, n_threads: 2, ..EngineParams::default() };
    Engine::new(m.clone(), &p).expect("engine")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(common::data_path("qwen2.5-0.5b.embeddings.json")).expect("reference data");
    serde_json::from_str(&text).expect("reference json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// max |a - b| / max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "widths differ");
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn pooled_states_match_llama_cpp() {
    let (m, tok) = model();
    let mut e = engine(&m, 512);
    let refs = reference();
    let mut worst = 0f32;
    for case in refs["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let tokens = ids(&case["tokens"]);
        assert_eq!(tok.encode_input(text), tokens, "{text:?}: tokens differ from llama.cpp's");
        for (name, pooling) in [("none", Pooling::None), ("mean", Pooling::Mean), ("cls", Pooling::Cls), ("last", Pooling::Last)] {
            let want: Vec<Vec<f32>> = match &case[name] {
                Value::Null => continue,
                Value::Array(a) if pooling == Pooling::None => a.iter().map(floats).collect(),
                v => vec![floats(v)],
            };
            let got = embed(&mut e, 1, &tokens, pooling).expect("embeds");
            assert_eq!(got.len(), want.len(), "{name} {text:?}: vector count");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let d = rel_diff(g, w);
                assert!(d <= TOL, "{name} {text:?} vector {i}: {d} from llama.cpp's (tolerance {TOL})");
                worst = worst.max(d);
            }
        }
    }
    eprintln!("largest relative difference from llama.cpp: {worst:e}");
}

/// The pooled vector does not depend on the chunk size (`n_ubatch`): none and last are the same
/// bits (a token's row is computed the same way in any pass), mean the same f64 sum.
#[test]
fn chunking_changes_no_bit() {
    let (m, _) = model();
    let tokens = ids(&reference()["cases"][2]["tokens"]);
    let mut whole = engine(&m, 512);
    let mut chunked = engine(&m, 5);
    for pooling in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last] {
        let a = embed(&mut whole, 0, &tokens, pooling).unwrap();
        let b = embed(&mut chunked, 1, &tokens, pooling).unwrap();
        let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{pooling}: chunks of 5 differ from one pass");
    }
}

/// Mean pooling is the f64 average of the unpooled rows, cls the first, last the last
/// (hand-computed from `Pooling::None`).
#[test]
fn poolings_agree_with_the_token_rows() {
    let (m, _) = model();
    let tokens = ids(&reference()["cases"][1]["tokens"]);
    let mut e = engine(&m, 512);
    let rows = embed(&mut e, 0, &tokens, Pooling::None).unwrap();
    assert_eq!(rows.len(), tokens.len());
    let n = rows[0].len();
    let mean: Vec<f32> = (0..n).map(|j| (rows.iter().map(|r| f64::from(r[j])).sum::<f64>() / rows.len() as f64) as f32).collect();
    assert_eq!(embed(&mut e, 0, &tokens, Pooling::Mean).unwrap(), vec![mean]);
    assert_eq!(embed(&mut e, 0, &tokens, Pooling::Cls).unwrap(), vec![rows[0].clone()]);
    assert_eq!(embed(&mut e, 0, &tokens, Pooling::Last).unwrap(), vec![rows[rows.len() - 1].clone()]);
}

/// After an embedding the sequence holds its tokens like any prefill: continuing from it gives
/// the same logits as a plain prefill of the same tokens.
#[test]
fn the_kv_left_behind_is_a_prefill() {
    let (m, _) = model();
    let tokens = ids(&reference()["cases"][1]["tokens"]);
    let mut a = engine(&m, 512);
    embed(&mut a, 0, &tokens, Pooling::Mean).unwrap();
    assert_eq!(a.seq_tokens(0), Some(&tokens[..]));
    let next = [a.n_vocab() as u32 / 3];
    let after_embed = a.eval_batch(&[minfer::generate::SeqChunk { seq: 0, tokens: &next }]).unwrap();
    let mut b = engine(&m, 512);
    b.eval_batch(&[minfer::generate::SeqChunk { seq: 0, tokens: &tokens }]).unwrap();
    let after_prefill = b.eval_batch(&[minfer::generate::SeqChunk { seq: 0, tokens: &next }]).unwrap();
    assert!(after_embed.iter().zip(&after_prefill).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn normalised_vectors_have_unit_length() {
    let (m, _) = model();
    let tokens = ids(&reference()["cases"][3]["tokens"]);
    let mut e = engine(&m, 512);
    let mut v = embed(&mut e, 0, &tokens, Pooling::Mean).unwrap().remove(0);
    normalize(&mut v, 2);
    let len = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    assert!((len - 1.0).abs() < 1e-6, "length {len}");
}
