//! Where a chat template comes from: a file the user names (`--chat-template FILE`, on `run`,
//! `chat`, `template`, `serve` and `viz`), else the model's own `tokenizer.chat_template`. A model with
//! neither has no chat mode: callers that need one refuse with [`NO_TEMPLATE`], never a
//! made-up format.

use std::path::{Path, PathBuf};

use super::{ChatTemplate, TemplateError};
use crate::gguf::GgufFile;

/// The one-line refusal of a chat request to a model without a template.
pub const NO_TEMPLATE: &str = "this model has no chat template; use --chat-template FILE or a raw prompt";

#[derive(Debug, thiserror::Error)]
pub enum TemplateSourceError {
    #[error("cannot read the chat template {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Compile(#[from] TemplateError),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("{}", NO_TEMPLATE)]
    Missing,
}

/// The template in force: `file`'s when given, else the model's; `Ok(None)` when neither.
/// A file that cannot be read, or a template that does not compile, is an error.
pub fn chat_template_for(f: &GgufFile, file: Option<&Path>) -> Result<Option<ChatTemplate>, TemplateSourceError> {
    if let Some(path) = file {
        // A name llama.cpp knows (`chatml`, `llama3`, …) when no such file exists.
        if !path.exists()
            && let Some(src) = path.to_str().and_then(super::builtin::builtin)
        {
            return Ok(Some(ChatTemplate::new(&path.display().to_string(), src)?));
        }
        let src = std::fs::read_to_string(path).map_err(|source| TemplateSourceError::Read { path: path.to_path_buf(), source })?;
        return Ok(Some(ChatTemplate::new(&path.display().to_string(), &src)?));
    }
    match f.opt_str("tokenizer.chat_template")? {
        Some(src) => Ok(Some(ChatTemplate::new("tokenizer.chat_template", src)?)),
        None => Ok(None),
    }
}

/// Like [`chat_template_for`], a missing template being [`TemplateSourceError::Missing`].
pub fn require_chat_template(f: &GgufFile, file: Option<&Path>) -> Result<ChatTemplate, TemplateSourceError> {
    chat_template_for(f, file)?.ok_or(TemplateSourceError::Missing)
}
