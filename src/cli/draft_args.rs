//! The speculative-decoding options `run`, `chat` and `serve` share.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::engine_args::EngineArgs;
use super::{CliError, model_files};
use crate::generate::{DraftParams, Engine, Speculator, check_vocab};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Args)]
pub struct DraftArgs {
    /// Draft model for speculative decoding: a small model with the target's vocabulary
    /// (Qwen2.5-0.5B for the 1.5B, say). The output is the target's (token for token when
    /// greedy, the same distribution when sampling).
    #[arg(long, allow_hyphen_values = true)]
    pub draft: Option<PathBuf>,
    /// Most tokens the draft proposes per round.
    #[arg(long = "draft-n", default_value_t = DraftParams::default().n_draft)]
    pub draft_n: usize,
    /// Stop drafting when the draft gives its next token a probability below P (0 to 1).
    #[arg(long = "draft-min-p", default_value_t = DraftParams::default().p_min)]
    pub draft_min_p: f32,
}

impl DraftArgs {
    pub fn params(&self) -> DraftParams {
        DraftParams { n_draft: self.draft_n, p_min: self.draft_min_p }
    }

    /// The draft model, its vocabulary checked against the target's, loaded with `target`'s
    /// context and worker threads. `None` without `--draft`. Bad `--draft-n` /
    /// `--draft-min-p` values are errors with or without `--draft`.
    pub fn speculator(&self, engine: &EngineArgs, target: &Engine, target_tok: &Tokenizer) -> Result<Option<Speculator>, CliError> {
        self.params().validate()?;
        let Some(path) = &self.draft else { return Ok(None) };
        let (f, draft_tok) = model_files::open_with_tokenizer(path)?;
        check_vocab(target_tok, &draft_tok)?;
        let draft = engine.engine_beside(Arc::new(f), target)?;
        Ok(Some(Speculator::new(draft, self.params())?))
    }
}
