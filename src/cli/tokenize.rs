//! `minfer tokenize -m MODEL [--special] [--json] TEXT`.

use std::path::Path;

use super::{CliError, Out, model_files};

pub fn run(out: &mut Out, model: &Path, text: &str, special: bool, json: bool) -> Result<(), CliError> {
    let (_, tok) = model_files::open_with_tokenizer(model)?;
    let text = if text == "-" {
        super::prompt_source::PromptSource::Stdin.read()?
    } else {
        text.to_string()
    };
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.extend(tok.bos_id());
    }
    ids.extend(tok.encode(&text, special));
    if json {
        return out.line(serde_json::to_string(&ids).unwrap_or_default());
    }
    for id in ids {
        let piece = tok.token_piece(id, true)?;
        out.line(format!("{id:>7} -> {:?}", String::from_utf8_lossy(piece)))?;
    }
    Ok(())
}
