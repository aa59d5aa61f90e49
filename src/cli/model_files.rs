//! What several subcommands load from a model file: the GGUF, its tokenizer and chat template.

use std::path::Path;

use super::CliError;
use crate::chat::{ChatRequest, ChatTemplate, RenderOptions, parse_chat_request_json};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

pub fn open_with_tokenizer(path: &Path) -> Result<(GgufFile, Tokenizer), CliError> {
    let f = GgufFile::open(path)?;
    let tok = Tokenizer::from_gguf(&f)?;
    Ok((f, tok))
}

/// The model's chat template, compiled; a model without one is an error naming the key.
pub fn chat_template(f: &GgufFile) -> Result<ChatTemplate, CliError> {
    let src = f.get_str("tokenizer.chat_template")?;
    Ok(ChatTemplate::new("tokenizer.chat_template", src)?)
}

/// Reads a `--messages` file (an array of messages, or `{"messages": [...], "tools": [...]}`).
pub fn read_messages(path: &Path) -> Result<ChatRequest, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| CliError::ReadFile { path: path.to_path_buf(), source })?;
    parse_chat_request_json(&text).map_err(|e| CliError::Messages { path: path.to_path_buf(), source: e })
}

/// Renders a conversation with the model's own template, BOS/EOS texts from its vocabulary.
pub fn render_chat(f: &GgufFile, tok: &Tokenizer, req: &ChatRequest, add_generation_prompt: bool) -> Result<String, CliError> {
    let template = chat_template(f)?;
    let opts = RenderOptions { add_generation_prompt, tools: req.tools.clone(), ..RenderOptions::for_tokenizer(tok) };
    Ok(template.render(&req.messages, &opts)?)
}
