//! Why a schema or grammar was refused.

/// A schema or grammar that cannot be enforced, with where it went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// The schema is invalid or uses something the engine cannot enforce. `path` is where,
    /// in dotted form from the schema's root (`properties.age.minimum`; empty: the root).
    #[error("{}{message}", at(path))]
    Schema { path: String, message: String },
    /// A GBNF grammar does not parse: `line` and `column` count from 1.
    #[error("line {line}, column {column}: {message}")]
    Gbnf { line: usize, column: usize, message: String },
    /// The grammar compiler refused a (converted) grammar.
    #[error("{0}")]
    Compile(String),
    /// The vocabulary could not be turned into a token trie.
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocab(String),
}

fn at(path: &str) -> String {
    if path.is_empty() { String::new() } else { format!("{path}: ") }
}

impl GrammarError {
    /// The same error with `prefix` in front of its place (the request field that held the
    /// schema, say `response_format.json_schema.schema`).
    pub fn under(self, prefix: &str) -> GrammarError {
        match self {
            GrammarError::Schema { path, message } => {
                let path = if path.is_empty() { prefix.to_string() } else { format!("{prefix}.{path}") };
                GrammarError::Schema { path, message }
            }
            other => other,
        }
    }

    /// The place, for errors that have one (`None`: the whole schema or grammar).
    pub fn path(&self) -> Option<String> {
        match self {
            GrammarError::Schema { path, .. } if !path.is_empty() => Some(path.clone()),
            GrammarError::Gbnf { line, column, .. } => Some(format!("line {line}, column {column}")),
            _ => None,
        }
    }
}
