//! Greedy speculative decoding with a draft model (work in progress: greedy only).
//!
//! The draft proposes `n_draft` tokens with single-token forwards on its own engine; the
//! target verifies them in one forward over `[t0, d1..dn]` with `n + 1` logit rows. Draft
//! tokens are accepted while they equal the target's argmax; the first mismatch is replaced
//! by the target's token. Rows of a multi-token pass are bit-identical to single-token passes
//! (prefill equals decode), so the output is the target's plain greedy output, token for
//! token. Rejected cells are removed from both KVs with `kv_rm`.

use super::engine::{Engine, EngineError};
use super::run::{GenerateError, GenerateParams, Generation, Generator, StopReason};
use super::sampler::argmax;
use crate::tokenizer::Tokenizer;

/// What the draft did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    pub drafted: usize,
    pub accepted: usize,
    /// Target forward passes after the prompt.
    pub target_passes: usize,
}

impl SpecStats {
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("speculative decoding is greedy only for now: use --temp 0 and no penalties")]
    NotGreedy,
    #[error("the draft model's vocabulary ({draft} tokens) differs from the target's ({target})")]
    Vocab { draft: usize, target: usize },
}

fn top(logits: &[f32]) -> Result<u32, SpecError> {
    argmax(logits).ok_or(SpecError::Generate(GenerateError::Sampler(super::sampler::SamplerError::NoFiniteLogit)))
}

/// Greedy generation from `prompt` on `target`, drafted by `draft` (`n_draft` tokens a round).
pub fn generate_speculative(
    target: &mut Engine,
    draft: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    p: &GenerateParams,
    n_draft: usize,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<(Generation, SpecStats), SpecError> {
    let s = &p.sampler;
    if s.temperature > 0.0 || s.repeat_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0 || !s.logit_bias.is_empty() {
        return Err(SpecError::NotGreedy);
    }
    if draft.n_vocab() != target.n_vocab() {
        return Err(SpecError::Vocab { draft: draft.n_vocab(), target: target.n_vocab() });
    }
    let mut stats = SpecStats::default();
    let mut g = Generator::new(target, tok, prompt, p)?;
    while g.prompt_left() > 0 {
        g.step(target)?;
    }
    draft.prefill(prompt, p.ubatch)?;
    // Accepted tokens the draft has not evaluated yet.
    let mut draft_pending: Vec<u32> = Vec::new();
    let mut emit = |text: &str| if text.is_empty() { Ok(()) } else { on_text(text).map_err(GenerateError::Sink) };
    loop {
        // The target's next token, from the logits of everything accepted so far.
        let t0 = top(g.logits())?;
        let step = g.take(t0)?;
        emit(&step.text)?;
        if step.finished.is_some() {
            break;
        }
        let room = target.n_ctx().saturating_sub(target.n_past());
        if room == 0 {
            g.end(StopReason::ContextFull);
            break;
        }
        // Draft up to n tokens after t0 (never past the context or the token budget).
        let budget = p.max_tokens.saturating_sub(g.generation().generated_ids.len());
        let n = n_draft.min(room - 1).min(budget).min(draft.n_ctx().saturating_sub(draft.n_past() + draft_pending.len() + 1));
        draft_pending.push(t0);
        let mut drafts = Vec::with_capacity(n);
        if n > 0 {
            let mut dl = draft.eval(&draft_pending, 1)?;
            draft_pending.clear();
            // Every draft token is evaluated (the last one too), so the draft's next pass is
            // always a single token and its decode graph is reused, never rebuilt.
            for _ in 0..n {
                let d = top(&dl)?;
                drafts.push(d);
                dl = draft.eval(&[d], 1)?;
            }
        }
        stats.drafted += n;
        // Verify: one target pass over [t0, d1..dn], a logit row after each.
        let base = target.n_past();
        let batch: Vec<u32> = std::iter::once(t0).chain(drafts.iter().copied()).collect();
        let rows = target.eval(&batch, batch.len())?;
        stats.target_passes += 1;
        let n_vocab = target.n_vocab();
        let row = |i: usize| &rows[i * n_vocab..(i + 1) * n_vocab];
        let mut k = 0;
        let mut finished = false;
        while k < n && top(row(k))? == drafts[k] {
            g.set_logits(row(k).to_vec());
            let step = g.take(drafts[k])?;
            emit(&step.text)?;
            k += 1;
            if step.finished.is_some() {
                finished = true;
                break;
            }
        }
        stats.accepted += k;
        if finished {
            break;
        }
        // Keep t0 and the accepted drafts in both KVs.
        target.kv_rm(base + 1 + k, target.n_past())?;
        if n > 0 {
            let keep = draft.n_past() - n + k;
            draft.kv_rm(keep, draft.n_past())?;
        }
        g.set_logits(row(k).to_vec());
    }
    Ok((g.into_generation(), stats))
}
