//! Tokenizer throughput on English-like prose (about 400 KB built from a word list), one core,
//! plus the worst case of one long word.
//!
//! `cargo bench --bench tokenizer`; needs `qwen3-tiny.gguf` in `$MINFER_MODEL_DIR` or `models/`
//! (`scripts/fetch_models.sh`). Criterion reports the throughput in MiB/s of input text.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
    "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "time", "people", "year", "way", "day",
    "world", "life", "government", "system", "program", "question", "number", "company", "problem",
    "information", "development", "understanding", "particularly", "environmental", "approximately",
    "responsibility", "characteristics", "nevertheless", "simultaneously", "infrastructure",
    "tokenizer", "inference", "engine", "model", "language", "weather", "river", "mountain",
    "kitchen", "library", "morning", "evening", "quickly", "slowly", "carefully", "beautiful",
    "important", "different", "possible", "available", "however", "therefore", "although", "because",
    "don't", "it's", "we'll", "they're", "I'm", "you've", "she'd", "London", "Paris", "Tuesday",
];
const PUNCTUATION: &[&str] = &[",", ".", ";", ":", "!", "?", " -", "'s", ")", "\""];

/// Deterministic English-like prose of about `target` bytes: sentences of 6 to 24 words with
/// capitals, punctuation, the odd number, and paragraph breaks.
fn prose(target: usize) -> String {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut text = String::with_capacity(target + 256);
    while text.len() < target {
        let n_words = 6 + next(19);
        for i in 0..n_words {
            let word = WORDS[next(WORDS.len())];
            if i == 0 {
                let mut chars = word.chars();
                if let Some(first) = chars.next() {
                    text.extend(first.to_uppercase());
                    text.push_str(chars.as_str());
                }
            } else {
                text.push(' ');
                if next(40) == 0 {
                    text.push_str(&(next(3000) + 1).to_string());
                    text.push(' ');
                }
                text.push_str(word);
                if next(12) == 0 {
                    text.push_str(PUNCTUATION[next(PUNCTUATION.len())]);
                }
            }
        }
        text.push_str(if next(3) == 0 { "!" } else { "." });
        text.push_str(if next(6) == 0 { "\n\n" } else { " " });
    }
    text
}

fn load_tokenizer() -> Tokenizer {
    let dir = std::env::var_os("MINFER_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let path = dir.join("qwen3-tiny.gguf");
    let file = GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch_models.sh first)", path.display()));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bench_tokenizer(c: &mut Criterion) {
    let tok = load_tokenizer();
    let text = prose(400_000);
    let ids = tok.encode(&text, false);
    assert_eq!(tok.decode(&ids).ok().as_deref(), Some(text.as_str()));

    let mut group = c.benchmark_group("tokenizer");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.sample_size(20);
    group.bench_function("encode_english", |b| b.iter(|| tok.encode(black_box(&text), false)));
    group.bench_function("encode_english_parse_special", |b| b.iter(|| tok.encode(black_box(&text), true)));
    group.bench_function("decode_english", |b| b.iter(|| tok.decode(black_box(&ids))));
    group.finish();

    // Worst case for the merge loop: one 100 KB word (random letters, no space) goes through the
    // priority-queue path instead of the small-word scan.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let long_word: String = (0..100_000)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + ((state >> 33) % 26) as u8)
        })
        .collect();
    let mut group = c.benchmark_group("tokenizer");
    group.throughput(Throughput::Bytes(long_word.len() as u64));
    group.sample_size(10);
    group.bench_function("encode_one_long_word", |b| b.iter(|| tok.encode(black_box(&long_word), false)));
    group.finish();
}

criterion_group!(benches, bench_tokenizer);
criterion_main!(benches);
