//! Text to token ids and back, matching llama.cpp (`src/llama-vocab.cpp`) for two vocabulary
//! types ([`VocabType`]):
//! * byte-level BPE (`tokenizer.ggml.model` = `"gpt2"`) with the pre-tokenizers listed in
//!   [`pretokenize::PRE_TOKENIZERS`] (Qwen2/2.5/3, Llama 3, GPT-2, StarCoder/SmolLM, …);
//! * SentencePiece (`"llama"`): score-ordered merges with byte fallback (Gemma, Llama 2, …).
//!
//! Encoding runs in stages, each in its own module:
//! 1. [`special`]: special-token text is cut out of the input (only user-defined tokens unless
//!    `parse_special`), exactly in llama.cpp's order;
//! 2. BPE: [`pretokenize`] splits the remaining text fragments into words, and [`bpe`] merges
//!    each word's bytes into tokens by rank; SentencePiece: [`spm`] escapes spaces and merges
//!    each whole fragment by score.
//!
//! [`decode`] turns ids back into bytes and text, including a streaming decoder.
//!
//! The tokenizer is built from plain data ([`TokenizerData`]), so it does not depend on where the
//! vocabulary comes from; `from_gguf` reads that data from a model file.

mod bpe;
mod byte_level;
mod decode;
mod error;
mod gguf;
mod pretokenize;
mod special;
mod spm;
mod unicode_classes;
mod vocab;

pub use decode::StreamDecoder;
pub use error::TokenizerError;

use bpe::{Bpe, BpeScratch, WordCache};
use byte_level::BYTE_TO_CHAR;
use decode::Pieces;
use pretokenize::{PreTokenizer, SplitScratch};
use special::{Fragment, SpecialIds, SpecialMatcher, attr};
use spm::{Spm, SpmScratch};
use vocab::Vocab;

/// The tokenization algorithm of a vocabulary, from `tokenizer.ggml.model` (llama.cpp's
/// `llama_vocab_type`, for the types this crate implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabType {
    /// `"gpt2"`: byte-level BPE with merges and a pre-tokenizer.
    Bpe,
    /// `"llama"`: SentencePiece, scored tokens and `<0xNN>` byte fallback.
    Spm,
}

impl VocabType {
    /// The type `tokenizer.ggml.model` = `model` names, if supported.
    pub fn from_model_name(model: &str) -> Option<VocabType> {
        match model {
            "gpt2" => Some(VocabType::Bpe),
            "llama" => Some(VocabType::Spm),
            _ => None,
        }
    }

    /// llama.cpp's `add_bos` when `tokenizer.ggml.add_bos_token` is absent.
    pub(crate) fn default_add_bos(self, pre: &str) -> bool {
        match self {
            VocabType::Spm => true,
            VocabType::Bpe => pretokenize::pre_tokenizer(pre).is_some_and(|p| p.add_bos_default),
        }
    }

    /// llama.cpp's `add_space_prefix` when `tokenizer.ggml.add_space_prefix` is absent.
    pub(crate) fn default_add_space_prefix(self) -> bool {
        self == VocabType::Spm
    }
}

/// The merge algorithm and its tables (boxed: both hold large fixed tables).
#[derive(Debug)]
enum Model {
    Bpe { bpe: Box<Bpe>, pre: PreTokenizer },
    Spm(Box<Spm>),
}

