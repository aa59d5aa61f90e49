//! The tokenizer loaded from a real GGUF file against llama.cpp's ids for the Qwen2.5 vocabulary
//! (`tests/data/qwen2.5-0.5b.tokenizer.jsonl`, produced by llama.cpp from the 0.5B model file,
//! which is the file loaded here; qwen3-tiny carries the same tokenizer). The model file must be present: a missing file fails, it never skips.

mod common;

use common::tokenizer_cases::{self, Case};
use minfer::tokenizer::Tokenizer;

const CASES: &str = "qwen2.5-0.5b.tokenizer.jsonl";

fn load_tokenizer() -> Tokenizer {
    tokenizer_cases::load_tokenizer(common::QWEN2_05B)
}

fn load_cases() -> Vec<Case> {
    tokenizer_cases::load_cases(CASES)
}

#[test]
fn every_reference_line_matches_llama_cpp() {
    let cases = load_cases();
    assert_eq!(cases.len(), 120, "the reference file should have 120 lines");
    let (plain, special) = tokenizer_cases::check_every_line(&load_tokenizer(), &cases);
    assert_eq!(plain + special, 120);
}

#[test]
fn encode_bytes_agrees_with_encode_on_reference_texts() {
    let tok = load_tokenizer();
    for case in load_cases() {
        let via_bytes = tok.encode_bytes(case.text.as_bytes(), case.parse_special).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(via_bytes, case.ids, "{:?}", case.text);
    }
}

#[test]
fn decode_inverts_encode_on_reference_texts() {
    let tok = load_tokenizer();
    for case in load_cases() {
        let decoded = tok.decode(&case.ids).unwrap_or_else(|e| panic!("{:?}: {e}", case.text));
        assert_eq!(decoded, case.text);
    }
}

#[test]
fn stream_decoding_reference_ids_equals_decode() {
    let tok = load_tokenizer();
    for case in load_cases() {
        let mut stream = tok.stream_decoder();
        let mut text = String::new();
        for &id in &case.ids {
            let part = stream.push(id).unwrap_or_else(|e| panic!("{e}"));
            assert!(!part.contains(char::REPLACEMENT_CHARACTER), "{:?}: U+FFFD emitted", case.text);
            text.push_str(&part);
        }
        assert!(stream.pending_bytes().is_empty(), "{:?}: bytes left over", case.text);
        text.push_str(&stream.flush());
        assert_eq!(text, case.text);
    }
}

#[test]
fn special_tokens_are_those_llama_cpp_reports() {
    let tok = load_tokenizer();
    assert_eq!(tok.n_vocab(), 151_936);
    assert!(!tok.add_bos());
    assert_eq!(tok.bos_id(), Some(151_643));
    assert_eq!(tok.eos_id(), Some(151_645));
    assert_eq!(tok.pad_id(), Some(151_643));
    // Not in the metadata: detected by text, like llama.cpp.
    assert_eq!(tok.eot_id(), Some(151_645));
    assert_eq!(tok.fim_ids(), [Some(151_659), Some(151_661), Some(151_660), Some(151_662), Some(151_663), Some(151_664)]);
    // llama.cpp's EOG list for Qwen2.5: </s> (a normal token in this vocabulary, promoted by its
    // text), <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>, <|file_sep|>.
    assert_eq!(tok.eog_ids(), [128_247, 151_643, 151_645, 151_662, 151_663, 151_664]);
    assert!(tok.is_eog(151_645) && tok.is_eog(151_643) && !tok.is_eog(151_644) && !tok.is_eog(13));
    assert_eq!(tok.token_id("<|im_start|>"), Some(151_644));
    assert!(tok.is_control(151_644));
}

#[test]
fn user_defined_tokens_are_split_even_without_parse_special() {
    // <tool_call> is user-defined (type 4) in Qwen2.5: llama.cpp cuts it out of the text either
    // way, while control tokens like <|im_end|> stay text unless special tokens are parsed.
    let tok = load_tokenizer();
    let tool_call = tok.token_id("<tool_call>").unwrap_or_else(|| panic!("no <tool_call>"));
    let ids = tok.encode("a<tool_call>b", false);
    assert_eq!(ids, [tok.encode("a", false)[0], tool_call, tok.encode("b", false)[0]]);
    assert!(!tok.encode("<|im_end|>", false).contains(&151_645));
    assert_eq!(tok.encode("<|im_end|>", true), [151_645]);
}

#[test]
fn pieces_render_like_token_to_piece() {
    let tok = load_tokenizer();
    assert_eq!(tok.token_bytes(220).ok(), Some(&b" "[..]));
    assert_eq!(tok.token_bytes(151_645).ok(), Some(&b"<|im_end|>"[..]));
    assert_eq!(tok.token_piece(151_645, false).ok(), Some(&b""[..]));
    // Unused padding entries ([PAD151665], type 5) render as nothing, as in llama.cpp.
    assert_eq!(tok.token_bytes(151_665).ok(), Some(&b""[..]));
    assert!(tok.token_bytes(151_936).is_err());
    assert_eq!(tok.decode_with(&[151_644, 872, 151_645], false).ok().as_deref(), Some("user"));
}

/// Random strings whose ids come from llama.cpp's splitter plus an independent BPE
/// (see `tests/data/tokenizer_oracle.md`).
#[test]
fn random_strings_match_the_oracle_and_round_trip() {
    let tok = load_tokenizer();
    let path = common::data_path("tokenizer_oracle.jsonl");
    let data = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut n = 0;
    for line in data.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
        let text = v["text"].as_str().unwrap_or_else(|| panic!("text"));
        let want: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap_or_else(|e| panic!("{e}"));
        let ids = tok.encode(text, false);
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(tok.decode(&ids).ok().as_deref(), Some(text));
        n += 1;
    }
    assert_eq!(n, 828);
}
