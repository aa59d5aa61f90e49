//! Text to token ids and back, matching llama.cpp for byte-level BPE vocabularies with the Qwen2
//! pre-tokenizer (Qwen2, Qwen2.5, Qwen3 and their derivatives).
//!
//! Encoding runs in three stages, each in its own module:
//! 1. [`special`]: special-token text is cut out of the input (only user-defined tokens unless
//!    `parse_special`), exactly in llama.cpp's order;
//! 2. [`pretokenize`]: the remaining text fragments are split into words with the Qwen2 rules;
//! 3. [`bpe`]: each word's bytes are merged into tokens by rank.
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
mod unicode_classes;

use std::collections::HashMap;

pub use decode::StreamDecoder;
pub use error::TokenizerError;

use bpe::{Bpe, BpeScratch, WordCache};
use decode::Pieces;
use pretokenize::{SplitScratch, split_qwen2};
use special::{Fragment, SpecialIds, SpecialMatcher, attr};

/// `tokenizer.ggml.pre` values that select the Qwen2 pre-tokenizer in llama.cpp.
const QWEN2_PRE_NAMES: &[&str] = &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"];

/// Everything a [`Tokenizer`] is built from: the `tokenizer.ggml.*` metadata of a GGUF file.
/// Special ids are `None` when the metadata does not have them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerData {
    /// `tokenizer.ggml.model`; must be `"gpt2"`.
    pub model: String,
    /// `tokenizer.ggml.pre`; must select the Qwen2 pre-tokenizer.
    pub pre: String,
    /// `tokenizer.ggml.tokens`, in byte-level text form.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte. Empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, highest priority first, each `"left right"`.
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
}

/// A byte-level BPE tokenizer. Immutable once built; share it freely between threads.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    attrs: Vec<u32>,
    token_to_id: HashMap<String, u32>,
    bpe: Bpe,
    matcher: SpecialMatcher,
    pieces: Pieces,
    special: SpecialIds,
    add_bos: bool,
    add_eos: bool,
}

impl Tokenizer {
    /// Builds a tokenizer, checking the data as it goes.
    pub fn new(mut data: TokenizerData) -> Result<Tokenizer, TokenizerError> {
        if data.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel { model: data.model });
        }
        if !QWEN2_PRE_NAMES.contains(&data.pre.as_str()) {
            return Err(TokenizerError::UnsupportedPreTokenizer {
                pre: data.pre,
                supported: "\"qwen2\", \"deepseek-r1-qwen\", \"kormo\", \"f2llmv2\"",
            });
        }
        let n_vocab = data.tokens.len();
        if n_vocab == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }
        let n_vocab_u32 = u32::try_from(n_vocab).map_err(|_| TokenizerError::VocabularyTooLarge { n_vocab })?;

        // llama.cpp renames empty entries so that they cannot match anything.
        let mut tokens = std::mem::take(&mut data.tokens);
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let mut token_to_id = HashMap::with_capacity(n_vocab);
        for (id, text) in (0..n_vocab_u32).zip(&tokens) {
            if let Some(first) = token_to_id.insert(text.clone(), id) {
                return Err(TokenizerError::DuplicateToken { text: text.clone(), first, second: id });
            }
        }

        let mut attrs = special::attrs_from_types(&data.token_types, n_vocab)?;
        let special = special::resolve_special_ids(&data, &token_to_id, &mut attrs)?;
        let bpe = Bpe::new(&data.merges, &token_to_id, n_vocab_u32)?;
        let matcher = SpecialMatcher::new(&tokens, &attrs);
        let pieces = Pieces::new(&tokens, &attrs);
        Ok(Tokenizer {
            tokens,
            attrs,
            token_to_id,
            bpe,
            matcher,
            pieces,
            special,
            add_bos: data.add_bos,
            add_eos: data.add_eos,
        })
    }

    /// Token ids of `text`, without BOS (see [`Tokenizer::add_bos`]). With `parse_special`,
    /// control-token text such as `<|im_end|>` becomes that token; without it, only
    /// user-defined tokens (e.g. `<tool_call>` in Qwen2.5) are recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut fragments = Vec::new();
        self.matcher.partition(text, parse_special, &mut fragments);
        let mut split_scratch = SplitScratch::default();
        let mut bpe_scratch = BpeScratch::default();
        let mut cache = WordCache::default();
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(range) => {
                    let Some(part) = text.get(range) else { continue };
                    split_qwen2(part, &mut split_scratch, |word| {
                        self.bpe.encode_word_cached(word.as_bytes(), &mut bpe_scratch, &mut cache, &mut out);
                    });
                }
            }
        }
        out
    }

    /// The ids of a prompt to evaluate: [`Tokenizer::encode`], with BOS first when the model
    /// asks for one ([`Tokenizer::add_bos`]) and the text does not already begin with it (a
    /// chat template that writes `{{ bos_token }}`, parsed with special tokens).
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = self.encode(text, parse_special);
        if let Some(bos) = self.bos_id().filter(|_| self.add_bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
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
        self.tokens.len()
    }

    /// The vocabulary entry of `id` in its stored (byte-level) form.
    pub fn token_text(&self, id: u32) -> Result<&str, TokenizerError> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .ok_or(TokenizerError::TokenIdOutOfRange { id, n_vocab: self.n_vocab() })
    }

    /// The id of the vocabulary entry whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Whether callers should put [`Tokenizer::bos_id`] in front of a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether callers should append [`Tokenizer::eos_id`] to a prompt.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Beginning-of-sequence token (llama.cpp defaults it to 11 for "gpt2" vocabularies).
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    /// End-of-sequence token (llama.cpp defaults it to 11 for "gpt2" vocabularies).
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
