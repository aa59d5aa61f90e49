//! The model's vocabulary as llguidance's token trie: built once per model (a 150k vocabulary
//! takes about half a second) and shared by every request through an `Arc`.
//!
//! Each token is its raw bytes, so a grammar sees text exactly as the detokenizer writes it.
//! Control tokens and end-of-generation tokens are "special" (a 0xFF marker before their
//! text): no text of a grammar can produce them, so they are never allowed inside a grammar;
//! the end-of-generation tokens are allowed exactly where the grammar may stop.

use std::sync::Arc;
use std::time::Instant;

use llguidance::ParserFactory;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::error::GrammarError;
use crate::tokenizer::Tokenizer;

/// The token trie and the grammar compiler of one model.
pub struct GrammarVocab {
    factory: ParserFactory,
    eog: Vec<u32>,
    /// How long building the trie and the compiler took.
    build_secs: f64,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab").field("eog", &self.eog).field("build_secs", &self.build_secs).finish_non_exhaustive()
    }
}

/// llguidance's view of the tokenizer: the trie, and our own tokenizer for the bytes a grammar
/// forces (so forced text is tokenized as the model saw such text in training).
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            // A SentencePiece vocabulary that puts a space in front of a text would change the
            // bytes: greedy over the trie then.
            Ok(_) if self.tok.add_space_prefix() => self.trie.greedy_tokenize(s),
            Ok(text) => self.tok.encode(text, false),
            // A forced prefix can end inside a code point: greedy over the trie then.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl GrammarVocab {
    pub fn new(tok: Arc<Tokenizer>) -> Result<GrammarVocab, GrammarError> {
        let t0 = Instant::now();
        let n = tok.n_vocab();
        let eog = tok.eog_ids();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = tok.token_bytes(id).map_err(|e| GrammarError::Vocab(e.to_string()))?;
            if tok.is_control(id) || tok.is_eog(id) {
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(bytes);
                words.push(w);
            } else {
                words.push(bytes.to_vec());
            }
        }
        let first_eog = tok.eos_id().or_else(|| eog.first().copied()).ok_or_else(|| GrammarError::Vocab("it has no end-of-generation token".into()))?;
        let info = TokRxInfo::new(n as u32, first_eog);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocab(e.to_string()))?;
        factory.quiet();
        // Errors are one line: no parser state dump.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarVocab { factory, eog, build_secs: t0.elapsed().as_secs_f64() })
    }

    pub fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    /// The tokens that end a generation, ascending.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Seconds building the trie and compiler took (reported by `minfer bench`).
    pub fn build_secs(&self) -> f64 {
        self.build_secs
    }

    /// Tokens in the trie.
    pub fn n_vocab(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}
