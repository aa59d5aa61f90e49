//! `--json-schema`, `--json-object` and `--grammar` of `run` and `chat`: structured output.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::CliError;
use crate::grammar::{Grammar, GrammarSpec, GrammarVocab};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Args, Default)]
pub struct GrammarArgs {
    /// Constrain the answer to JSON valid under this JSON schema: a file, or the schema itself
    /// (text starting with `{`).
    #[arg(long, value_name = "FILE|JSON", allow_hyphen_values = true, conflicts_with_all = ["json_object", "grammar"])]
    pub json_schema: Option<String>,
    /// Constrain the answer to one JSON object.
    #[arg(long, conflicts_with = "grammar")]
    pub json_object: bool,
    /// Constrain the answer to a GBNF grammar (llama.cpp's format; the start rule is `root`).
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub grammar: Option<PathBuf>,
}

impl GrammarArgs {
    /// Whether a constraint was asked for.
    pub fn is_set(&self) -> bool {
        self.json_schema.is_some() || self.json_object || self.grammar.is_some()
    }

    /// What was asked for (`None`: free text); files are read and JSON parsed here.
    pub fn spec(&self) -> Result<Option<(GrammarSpec, &'static str)>, CliError> {
        if let Some(s) = &self.json_schema {
            let text = if s.trim_start().starts_with('{') {
                s.clone()
            } else {
                let path = PathBuf::from(s);
                std::fs::read_to_string(&path).map_err(|source| CliError::ReadFile { path, source })?
            };
            let schema = serde_json::from_str(&text).map_err(|e| CliError::Grammar(format!("--json-schema: not JSON: {e}")))?;
            return Ok(Some((GrammarSpec::JsonSchema(schema), "--json-schema")));
        }
        if self.json_object {
            return Ok(Some((GrammarSpec::JsonObject, "--json-object")));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadFile { path: path.clone(), source })?;
            return Ok(Some((GrammarSpec::Gbnf(text), "--grammar")));
        }
        Ok(None)
    }

    /// The compiled grammar for `tok`'s vocabulary; an error is one line naming the flag and
    /// the place.
    pub fn compile(&self, tok: &Arc<Tokenizer>) -> Result<Option<Grammar>, CliError> {
        let Some((spec, flag)) = self.spec()? else { return Ok(None) };
        let vocab = Arc::new(GrammarVocab::new(tok.clone()).map_err(|e| CliError::Grammar(e.to_string()))?);
        spec.compile(&vocab).map(Some).map_err(|e| CliError::Grammar(format!("{flag}: {e}")))
    }
}