/// Everything a [`Tokenizer`] is built from: the `tokenizer.ggml.*` metadata of a GGUF file.
/// Special ids are `None` when the metadata does not have them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerData {
    /// `tokenizer.ggml.model`: `"gpt2"` or `"llama"` (see [`VocabType`]).
    pub model: String,
    /// `tokenizer.ggml.pre`; for `"gpt2"`, one of the supported pre-tokenizers (ignored for
    /// `"llama"`, as in llama.cpp).
    pub pre: String,
    /// `tokenizer.ggml.tokens`, in byte-level text form (BPE) or with spaces as `▁` (SPM).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities, higher first). Empty means all
    /// 0, as in llama.cpp; otherwise one per token. Unused by BPE.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte. Empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, highest priority first, each `"left right"` (BPE only).
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub sep_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub mask_id: Option<u32>,
    pub fim_pre_id: Option<u32>,
    pub fim_suf_id: Option<u32>,
    pub fim_mid_id: Option<u32>,
    pub fim_pad_id: Option<u32>,
    pub fim_rep_id: Option<u32>,
    pub fim_sep_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix`: SentencePiece puts a space in front of the text (and
    /// after each special token); detokenizing drops the first token's leading space.
    pub add_space_prefix: bool,
}

/// A byte-level BPE or SentencePiece tokenizer. Immutable once built; share it freely between
/// threads.
#[derive(Debug)]
pub struct Tokenizer {
    vocab_type: VocabType,
    vocab: Vocab,
    attrs: Vec<u32>,
    model: Model,
    matcher: SpecialMatcher,
    pieces: Pieces,
    special: SpecialIds,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl Tokenizer {
    /// Builds a tokenizer, checking the data as it goes.
    pub fn new(mut data: TokenizerData) -> Result<Tokenizer, TokenizerError> {
        let Some(vocab_type) = VocabType::from_model_name(&data.model) else {
            return Err(TokenizerError::UnsupportedModel { model: data.model });
        };
        let pre = match vocab_type {
            VocabType::Bpe => match pretokenize::pre_tokenizer(&data.pre) {
                Some(pre) => Some(pre),
                None => {
                    return Err(TokenizerError::UnsupportedPreTokenizer {
                        pre: data.pre,
                        supported: pretokenize::supported_pre_names(),
                    });
                }
            },
            VocabType::Spm => None,
        };
        let n_vocab = data.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }

        // llama.cpp renames empty entries so that they cannot match anything.
        let mut tokens = std::mem::take(&mut data.tokens);
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let vocab = Vocab::new(&tokens)?;
        drop(tokens);

        let mut attrs = special::attrs_from_types(&data.token_types, n_vocab)?;
        let special = special::resolve_special_ids(&data, vocab_type, &vocab, &mut attrs)?;
        let model = match pre {
            Some(pre) => Model::Bpe { bpe: Box::new(Bpe::new(&data.merges, &vocab)?), pre },
            None => Model::Spm(Box::new(Spm::new(&data.scores, &vocab, special.unk, data.add_space_prefix)?)),
        };
        let matcher = SpecialMatcher::new(&vocab, &attrs);
        let pieces = Pieces::new(&vocab, &attrs, vocab_type);
        Ok(Tokenizer {
            vocab_type,
            vocab,
            attrs,
            model,
            matcher,
            pieces,
            special,
            add_bos: data.add_bos,
            add_eos: data.add_eos,
            add_space_prefix: data.add_space_prefix,
        })
    }

    /// The vocabulary's tokenization algorithm.
    pub fn vocab_type(&self) -> VocabType {
        self.vocab_type
    }

    /// Token ids of `text`, without BOS (see [`Tokenizer::add_bos`]). With `parse_special`,
    /// control-token text such as `<|im_end|>` becomes that token; without it, only
    /// user-defined tokens (e.g. `<tool_call>` in Qwen2.5) are recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut fragments = Vec::new();
        self.matcher.partition(text, parse_special, &mut fragments);
        match &self.model {
            Model::Bpe { bpe, pre } => self.encode_bpe(bpe, *pre, text, &fragments, &mut out),
            Model::Spm(spm) => self.encode_spm(spm, text, &fragments, &mut out),
        }
        out
    }

    fn encode_bpe(&self, bpe: &Bpe, pre: PreTokenizer, text: &str, fragments: &[Fragment], out: &mut Vec<u32>) {
        let mut split_scratch = SplitScratch::default();
        let mut bpe_scratch = BpeScratch::default();
        let mut cache = WordCache::default();
        let mut byte_level = String::new();
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => out.push(*id),
                Fragment::Text(range) => {
                    let Some(part) = text.get(range.clone()) else { continue };
                    pretokenize::split(pre.splitter, part, &mut split_scratch, |word| {
                        if pre.ignore_merges {
                            // llama.cpp looks the whole word up first (in byte-level form).
                            byte_level.clear();
                            byte_level.extend(word.bytes().map(|b| BYTE_TO_CHAR[usize::from(b)]));
                            if let Some(id) = self.vocab.id(&byte_level) {
                                out.push(id);
                                return;
                            }
                        }
                        bpe.encode_word_cached(word.as_bytes(), &mut bpe_scratch, &mut cache, out);
                    });
                }
            }
        }
    }

    /// llama.cpp's SPM branch of `tokenize`: each text fragment is merged on its own; the
    /// space prefix goes in front of the first fragment and of each one after a special token.
    fn encode_spm(&self, spm: &Spm, text: &str, fragments: &[Fragment], out: &mut Vec<u32>) {
        let mut scratch = SpmScratch::default();
        let mut after_special = true;
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => {
                    out.push(*id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    let Some(part) = text.get(range.clone()) else { continue };
                    spm.encode_fragment(part, after_special, &self.vocab, &mut scratch, out);
                    after_special = false;
                }
            }
        }
    }

    /// The ids of a prompt to evaluate: [`Tokenizer::encode`], with BOS first when the model
    /// asks for one ([`Tokenizer::add_bos`]) and the text does not already begin with it (a
    /// chat template that writes `{{ bos_token }}`, parsed with special tokens).
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = self.encode(text, parse_special);
        if let Some(bos) = self.bos_id().filter(|_| self.add_bos)
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        ids
    }

    /// The ids of a text to embed: llama.cpp's tokenization with `add_special` (BOS first and
    /// EOS last, each when the model asks for it), special tokens parsed.
    pub fn encode_input(&self, text: &str) -> Vec<u32> {
        let mut ids = self.encode_prompt(text, true);
        if let Some(eos) = self.eos_id().filter(|_| self.add_eos)
            && ids.last() != Some(&eos)
        {
            ids.push(eos);
        }
        ids
    }

    /// Like [`Tokenizer::encode`], for bytes that should be UTF-8; anything else is an error.
    pub fn encode_bytes(&self, bytes: &[u8], parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let text = std::str::from_utf8(bytes).map_err(|e| TokenizerError::InvalidUtf8 {
            offset: e.valid_up_to(),
            invalid_len: e.error_len(),
        })?;
        Ok(self.encode(text, parse_special))
    }

    /// The raw bytes token `id` stands for (control tokens render as their text).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.pieces.get(id).ok_or(TokenizerError::TokenIdOutOfRange { id, n_vocab: self.n_vocab() })
    }

    /// The bytes of token `id` as llama.cpp's `token_to_piece` gives them: with
    /// `render_special == false`, control and unknown tokens render as nothing.
    pub fn token_piece(&self, id: u32, render_special: bool) -> Result<&[u8], TokenizerError> {
        let bytes = self.token_bytes(id)?;
        let hidden = self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0;
        Ok(if hidden && !render_special { &[] } else { bytes })
    }

    /// The text of `ids`, rendering special tokens; byte sequences that are not valid UTF-8
    /// become U+FFFD (only those: a code point split across tokens decodes whole).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, true)
    }

    /// [`Tokenizer::decode`], choosing whether control and unknown tokens are rendered.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_piece(id, render_special)?);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
    }

    /// llama.cpp's `llama_detokenize` (with `remove_special = false`): [`Tokenizer::decode_with`],
    /// except that with `add_space_prefix` (SentencePiece) the first token's leading space is
    /// dropped, undoing the space that encoding put in front. Without `add_space_prefix` (all
    /// byte-level BPE vocabularies, Gemma) it equals `decode_with`. llama.cpp's `clean_spaces`
    /// post-processing of some BPE vocabularies (not Qwen2 or SmolLM) is not applied.
    pub fn detokenize(&self, ids: &[u32], render_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_piece(id, render_special)?;
            let piece = match piece {
                [b' ', rest @ ..] if i == 0 && self.add_space_prefix => rest,
                _ => piece,
            };
            bytes.extend_from_slice(piece);
        }
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
    }

    /// Whether encoding puts a space in front of the text (SentencePiece `add_space_prefix`).
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// A streaming decoder over this tokenizer.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// Whether generation should stop at `id`: the end-of-generation set llama.cpp builds
    /// (eos, eot, eom, FIM pad/repo/file-separator tokens and the known end-of-turn texts).
    pub fn is_eog(&self, id: u32) -> bool {
        self.special.eog.contains(&id)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.special.eog.iter().copied().collect()
    }

    /// Whether `id` is a control token (rendered only on request, never produced from text
    /// unless special tokens are parsed).
    pub fn is_control(&self, id: u32) -> bool {
        self.attr(id) & attr::CONTROL != 0
    }

    fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(attr::UNDEFINED)
    }

    /// Number of entries in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The vocabulary entry of `id` in its stored (byte-level) form.
    pub fn token_text(&self, id: u32) -> Result<&str, TokenizerError> {
        self.vocab.get(id).ok_or(TokenizerError::TokenIdOutOfRange { id, n_vocab: self.n_vocab() })
    }

    /// The id of the vocabulary entry whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// Whether callers should put [`Tokenizer::bos_id`] in front of a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether callers should append [`Tokenizer::eos_id`] to a prompt.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Beginning-of-sequence token (llama.cpp defaults it to 11 for "gpt2" vocabularies, 1 for
    /// "llama" ones).
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    /// End-of-sequence token (llama.cpp defaults it to 11 for "gpt2" vocabularies, 2 for
    /// "llama" ones).
    pub fn eos_id(&self) -> Option<u32> {
        self.special.eos
    }

    /// End-of-turn token, from the metadata or detected by its text (`<|im_end|>`, …).
    pub fn eot_id(&self) -> Option<u32> {
        self.special.eot
    }

    /// Padding token.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad
    }

    /// End-of-message token (`<|eom_id|>`).
    pub fn eom_id(&self) -> Option<u32> {
        self.special.eom
    }

    /// Unknown, separator and mask tokens.
    pub fn unk_sep_mask_ids(&self) -> (Option<u32>, Option<u32>, Option<u32>) {
        (self.special.unk, self.special.sep, self.special.mask)
    }

    /// Fill-in-the-middle tokens: prefix, suffix, middle, pad, repository name, file separator.
    pub fn fim_ids(&self) -> [Option<u32>; 6] {
        let s = &self.special;
        [s.fim_pre, s.fim_suf, s.fim_mid, s.fim_pad, s.fim_rep, s.fim_sep]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(pre: &str) -> Tokenizer {
        let data = TokenizerData {
            model: "gpt2".into(),
            pre: pre.into(),
            tokens: ["a", "b", "c", "abc", "ab", "1", "12", "123", "2", "3"].iter().map(|t| (*t).to_owned()).collect(),
            merges: vec!["a b".into(), "1 2".into(), "12 3".into()],
            ..TokenizerData::default()
        };
        Tokenizer::new(data).unwrap_or_else(|e| panic!("{pre}: {e}"))
    }

    /// llama.cpp's `ignore_merges` (LLAMA3 pre-type only): a word that is an entry as a whole
    /// is that entry even when the merges cannot reach it ("abc" has no merge path here).
    #[test]
    fn llama3_takes_whole_words_that_are_entries() {
        assert_eq!(toy("llama3").encode("abc", false), [3]);
        // DBRX has the same regex without ignore_merges; Qwen2 neither.
        assert_eq!(toy("dbrx").encode("abc", false), [4, 2]);
        assert_eq!(toy("qwen2").encode("abc", false), [4, 2]);
    }

    /// The digit rules of each splitter, seen through the ids.
    #[test]
    fn digits_are_grouped_per_pre_tokenizer() {
        assert_eq!(toy("qwen2").encode("123", false), [5, 8, 9]);
        assert_eq!(toy("smollm").encode("123", false), [5, 8, 9]);
        assert_eq!(toy("llama3").encode("123", false), [7]);
        assert_eq!(toy("gpt-2").encode("123", false), [7]);
        assert_eq!(toy("llama3").encode("1231", false), [7, 5]);
        assert_eq!(toy("gpt-2").encode("1231", false), [7, 5]);
        assert_eq!(toy("gpt-2").encode("12312", false), [7, 6]);
        assert_eq!(toy("llama3").encode("12312", false), [7, 6]);
    }

    #[test]
    fn add_bos_defaults_follow_llama_cpp() {
        assert!(VocabType::Spm.default_add_bos("anything"));
        assert!(VocabType::Bpe.default_add_bos("llama-bpe"));
        assert!(!VocabType::Bpe.default_add_bos("smollm"));
        assert!(!VocabType::Bpe.default_add_bos("dbrx"));
        assert!(VocabType::Spm.default_add_space_prefix() && !VocabType::Bpe.default_add_space_prefix());
    }
}
