//! Every rejected input has its own typed error; nothing panics. Uses small hand-made
//! vocabularies, so no model file is needed.

mod common;

use common::gguf_bytes::GgufBytes;
use minfer::gguf::GgufFile;
use minfer::tokenizer::{Tokenizer, TokenizerData, TokenizerError};

/// A toy byte-level vocabulary: "h", "i", "Ġ" (space), "hi", "Ġhi", a control and a user token.
fn toy_data() -> TokenizerData {
    let tokens = ["h", "i", "Ġ", "hi", "Ġhi", "<|end|>", "<tool>", "!", "ðŁ", "ĺ", "Ģ"];
    TokenizerData {
        model: "gpt2".into(),
        pre: "qwen2".into(),
        tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
        token_types: vec![1, 1, 1, 1, 1, 3, 4, 1, 1, 1, 1],
        merges: vec!["h i".into(), "Ġ hi".into()],
        eos_id: Some(5),
        ..TokenizerData::default()
    }
}

fn toy() -> Tokenizer {
    Tokenizer::new(toy_data()).unwrap_or_else(|e| panic!("toy vocabulary rejected: {e}"))
}

#[test]
fn toy_vocabulary_encodes_and_decodes() {
    let tok = toy();
    assert_eq!(tok.encode("hi hi!", false), [3, 4, 7]);
    assert_eq!(tok.encode("hi<|end|>", true), [3, 5]);
    assert_eq!(tok.encode("hi<tool>", false), [3, 6]);
    assert_eq!(tok.decode(&[3, 4, 5]).ok().as_deref(), Some("hi hi<|end|>"));
    // Without merges for them, characters outside the vocabulary are dropped, as in llama.cpp.
    assert_eq!(tok.encode("hé", false), [0]);
    // gpt2 vocabularies get llama.cpp's default BOS (11) only when that id exists.
    assert_eq!(tok.bos_id(), None);
    assert!(tok.is_eog(5));
}

#[test]
fn rejects_other_tokenizer_models() {
    for model in ["bert", "t5", "rwkv", ""] {
        let data = TokenizerData { model: model.into(), ..toy_data() };
        match Tokenizer::new(data) {
            Err(e @ TokenizerError::UnsupportedModel { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("{model:?}")) && msg.contains("\"gpt2\"") && msg.contains("\"llama\""), "{msg}");
            }
            other => panic!("{model:?}: {other:?}"),
        }
    }
}

#[test]
fn rejects_unknown_pre_tokenizers() {
    // "default" and "" (llama.cpp's default regex set) and the DeepSeek/Qwen3.5 splitters are
    // not implemented; the error names the value and lists the supported ones.
    for pre in ["default", "", "qwen35", "deepseek-llm", "Qwen2"] {
        let data = TokenizerData { pre: pre.into(), ..toy_data() };
        match Tokenizer::new(data) {
            Err(TokenizerError::UnsupportedPreTokenizer { pre: p, supported }) => {
                assert_eq!(p, pre);
                assert!(supported.contains("\"qwen2\"") && supported.contains("\"smollm\"") && supported.contains("\"llama3\""), "{supported}");
            }
            other => panic!("{pre:?}: {other:?}"),
        }
    }
    // SentencePiece vocabularies ignore the pre-tokenizer name, as llama.cpp does.
    let spm = TokenizerData { model: "llama".into(), pre: "default".into(), scores: vec![0.0; 11], ..toy_data() };
    assert!(Tokenizer::new(spm).is_ok());
}

#[test]
fn scores_must_cover_the_vocabulary() {
    let data = TokenizerData { model: "llama".into(), scores: vec![0.0; 3], ..toy_data() };
    assert!(matches!(Tokenizer::new(data), Err(TokenizerError::ScoreCount { got: 3, n_vocab: 11 })));
}

#[test]
fn bad_merges_are_reported_with_their_line() {
    for (merge, reason) in [("hi", "no space"), ("h ", "empty right"), ("h i Ġ", "more than two")] {
        let mut data = toy_data();
        data.merges.push(merge.into());
        match Tokenizer::new(data) {
            Err(TokenizerError::BadMerge { line: 2, text, reason: r }) => {
                assert_eq!(text, merge);
                assert!(r.starts_with(reason), "{r}");
            }
            other => panic!("{merge:?}: {other:?}"),
        }
    }
}

#[test]
fn special_ids_must_be_in_the_vocabulary() {
    let data = TokenizerData { eos_id: Some(11), ..toy_data() };
    assert!(matches!(
        Tokenizer::new(data),
        Err(TokenizerError::SpecialIdOutOfRange { role: "eos", id: 11, n_vocab: 11 })
    ));
    let data = TokenizerData { pad_id: Some(u32::MAX), ..toy_data() };
    assert!(matches!(Tokenizer::new(data), Err(TokenizerError::SpecialIdOutOfRange { role: "pad", .. })));
}

