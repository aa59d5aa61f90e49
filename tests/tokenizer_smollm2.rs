//! SmolLM2-135M's tokenizer (byte-level BPE, pre-tokenizer `smollm`: digits split one by one,
//! then the GPT-2 rules) loaded from the real model file, against llama.cpp's ids
//! (`tests/data/smollm2-135m.tokenizer.jsonl`, both `parse_special` modes, and the prompts of
//! `tests/data/smollm2-135m.greedy.jsonl`). The model file must be present: a missing file
//! fails, it never skips.

mod common;

use common::tokenizer_cases::{check_every_line, check_greedy_prompts, check_round_trip, load_cases, load_tokenizer};
use minfer::tokenizer::{Tokenizer, VocabType};

const CASES: &str = "smollm2-135m.tokenizer.jsonl";

fn tokenizer() -> Tokenizer {
    load_tokenizer(common::SMOLLM2)
}

#[test]
fn every_reference_line_matches_llama_cpp() {
    let cases = load_cases(CASES);
    assert_eq!(cases.len(), 123, "the reference file should have 123 lines");
    let (plain, special) = check_every_line(&tokenizer(), &cases);
    assert_eq!((plain, special), (116, 7));
}

#[test]
fn reference_ids_decode_back_to_their_text() {
    check_round_trip(&tokenizer(), &load_cases(CASES));
}

#[test]
fn greedy_prompts_encode_like_llama_cpp() {
    assert_eq!(check_greedy_prompts(&tokenizer(), "smollm2-135m.greedy.jsonl"), 12);
}

#[test]
fn special_tokens_are_those_llama_cpp_reports() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_type(), VocabType::Bpe);
    assert_eq!(tok.n_vocab(), 49_152);
    assert!(!tok.add_bos() && !tok.add_space_prefix());
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.pad_id()), (Some(1), Some(2), Some(2)));
    assert_eq!(tok.unk_sep_mask_ids(), (Some(0), None, None));
    // Detected by text: <|im_end|> ends a turn, <reponame> is the FIM repository token.
    assert_eq!(tok.eot_id(), Some(2));
    assert_eq!(tok.fim_ids(), [None, None, None, None, Some(4), None]);
    // EOG: <|endoftext|> (by text), <|im_end|> (eos, eot), <reponame> (FIM repository).
    assert_eq!(tok.eog_ids(), [0, 2, 4]);
    assert!(tok.is_control(1) && !tok.is_eog(1));
}

#[test]
fn control_tokens_are_text_unless_parsed() {
    let tok = tokenizer();
    assert_eq!(tok.encode("<|im_end|>", true), [2]);
    let as_text = tok.encode("<|im_end|>", false);
    assert!(as_text.len() > 1 && !as_text.contains(&2), "{as_text:?}");
    assert_eq!(tok.decode(&as_text).ok().as_deref(), Some("<|im_end|>"));
}
