//! What a request asks for, checked and compiled into a [`Grammar`] before any token is
//! generated.

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, TokenParser};
use serde_json::{Value as Json, json};

use super::error::GrammarError;
use super::gbnf::gbnf_to_lark;
use super::schema_check;
use super::vocab::GrammarVocab;

/// The separators JSON output uses unless a schema's `x-guidance` says otherwise: Python's
/// `json.dumps` style, `{"a": 1, "b": [2, 3]}`, with no other white space. Free white space
/// lets a small model wander off into newlines; this is also the form Qwen's tool-call
/// template shows.
pub const JSON_SEPARATORS: (&str, &str) = (", ", ": ");

/// A constraint on the generated text.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Text that is one JSON value valid under this JSON schema.
    JsonSchema(Json),
    /// Text that is one JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A grammar in llama.cpp's GBNF (the start rule is `root`).
    Gbnf(String),
    /// A grammar in llguidance's Lark syntax (the start rule is `start`; `%json {...}` embeds
    /// a schema).
    Lark(String),
    /// Free text until `trigger` appears; from the trigger on (itself included) the text must
    /// follow `then` (llama.cpp's lazy grammars: tool calls in an answer that may also be
    /// plain text).
    Triggered { trigger: String, then: Box<GrammarSpec> },
}

/// A compiled grammar: a matcher per generation comes from [`Grammar::matcher`].
#[derive(Clone)]
pub struct Grammar {
    parser: TokenParser,
    vocab: Arc<GrammarVocab>,
    compile_secs: f64,
    /// The grammar applies from this text on ([`GrammarSpec::Triggered`]); `None`: from the
    /// first token.
    trigger: Option<Vec<u8>>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("compile_secs", &self.compile_secs).finish_non_exhaustive()
    }
}

impl Grammar {
    /// A matcher at the start of the grammar.
    pub fn matcher(&self) -> Matcher {
        Matcher::new(Ok(self.parser.deep_clone()))
    }

    pub fn vocab(&self) -> &Arc<GrammarVocab> {
        &self.vocab
    }

    /// The text that switches the grammar on, for a triggered grammar.
    pub fn trigger(&self) -> Option<&[u8]> {
        self.trigger.as_deref()
    }

    /// The bytes token `id` stands for (special tokens: a 0xFF marker and their text).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let trie = self.vocab.factory().tok_env().tok_trie();
        if (id as usize) < trie.vocab_size() { trie.token(id) } else { &[] }
    }

    /// A matcher that has consumed `text` (the start of a triggered grammar's text): the text
    /// is tokenized as the model's tokenizer would; an error says why the grammar refused it.
    pub fn matcher_after(&self, text: &[u8]) -> Result<Matcher, String> {
        let mut m = self.matcher();
        let tokens = self.vocab.factory().tok_env().tokenize_bytes(text);
        m.consume_tokens(&tokens).map_err(|e| one_line(&e.to_string()))?;
        Ok(m)
    }

    /// Seconds the compilation took.
    pub fn compile_secs(&self) -> f64 {
        self.compile_secs
    }
}

/// `schema` with minfer's output defaults ([`JSON_SEPARATORS`], no free white space) under
/// `x-guidance`, unless the schema sets them itself. `true` becomes `{}`.
pub fn with_json_defaults(schema: &Json) -> Json {
    let mut s = match schema {
        Json::Bool(true) => json!({}),
        other => other.clone(),
    };
    if let Json::Object(m) = &mut s {
        let x = m.entry("x-guidance").or_insert_with(|| json!({}));
        if let Json::Object(x) = x {
            x.entry("whitespace_flexible").or_insert(json!(false));
            x.entry("item_separator").or_insert(json!(JSON_SEPARATORS.0));
            x.entry("key_separator").or_insert(json!(JSON_SEPARATORS.1));
        }
    }
    s
}

/// One line: llguidance's messages may span several (a regex error points under its text).
pub(super) fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(super) fn compile_schema(vocab: &GrammarVocab, schema: &Json) -> Result<TokenParser, String> {
    vocab.factory().create_parser(TopLevelGrammar::from_json_schema(with_json_defaults(schema))).map_err(|e| one_line(&e.to_string()))
}

impl GrammarSpec {
    /// Checks and compiles; errors say where the schema or grammar is wrong.
    pub fn compile(&self, vocab: &Arc<GrammarVocab>) -> Result<Grammar, GrammarError> {
        let t0 = Instant::now();
        if let GrammarSpec::Triggered { trigger, then } = self {
            if trigger.is_empty() || matches!(**then, GrammarSpec::Triggered { .. }) {
                return Err(GrammarError::Compile("a trigger must be non-empty text before a plain grammar".into()));
            }
            let inner = then.compile(vocab)?;
            return Ok(Grammar { trigger: Some(trigger.as_bytes().to_vec()), compile_secs: t0.elapsed().as_secs_f64(), ..inner });
        }
        let parser = match self {
            GrammarSpec::JsonSchema(schema) => {
                let schema = &schema_check::upgrade_tuples(schema);
                schema_check::check(schema)?;
                compile_schema(vocab, schema).map_err(|msg| schema_check::locate(vocab, schema, msg))?
            }
            GrammarSpec::JsonObject => compile_schema(vocab, &json!({"type": "object"})).map_err(GrammarError::Compile)?,
            GrammarSpec::Gbnf(text) => compile_lark(vocab, &gbnf_to_lark(text)?)?,
            GrammarSpec::Lark(text) => compile_lark(vocab, text)?,
            GrammarSpec::Triggered { .. } => return Err(GrammarError::Compile("a triggered grammar nested in another".into())),
        };
        // The first mask, once: a grammar whose language turns out empty (`root ::= root "a"`)
        // is refused here rather than failing mid-generation.
        Matcher::new(Ok(parser.deep_clone())).compute_mask().map_err(|e| GrammarError::Compile(format!("no text can follow it: {}", one_line(&e.to_string()))))?;
        Ok(Grammar { parser, vocab: vocab.clone(), compile_secs: t0.elapsed().as_secs_f64(), trigger: None })
    }

    /// Checks a JSON schema that will be embedded in a Lark grammar (`%json {...}`), so that
    /// its errors name their place.
    pub fn check_schema(schema: &Json) -> Result<(), GrammarError> {
        schema_check::check(&schema_check::upgrade_tuples(schema))
    }

    /// `%json {...}` for a Lark grammar: `schema` with minfer's output defaults.
    pub fn lark_json(schema: &Json) -> String {
        format!("%json {}", with_json_defaults(&schema_check::upgrade_tuples(schema)))
    }
}

fn compile_lark(vocab: &GrammarVocab, text: &str) -> Result<TokenParser, GrammarError> {
    vocab.factory().create_parser(TopLevelGrammar::from_lark(text.to_string())).map_err(|e| GrammarError::Compile(one_line(&e.to_string())))
}
