//! Structured output: grammars that constrain generation token by token.
//!
//! The engine underneath is llguidance (the constrained-decoding library llama.cpp, vLLM and
//! SGLang embed). This module is the seam between it and minfer:
//!
//! * [`GrammarVocab`] — the model's vocabulary as llguidance's token trie, built once per model
//!   and shared by every request (`vocab.rs`);
//! * [`GrammarSpec`] — what a request asks for (a JSON schema, any JSON object, a GBNF or Lark
//!   grammar), checked and compiled into a [`Grammar`] before any token is generated; errors
//!   name the place in the schema or grammar that is wrong (`spec.rs`, `schema_check.rs`,
//!   `gbnf.rs`);
//! * [`Grammar::matcher`] — a fresh matcher per generation, driven by the sampler chain
//!   (`generate::constraint`).

mod error;
mod gbnf;
mod schema_check;
mod spec;
mod vocab;

pub use error::GrammarError;
pub use gbnf::gbnf_to_lark;
pub use spec::{Grammar, GrammarSpec, JSON_SEPARATORS};
pub use vocab::GrammarVocab;

pub use llguidance::Matcher;
pub use toktrie::SimpleVob as TokenMask;
