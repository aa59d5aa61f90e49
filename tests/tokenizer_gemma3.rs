//! Gemma 3 270M's tokenizer (SentencePiece: 262144 scored tokens, byte fallback, user-defined
//! whitespace and HTML tokens, no space prefix) loaded from the real model file, against
//! llama.cpp's ids (`tests/data/gemma3-270m.tokenizer.jsonl`, tokenized without BOS, both
//! `parse_special` modes; and the prompts of `tests/data/gemma3-270m.greedy.jsonl`, with BOS).
//! The model file must be present: a missing file fails, it never skips.

mod common;

use std::time::Instant;

use common::tokenizer_cases::{check_every_line, check_greedy_prompts, check_round_trip, load_cases, load_tokenizer};
use minfer::tokenizer::{Tokenizer, VocabType};

const CASES: &str = "gemma3-270m.tokenizer.jsonl";

fn tokenizer() -> Tokenizer {
    load_tokenizer(common::GEMMA3)
}

#[test]
fn every_reference_line_matches_llama_cpp() {
    let cases = load_cases(CASES);
    assert_eq!(cases.len(), 123, "the reference file should have 123 lines");
    // The file holds llama.cpp's ids without BOS (`add_special = false`): `encode`, not
    // `encode_prompt`.
    assert!(cases.iter().all(|c| c.ids.first() != Some(&2) || c.text.starts_with("<bos>")));
    let (plain, special) = check_every_line(&tokenizer(), &cases);
    assert_eq!((plain, special), (116, 7));
}

#[test]
fn reference_ids_decode_back_to_their_text() {
    check_round_trip(&tokenizer(), &load_cases(CASES));
}

#[test]
fn greedy_prompts_encode_like_llama_cpp_with_bos() {
    assert_eq!(check_greedy_prompts(&tokenizer(), "gemma3-270m.greedy.jsonl"), 9);
}

#[test]
fn special_tokens_are_those_llama_cpp_reports() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_type(), VocabType::Spm);
    assert_eq!(tok.n_vocab(), 262_144);
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.pad_id()), (Some(2), Some(1), Some(0)));
    assert_eq!(tok.unk_sep_mask_ids(), (Some(3), None, None));
    // <end_of_turn> is found by its text, as llama.cpp does.
    assert_eq!(tok.eot_id(), Some(106));
    assert_eq!(tok.fim_ids(), [None; 6]);
}

/// llama.cpp's end-of-generation set for Gemma 3: <eos> (eos), <end_of_turn> (eot, and by text)
/// and </s> (id 212, a user-defined token that llama.cpp's EOG text list turns into a control
/// token). Generation must stop at each of them and at nothing else nearby.
#[test]
fn end_of_generation_tokens_are_eos_end_of_turn_and_closing_s() {
    let tok = tokenizer();
    assert_eq!(tok.eog_ids(), [1, 106, 212]);
    assert!(tok.is_eog(1) && tok.is_eog(106) && tok.is_eog(212));
    assert!(!tok.is_eog(105) && !tok.is_eog(2) && !tok.is_eog(0) && !tok.is_eog(107));
    // </s> became a control token: recognised only when parsing special tokens, hidden when
    // special tokens are not rendered.
    assert!(tok.is_control(212));
    assert_eq!(tok.encode("</s>", true), [212]);
    assert!(!tok.encode("</s>", false).contains(&212));
    assert_eq!(tok.token_piece(212, false).ok(), Some(&b""[..]));
    assert_eq!(tok.token_piece(106, true).ok(), Some(&b"<end_of_turn>"[..]));
}

#[test]
fn user_defined_tokens_are_split_in_both_modes() {
    let tok = tokenizer();
    // "   " (139) and "<html>" (217) are user-defined: cut out even without parse_special, so
    // "world" after them has no "▁".
    assert_eq!(tok.encode("hello   world", false), [23391, 139, 12392]);
    assert_eq!(tok.encode("<html>", false), [217]);
    // Control tokens are text unless parsed.
    assert_eq!(tok.encode("<start_of_turn>", true), [105]);
    assert!(!tok.encode("<start_of_turn>", false).contains(&105));
}

#[test]
fn pieces_render_like_token_to_piece() {
    let tok = tokenizer();
    assert_eq!(tok.token_bytes(1902).ok(), Some(&b" world"[..])); // "▁world"
    assert_eq!(tok.token_bytes(236743).ok(), Some(&b" "[..])); // "▁"
    assert_eq!(tok.token_bytes(251).ok(), Some(&b"\r"[..])); // "<0x0D>"
    assert_eq!(tok.token_bytes(138).ok(), Some(&b"  "[..])); // user-defined, as is
    assert_eq!(tok.token_bytes(2).ok(), Some(&b"<bos>"[..]));
    assert_eq!(tok.decode_with(&[2, 9259, 1902, 1], false).ok().as_deref(), Some("Hello world"));
    assert_eq!(tok.decode(&[2, 9259, 1902, 1]).ok().as_deref(), Some("<bos>Hello world<eos>"));
}

#[test]
fn stream_decoder_joins_byte_fallback_tokens() {
    let tok = tokenizer();
    // 𝔘 (U+1D518, F0 9D 94 98) has no token: llama.cpp's ids are four byte tokens.
    let ids = tok.encode("𝔘", false);
    assert_eq!(ids, [478, 395, 386, 390]);
    let mut stream = tok.stream_decoder();
    for &id in &ids[..3] {
        assert_eq!(stream.push(id).ok().as_deref(), Some(""));
    }
    assert_eq!(stream.pending_bytes(), b"\xf0\x9d\x94");
    assert_eq!(stream.push(ids[3]).ok().as_deref(), Some("𝔘"));
    assert!(stream.pending_bytes().is_empty());
}

/// Building the 262144-token vocabulary and encoding a few KB stay fast (release builds; the
/// bounds are loose so that a loaded machine does not fail them).
#[test]
fn building_and_encoding_are_fast() {
    let path = common::model_path(common::GEMMA3);
    let file = minfer::gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let build = t0.elapsed();
    let text: String = load_cases(CASES).iter().map(|c| c.text.as_str()).collect::<Vec<_>>().join("\n");
    let text = text.repeat(4096 / text.len().max(1) + 1);
    let t1 = Instant::now();
    let ids = tok.encode(&text, true);
    let encode = t1.elapsed();
    println!("build {build:?}, encode {} bytes into {} ids in {encode:?}", text.len(), ids.len());
    assert_eq!(tok.decode(&ids).ok().as_deref(), Some(text.as_str()));
    if !cfg!(debug_assertions) {
        assert!(build.as_secs_f64() < 2.0, "building took {build:?}");
        assert!(encode.as_secs_f64() < 0.2, "encoding took {encode:?}");
    }
}
