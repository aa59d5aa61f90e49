//! What several subcommands load from a model file: the GGUF, its tokenizer and chat template.

use std::path::Path;

use super::CliError;
use crate::chat::{ChatRequest, ChatTemplate, RenderOptions, parse_chat_request_json, require_chat_template};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

pub fn open_with_tokenizer(path: &Path) -> Result<(GgufFile, Tokenizer), CliError> {
    let f = GgufFile::open(path)?;
    let tok = Tokenizer::from_gguf(&f)?;
    Ok((f, tok))
}

/// The chat template in force (`--chat-template FILE`, else the model's), compiled; a model
/// without one is an error saying how to give one.
pub fn chat_template(f: &GgufFile, file: Option<&Path>) -> Result<ChatTemplate, CliError> {
    Ok(require_chat_template(f, file)?)
}

/// Reads a `--messages` file (an array of messages, or `{"messages": [...], "tools": [...]}`).
pub fn read_messages(path: &Path) -> Result<ChatRequest, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| CliError::ReadFile { path: path.to_path_buf(), source })?;
    parse_chat_request_json(&text).map_err(|e| CliError::Messages { path: path.to_path_buf(), source: e })
}

/// Renders a conversation with the template in force, BOS/EOS texts from the vocabulary.
pub fn render_chat(f: &GgufFile, file: Option<&Path>, tok: &Tokenizer, req: &ChatRequest, add_generation_prompt: bool) -> Result<String, CliError> {
    let template = chat_template(f, file)?;
    let opts = RenderOptions { add_generation_prompt, tools: req.tools.clone(), ..RenderOptions::for_tokenizer(tok) };
    Ok(template.render(&req.messages, &opts)?)
}
