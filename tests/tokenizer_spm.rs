//! A hand-made SentencePiece vocabulary read from GGUF bytes: llama.cpp's defaults for
//! `"llama"` vocabularies (BOS 1, EOS 2, UNK 0, BOS added, space prefix), the space prefix after
//! special tokens, byte fallback and the leading-space rule of `llama_detokenize`. The expected
//! ids are worked out by hand from llama.cpp's `llm_tokenizer_spm_session`; no model file needed.

mod common;

use common::gguf_bytes::GgufBytes;
use minfer::gguf::GgufFile;
use minfer::tokenizer::{Tokenizer, VocabType};

const TOKENS: [&str; 8] = ["<unk>", "<s>", "</s>", "▁", "h", "▁h", "<0x69>", "<0xC3>"];
const TYPES: [i32; 8] = [2, 3, 3, 1, 1, 1, 6, 6];
const SCORES: [f32; 8] = [0.0, 0.0, 0.0, -1.0, -2.0, -0.5, 0.0, 0.0];

fn f32_array(items: &[f32]) -> Vec<u8> {
    let mut p = 6u32.to_le_bytes().to_vec(); // element type f32
    p.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for x in items {
        p.extend_from_slice(&x.to_le_bytes());
    }
    p
}

fn toy(extra: impl FnOnce(GgufBytes) -> GgufBytes) -> Tokenizer {
    let bytes = extra(
        GgufBytes::default()
            .kv_str("tokenizer.ggml.model", "llama")
            .kv_str_array("tokenizer.ggml.tokens", &TOKENS)
            .kv_i32_array("tokenizer.ggml.token_type", &TYPES)
            .kv("tokenizer.ggml.scores", 9, f32_array(&SCORES)),
    )
    .build();
    let file = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn llama_cpp_defaults_apply_when_keys_are_absent() {
    let tok = toy(|b| b);
    assert_eq!(tok.vocab_type(), VocabType::Spm);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert_eq!(tok.unk_sep_mask_ids(), (Some(0), None, None));
    assert!(tok.add_bos() && !tok.add_eos() && tok.add_space_prefix());
    // </s> is an end-of-generation token by its text, and the eos.
    assert_eq!(tok.eog_ids(), [2]);
}

#[test]
fn the_space_prefix_goes_first_and_after_each_special_token() {
    let tok = toy(|b| b);
    // "▁hi": "▁h" merges (−0.5); "▁hi" and "hi" are no entries; "i" falls back to <0x69>.
    assert_eq!(tok.encode("hi", false), [5, 6]);
    assert_eq!(tok.encode_prompt("hi", false), [1, 5, 6]);
    // After </s> the next fragment gets a prefix again; a fragment after text does not.
    assert_eq!(tok.encode("</s>hi", true), [2, 5, 6]);
    assert_eq!(tok.encode("h</s>i", true), [5, 2, 3, 6]);
    // Without parse_special, "</s>" is text: "<", "/", "s", ">" have no entries and no byte
    // tokens here, so each byte falls back to <unk>.
    assert_eq!(tok.encode("h</s>", false), [5, 0, 0, 0, 0]);
    // "é" (C3 A9): <0xC3> exists, <0xA9> does not.
    assert_eq!(tok.encode("é", false), [3, 7, 0]);
}

#[test]
fn without_the_space_prefix_the_text_is_taken_as_is() {
    let tok = toy(|b| b.kv("tokenizer.ggml.add_space_prefix", 7, vec![0]));
    assert!(!tok.add_space_prefix());
    assert_eq!(tok.encode("hi", false), [4, 6]);
    assert_eq!(tok.encode(" hi", false), [5, 6]);
}

#[test]
fn detokenize_drops_the_prefix_space_of_the_first_token() {
    let tok = toy(|b| b);
    assert_eq!(tok.decode(&[5, 6]).ok().as_deref(), Some(" hi"));
    assert_eq!(tok.detokenize(&[5, 6], true).ok().as_deref(), Some("hi"));
    // Only the first token's: with BOS first (rendered or not) the space stays, as in llama.cpp.
    assert_eq!(tok.detokenize(&[1, 5, 6], true).ok().as_deref(), Some("<s> hi"));
    assert_eq!(tok.detokenize(&[1, 5, 6], false).ok().as_deref(), Some(" hi"));
    // decode(encode(s)) through detokenize gives s back.
    for text in ["hi", "h h", "hih"] {
        let ids = tok.encode(text, false);
        assert_eq!(tok.detokenize(&ids, true).ok().as_deref(), Some(text), "{ids:?}");
    }
}

#[test]
fn integer_scores_are_accepted_and_a_short_score_array_is_an_error() {
    let mut ints = 5u32.to_le_bytes().to_vec(); // element type i32
    ints.extend_from_slice(&8u64.to_le_bytes());
    for x in [0i32, 0, 0, -1, -2, -1, 0, 0] {
        ints.extend_from_slice(&x.to_le_bytes());
    }
    let bytes = GgufBytes::default()
        .kv_str("tokenizer.ggml.model", "llama")
        .kv_str_array("tokenizer.ggml.tokens", &TOKENS)
        .kv_i32_array("tokenizer.ggml.token_type", &TYPES)
        .kv("tokenizer.ggml.scores", 9, ints)
        .build();
    let tok = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tok.encode("hi", false), [5, 6]);

    let bytes = GgufBytes::default()
        .kv_str("tokenizer.ggml.model", "llama")
        .kv_str_array("tokenizer.ggml.tokens", &TOKENS)
        .kv("tokenizer.ggml.scores", 9, f32_array(&SCORES[..3]))
        .build();
    let err = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}"))).err().map(|e| e.to_string());
    assert_eq!(err.as_deref(), Some("scores has 3 entries but the vocabulary has 8 tokens"));

    let bytes = GgufBytes::default()
        .kv_str("tokenizer.ggml.model", "llama")
        .kv_str_array("tokenizer.ggml.tokens", &TOKENS)
        .kv_str_array("tokenizer.ggml.scores", &TOKENS)
        .build();
    let err = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{e}"))).err().map(|e| e.to_string());
    assert!(err.as_deref().is_some_and(|e| e.contains("tokenizer.ggml.scores")), "{err:?}");
}

#[test]
fn stream_decoding_equals_decode_for_byte_tokens() {
    let tok = toy(|b| b);
    let ids = [5, 7, 6];
    let mut stream = tok.stream_decoder();
    let mut text = String::new();
    for id in ids {
        text.push_str(&stream.push(id).unwrap_or_else(|e| panic!("{e}")));
    }
    text.push_str(&stream.flush());
    assert_eq!(Some(text), tok.decode(&ids).ok());
}
