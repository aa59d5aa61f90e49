//! Properties of the real Qwen2.5 tokenizer (from qwen3-tiny.gguf) on random input: decoding
//! inverts encoding, streaming decoding never emits a broken or replaced code point for text that
//! came from a string, and arbitrary bytes never panic.

mod common;

use std::sync::OnceLock;

use minfer::gguf::GgufFile;
use minfer::tokenizer::{Tokenizer, TokenizerError};
use proptest::prelude::*;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = common::model_path(common::QWEN3_TINY);
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// Pieces that hit the tokenizer's corner cases: multi-byte code points of every length, emoji
/// sequences (ZWJ, skin tones, flags), CJK, combining marks, unusual whitespace, contractions,
/// special-token text and its fragments.
fn tricky_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            " ", "  ", "\n", "\r\n", "\t", "\u{a0}", "\u{3000}", "\u{85}", "\u{2028}", "\u{200b}", "\u{1c}",
            "'s", "'LL", "'", "a", "Z", "hello", " world", "1", "2024", ".", "!!", "<", "|", ">",
            "é", "ß", "\u{301}", "你好", "日本語", "한국어", "ไทย", "नमस्ते", "Привет", "مرحبا",
            "😀", "👍🏽", "👨\u{200d}👩\u{200d}👧", "🇫🇷", "𝔘", "\u{10ffff}", "\u{e000}", "\u{378}",
            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<|im_", "|>",
        ]).prop_map(str::to_owned),
        1 => any::<char>().prop_map(String::from),
    ]
}

fn tricky_text() -> impl Strategy<Value = String> {
    prop::collection::vec(tricky_piece(), 0..40).prop_map(|pieces| pieces.concat())
}

/// Text made only of multi-byte code points (emoji, CJK and friends).
fn multibyte_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "😀", "😂", "🎉", "👍🏽", "👨\u{200d}👩\u{200d}👧\u{200d}👦", "🇯🇵", "你", "好", "世界", "日本語のテキスト",
            "한국어", "𝔘𝔫𝔦", "𠀋", "€", "½", "é", " ", "\n",
        ]),
        1..30,
    )
    .prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decode_inverts_encode_on_any_string(text in any::<String>(), parse_special in any::<bool>()) {
        let tok = tokenizer();
        let ids = tok.encode(&text, parse_special);
        prop_assert_eq!(tok.decode(&ids).ok(), Some(text));
    }

    #[test]
    fn decode_inverts_encode_on_tricky_text(text in tricky_text(), parse_special in any::<bool>()) {
        let tok = tokenizer();
        let ids = tok.encode(&text, parse_special);
        prop_assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        prop_assert_eq!(tok.decode(&ids).ok(), Some(text));
    }

    #[test]
    fn repeated_words_encode_the_same_every_time(text in tricky_text()) {
        // Within one call, words seen before are copied from earlier output: a text repeated
        // after a special token must give the same ids twice.
        let tok = tokenizer();
        let once = tok.encode(&text, true);
        let twice = tok.encode(&format!("{text}<|im_end|>{text}"), true);
        let mut want = once.clone();
        want.push(151_645);
        want.extend_from_slice(&once);
        prop_assert_eq!(twice, want);
    }

    #[test]
    fn stream_decoder_emits_whole_code_points_only(text in multibyte_text()) {
        let tok = tokenizer();
        let ids = tok.encode(&text, false);
        let mut stream = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            let part = stream.push(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(!part.contains(char::REPLACEMENT_CHARACTER), "U+FFFD after id {}", id);
            streamed.push_str(&part);
            // Whatever was emitted so far is a prefix of the text: no partial or wrong characters.
            prop_assert!(text.starts_with(&streamed));
        }
        prop_assert!(stream.pending_bytes().is_empty());
        prop_assert_eq!(stream.flush(), "");
        prop_assert_eq!(&streamed, &text);
        prop_assert_eq!(tok.decode(&ids).ok(), Some(streamed));
    }

    #[test]
    fn stream_decoder_agrees_with_decode_on_any_ids(ids in prop::collection::vec(0u32..151_936, 0..60)) {
        // Random ids include lone continuation bytes and cut code points: replacement characters
        // may appear, but exactly where decode puts them.
        let tok = tokenizer();
        let mut stream = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(id).map_err(|e| TestCaseError::fail(e.to_string()))?);
        }
        streamed.push_str(&stream.flush());
        prop_assert_eq!(tok.decode(&ids).ok(), Some(streamed));
    }

    #[test]
    fn encode_bytes_is_encode_or_a_typed_error(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let tok = tokenizer();
        match (std::str::from_utf8(&bytes), tok.encode_bytes(&bytes, true)) {
            (Ok(text), Ok(ids)) => prop_assert_eq!(ids, tok.encode(text, true)),
            (Err(e), Err(TokenizerError::InvalidUtf8 { offset, invalid_len })) => {
                prop_assert_eq!(offset, e.valid_up_to());
                prop_assert_eq!(invalid_len, e.error_len());
            }
            (utf8, got) => prop_assert!(false, "from_utf8 {:?} but encode_bytes {:?}", utf8.is_ok(), got),
        }
    }
}
