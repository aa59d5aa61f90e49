//! The tokenizer's error type.

use thiserror::Error;

use crate::gguf::GgufError;

/// Everything that can go wrong while building a [`super::Tokenizer`] or using it.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error(
        "unsupported tokenizer model {model:?}: supported are \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)"
    )]
    UnsupportedModel { model: String },

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement (byte-level BPE
    /// vocabularies only; SentencePiece ignores it, as llama.cpp does).
    #[error("unsupported pre-tokenizer {pre:?}: supported are {supported}")]
    UnsupportedPreTokenizer { pre: String, supported: String },

    /// `tokenizer.ggml.scores` is present but shorter than the token list.
    #[error("scores has {got} entries but the vocabulary has {n_vocab} tokens")]
    ScoreCount { got: usize, n_vocab: usize },

    /// The vocabulary has no tokens at all.
    #[error("the vocabulary is empty")]
    EmptyVocabulary,

    /// The vocabulary has more entries than a `u32` token id can address.
    #[error("the vocabulary has {n_vocab} tokens, more than u32 ids can address")]
    VocabularyTooLarge { n_vocab: usize },

    /// `tokenizer.ggml.token_type` is present but shorter than the token list.
    #[error("token_type has {got} entries but the vocabulary has {n_vocab} tokens")]
    TokenTypeCount { got: usize, n_vocab: usize },

    /// Two vocabulary entries have the same text (llama.cpp refuses such a vocabulary too).
    #[error("token text {text:?} appears twice, at ids {first} and {second}")]
    DuplicateToken { text: String, first: u32, second: u32 },

    /// A `tokenizer.ggml.merges` line is not of the form `"left right"`.
    #[error("merge line {line} ({text:?}) is malformed: {reason}")]
    BadMerge { line: usize, text: String, reason: &'static str },

    /// A special token id from the metadata does not name a vocabulary entry.
    #[error("special token {role} has id {id}, but the vocabulary has only {n_vocab} tokens")]
    SpecialIdOutOfRange { role: &'static str, id: u32, n_vocab: usize },

    /// A token id passed to a lookup or to decoding is not in the vocabulary.
    #[error("token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    TokenIdOutOfRange { id: u32, n_vocab: usize },

    /// Bytes handed to `encode_bytes` are not valid UTF-8.
    #[error("input is not valid UTF-8: bad sequence at byte offset {offset}")]
    InvalidUtf8 {
        /// Byte offset of the first invalid sequence (everything before it is valid).
        offset: usize,
        /// Length of the invalid sequence, `None` if the input ends inside a code point.
        invalid_len: Option<usize>,
    },

    /// The GGUF metadata lacks a required tokenizer key or has one of the wrong type.
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
}
