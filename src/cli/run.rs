//! `minfer run -m MODEL (-p TEXT | --messages FILE.json)`.
//!
//! Generation needs the compute graph (the next milestone); until it lands, `run` loads the
//! model, prints its summary and the prompt's tokens, and says plainly that it cannot generate.

use std::path::Path;

use super::{CliError, Out, model_files};
use crate::models::HParams;

pub enum Prompt<'a> {
    Text(&'a str),
    Messages(&'a Path),
}

pub fn run(out: &mut Out, model: &Path, prompt: Prompt) -> Result<(), CliError> {
    let (f, tok) = model_files::open_with_tokenizer(model)?;
    let hp = HParams::from_gguf(&f)?;
    hp.check_supported()?;
    let (text, parse_special) = match prompt {
        Prompt::Text(t) => (t.to_string(), false),
        Prompt::Messages(p) => {
            let req = model_files::read_messages(p)?;
            (model_files::render_chat(&f, &tok, &req, true)?, true)
        }
    };
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.extend(tok.bos_id());
    }
    ids.extend(tok.encode(&text, parse_special));
    out.line(format!(
        "model: {} ({}, {} layers, n_embd {}, {} heads / {} kv, vocab {})",
        model.display(),
        hp.arch,
        hp.n_layer,
        hp.n_embd,
        hp.n_head,
        hp.n_head_kv,
        hp.n_vocab
    ))?;
    out.line(format!("prompt: {} tokens {:?}", ids.len(), ids))?;
    out.flush()?;
    eprintln!("minfer: generation is not implemented yet (the compute graph is the next milestone)");
    Ok(())
}