#[test]
fn malformed_vocabularies_are_rejected() {
    let data = TokenizerData { tokens: vec![], token_types: vec![], merges: vec![], eos_id: None, ..toy_data() };
    assert!(matches!(Tokenizer::new(data), Err(TokenizerError::EmptyVocabulary)));

    let mut data = toy_data();
    data.tokens[1] = "h".into();
    assert!(matches!(Tokenizer::new(data), Err(TokenizerError::DuplicateToken { first: 0, second: 1, .. })));

    let data = TokenizerData { token_types: vec![1, 1], ..toy_data() };
    assert!(matches!(Tokenizer::new(data), Err(TokenizerError::TokenTypeCount { got: 2, n_vocab: 11 })));
}

#[test]
fn invalid_utf8_is_an_error_not_a_panic() {
    let tok = toy();
    for (bytes, offset, invalid_len) in [
        (&b"hi\xff"[..], 2, Some(1)),
        (&b"\xc3("[..], 0, Some(1)),
        (&b"hi \xe2\x82"[..], 3, None),
        (&b"\xed\xa0\x80"[..], 0, Some(1)), // a UTF-16 surrogate
    ] {
        match tok.encode_bytes(bytes, false) {
            Err(TokenizerError::InvalidUtf8 { offset: o, invalid_len: l }) => assert_eq!((o, l), (offset, invalid_len), "{bytes:?}"),
            other => panic!("{bytes:?}: {other:?}"),
        }
    }
    assert_eq!(tok.encode_bytes(b"hi", false).ok(), Some(vec![3]));
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = toy();
    assert!(matches!(tok.token_bytes(11), Err(TokenizerError::TokenIdOutOfRange { id: 11, n_vocab: 11 })));
    assert!(matches!(tok.decode(&[3, 99]), Err(TokenizerError::TokenIdOutOfRange { id: 99, .. })));
    assert!(tok.token_text(11).is_err());
    let mut stream = tok.stream_decoder();
    assert!(stream.push(u32::MAX).is_err());
    assert_eq!(stream.push(3).ok().as_deref(), Some("hi"));
}

#[test]
fn stream_decoder_holds_back_split_code_points() {
    // U+1F600 😀 is F0 9F 98 80: "ðŁ" carries F0 9F, "ĺ" 98, "Ģ" 80.
    let tok = toy();
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(8).ok().as_deref(), Some(""));
    assert_eq!(stream.push(9).ok().as_deref(), Some(""));
    assert_eq!(stream.pending_bytes(), b"\xf0\x9f\x98");
    assert_eq!(stream.push(10).ok().as_deref(), Some("\u{1F600}"));
    assert_eq!(stream.push(0).ok().as_deref(), Some("h"));
    // A code point left unfinished becomes one U+FFFD at the end, never earlier.
    assert_eq!(stream.push(8).ok().as_deref(), Some(""));
    assert_eq!(stream.flush(), "\u{FFFD}");
    // A byte that can never start a code point is replaced at once, as decode does.
    assert_eq!(stream.push(9).ok().as_deref(), Some("\u{FFFD}"));
    assert_eq!(tok.decode(&[8, 0]).ok().as_deref(), Some("\u{FFFD}h"));
}

#[test]
fn from_gguf_reads_the_tokenizer_keys() {
    let bytes = GgufBytes::default()
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str("tokenizer.ggml.pre", "qwen2")
        .kv_str_array("tokenizer.ggml.tokens", &["h", "i", "hi", "<|im_end|>"])
        .kv_i32_array("tokenizer.ggml.token_type", &[1, 1, 1, 3])
        .kv_str_array("tokenizer.ggml.merges", &["h i"])
        .kv_u32("tokenizer.ggml.eos_token_id", 3)
        .build();
    let file = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tok.encode("hih<|im_end|>", true), [2, 0, 3]);
    assert_eq!(tok.eos_id(), Some(3));
    assert_eq!(tok.eot_id(), Some(3));
    assert!(!tok.add_bos());
}

#[test]
fn from_gguf_names_missing_or_mistyped_keys() {
    let no_merges = GgufBytes::default()
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str("tokenizer.ggml.pre", "qwen2")
        .kv_str_array("tokenizer.ggml.tokens", &["a"])
        .build();
    let file = GgufFile::from_bytes(no_merges).unwrap_or_else(|e| panic!("{e}"));
    let err = Tokenizer::from_gguf(&file).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("tokenizer.ggml.merges"), "{err}");

    let typed_wrong = GgufBytes::default()
        .kv_u32("tokenizer.ggml.model", 2)
        .kv_str_array("tokenizer.ggml.tokens", &["a"])
        .build();
    let file = GgufFile::from_bytes(typed_wrong).unwrap_or_else(|e| panic!("{e}"));
    let err = Tokenizer::from_gguf(&file).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("tokenizer.ggml.model"), "{err}");
}

#[test]
fn tokenizer_is_shareable_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<TokenizerError>();
    let tok = toy();
    let ids: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| tok.encode("hi hi", false))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    assert!(ids.iter().all(|v| v == &[3, 4]));
}
