//! The generation loop: prefill the prompt, then sample and decode one token per step until an
//! end-of-generation token, a stop string, the token budget or the end of the context.

use std::time::Instant;

use super::engine::{Engine, EngineError};
use super::sampler::{Sampler, SamplerError, SamplerParams};
use super::stop::{StopOutcome, StopStrings};
use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Generation ends when the text contains one of these (which is not shown).
    pub stop: Vec<String>,
    /// Prefill in chunks of at most this many tokens.
    pub ubatch: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    StopString,
    MaxTokens,
    ContextFull,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// Every sampled token, including a final end-of-generation token.
    pub generated_ids: Vec<u32>,
    /// The text shown: without end-of-generation tokens and stop strings.
    pub text: String,
    pub stop: StopReason,
    pub prompt_secs: f64,
    /// Time of the decode steps (the first token is sampled from the prefill's logits).
    pub gen_secs: f64,
    /// Decode steps evaluated.
    pub n_decoded: usize,
}

impl Generation {
    pub fn prompt_tokens_per_s(&self) -> f64 {
        rate(self.prompt_ids.len(), self.prompt_secs)
    }

    pub fn gen_tokens_per_s(&self) -> f64 {
        rate(self.n_decoded, self.gen_secs)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt of {n_prompt} tokens does not fit the context of {n_ctx} ({n_past} already used)")]
    PromptTooLong { n_prompt: usize, n_ctx: usize, n_past: usize },
    /// The text sink failed (stdout closed, a client gone).
    #[error("{0}")]
    Sink(String),
}

/// Generates from `prompt` (token ids, BOS included if wanted); `on_text` receives the text as
/// it becomes final (complete UTF-8, never part of a stop string).
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    p: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let (n_ctx, n_past) = (engine.n_ctx(), engine.n_past());
    if n_past + prompt.len() > n_ctx {
        return Err(GenerateError::PromptTooLong { n_prompt: prompt.len(), n_ctx, n_past });
    }
    let mut sampler = Sampler::new(p.sampler.clone())?;
    prompt.iter().for_each(|&t| sampler.accept(t));

    let t0 = Instant::now();
    let mut logits = engine.prefill(prompt, p.ubatch)?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let mut out = Generation {
        prompt_ids: prompt.to_vec(),
        generated_ids: Vec::new(),
        text: String::new(),
        stop: StopReason::MaxTokens,
        prompt_secs,
        gen_secs: 0.0,
        n_decoded: 0,
    };
    let mut stream = tok.stream_decoder();
    let mut stops = StopStrings::new(p.stop.iter().cloned());
    let mut emit = |out: &mut Generation, s: &str| -> Result<(), GenerateError> {
        if s.is_empty() {
            return Ok(());
        }
        out.text.push_str(s);
        on_text(s).map_err(GenerateError::Sink)
    };
    let t1 = Instant::now();
    while out.generated_ids.len() < p.max_tokens {
        let id = sampler.sample(&logits)?;
        sampler.accept(id);
        out.generated_ids.push(id);
        if tok.is_eog(id) {
            out.stop = StopReason::EndOfGeneration;
            break;
        }
        let piece = stream.push(id)?;
        match stops.push(&piece) {
            StopOutcome::Continue(s) => emit(&mut out, &s)?,
            StopOutcome::Stop(s) => {
                emit(&mut out, &s)?;
                out.stop = StopReason::StopString;
                break;
            }
        }
        if out.generated_ids.len() == p.max_tokens {
            break;
        }
        if engine.n_past() >= n_ctx {
            out.stop = StopReason::ContextFull;
            break;
        }
        logits = engine.eval(&[id], 1)?;
        out.n_decoded += 1;
    }
    out.gen_secs = t1.elapsed().as_secs_f64();
    if out.stop != StopReason::StopString {
        let rest = stream.flush();
        let tail = match stops.push(&rest) {
            StopOutcome::Continue(s) => s + &stops.flush(),
            StopOutcome::Stop(s) => s,
        };
        emit(&mut out, &tail)?;
    }
    Ok(out)
}
