//! `minfer logits -m MODEL --ids 1,2,3 [--from P] [--top K]`: the ids fed the way generation
//! feeds them (`ids[0..=P]` as the prefill, then one id per decode step) and, for every position
//! p >= P, one JSON line with the top-K `[id, logit]` pairs predicting the token after p.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::engine_args::EngineArgs;
use super::{CliError, Out};
use crate::generate::top_logits;
use crate::gguf::GgufFile;

pub fn run(out: &mut Out, model: &Path, ids: &[u32], from: usize, top: usize, engine: &EngineArgs) -> Result<(), CliError> {
    if ids.is_empty() {
        return Err(CliError::Usage("--ids needs at least one id"));
    }
    if from >= ids.len() {
        return Err(CliError::FromOutOfRange { from, n_ids: ids.len() });
    }
    let f = Arc::new(GgufFile::open(model)?);
    let mut e = engine.engine(f, ids.len())?;
    let mut logits = e.prefill(&ids[..=from], engine.ubatch)?;
    for p in from..ids.len() {
        let pairs: Vec<serde_json::Value> = top_logits(&logits, top, |_| true).into_iter().map(|(i, l)| json!([i, l])).collect();
        out.line(json!({"pos": p, "top": pairs}).to_string())?;
        if p + 1 < ids.len() {
            logits = e.eval(&ids[p + 1..p + 2], 1)?;
        }
    }
    Ok(())
}
