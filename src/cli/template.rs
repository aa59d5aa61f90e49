//! `minfer template -m MODEL --messages FILE.json [--no-generation-prompt] [--chat-template FILE]`.

use std::path::Path;

use super::{CliError, Out, model_files};

pub fn run(out: &mut Out, model: &Path, messages: &Path, generation_prompt: bool, template: Option<&Path>) -> Result<(), CliError> {
    let (f, tok) = model_files::open_with_tokenizer(model)?;
    let req = model_files::read_messages(messages)?;
    let text = model_files::render_chat(&f, template, &tok, &req, generation_prompt)?;
    out.write(&text)
}
