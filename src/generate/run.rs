//! The generation loop: prefill the prompt, then sample and decode one token per step until an
//! end-of-generation token, a stop string, the token budget or the end of the context.

use std::time::Instant;

use super::constraint::{Constraint, ConstraintError};
use super::engine::{Engine, EngineError};
use super::logprobs::{TokenLogprobs, token_logprobs};
use super::sampler::{Sampler, SamplerError, SamplerParams, TokenDist};
use super::stop::{StopOutcome, StopStrings};
use crate::grammar::Grammar;
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Generation ends when the text contains one of these (which is not shown).
    pub stop: Vec<String>,
    /// Prefill in chunks of at most this many tokens.
    pub ubatch: Option<usize>,
    /// Report the log-probability of every sampled token and of this many alternatives
    /// (`None`: no log-probabilities).
    pub n_probs: Option<usize>,
    /// With `n_probs`: the probabilities the token was drawn from (after the bias, the
    /// penalties, the grammar, top-k, top-p, min-p and the temperature; llama-server's
    /// `post_sampling_probs`), as natural logarithms, instead of the model's.
    pub post_sampling_probs: bool,
    /// The text must follow this grammar (structured output); `None`: free text.
    pub grammar: Option<Grammar>,
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
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt of {n_prompt} tokens does not fit the context of {n_ctx} ({n_past} already used)")]
    PromptTooLong { n_prompt: usize, n_ctx: usize, n_past: usize },
    /// The text sink failed (stdout closed, a client gone).
    #[error("{0}")]
    Sink(String),
}

/// The next forward pass of a generation ([`Generator::next_pass`]).
#[derive(Debug)]
pub enum NextPass {
    /// Evaluate these tokens, then hand the logits to [`Generator::evaluated`].
    Eval(Pass),
    /// The generation ended without another pass; this is its last step.
    Done(StepOutput),
}

/// Tokens a generation needs evaluated next, at the sequence's next positions.
#[derive(Debug)]
pub struct Pass {
    pub tokens: Vec<u32>,
    /// What the step outputs once evaluated (the sampled token of a decode step).
    step: StepOutput,
    prefill: bool,
}

impl Pass {
    /// A chunk of the prompt (no token sampled).
    pub fn is_prefill(&self) -> bool {
        self.prefill
    }
}

/// What one [`Generator::step`] did.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// The token sampled in this step (`None` for a prefill chunk).
    pub token: Option<u32>,
    /// Its log-probabilities, when [`GenerateParams::n_probs`] asks for them.
    pub logprobs: Option<TokenLogprobs>,
    /// Text that became final in this step (possibly empty).
    pub text: String,
    /// Set on the last step.
    pub finished: Option<StopReason>,
}

/// The generation loop as a state machine, one forward pass per [`Generator::step`]: a server
/// interleaves the steps of several sequences, the CLI runs them back to back ([`generate`]).
pub struct Generator<'t> {
    tok: &'t Tokenizer,
    params: GenerateParams,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    stops: StopStrings,
    /// Prompt tokens already evaluated.
    prefilled: usize,
    /// The logits of the last evaluated token (empty until the prompt is evaluated).
    logits: Vec<f32>,
    /// The grammar the text must follow, and whether `logits` are already masked by it.
    constraint: Option<Constraint>,
    masked: bool,
    out: Generation,
}

impl<'t> Generator<'t> {
    /// Checks the prompt against `engine`'s free context and the sampler settings; evaluates
    /// nothing yet.
    pub fn new(engine: &Engine, tok: &'t Tokenizer, prompt: &[u32], p: &GenerateParams) -> Result<Generator<'t>, GenerateError> {
        Generator::in_context((engine.n_past(), engine.n_ctx()), tok, prompt, p)
    }

    /// [`Generator::new`] for a sequence with `n_past` of its `n_ctx` cells in use.
    pub fn in_context((n_past, n_ctx): (usize, usize), tok: &'t Tokenizer, prompt: &[u32], p: &GenerateParams) -> Result<Generator<'t>, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if n_past + prompt.len() > n_ctx {
            return Err(GenerateError::PromptTooLong { n_prompt: prompt.len(), n_ctx, n_past });
        }
        Generator::start(tok, prompt, 0, Vec::new(), p)
    }

    /// A generator whose context is already evaluated: `context` is in `engine`'s KV and
    /// `logits` are those of its last token (a conversation prefills its turns itself).
    /// `context` feeds the repetition penalties and becomes the [`Generation::prompt_ids`].
    pub fn resume(tok: &'t Tokenizer, context: &[u32], logits: Vec<f32>, p: &GenerateParams) -> Result<Generator<'t>, GenerateError> {
        if context.is_empty() || logits.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        Generator::start(tok, context, context.len(), logits, p)
    }

    /// `prompt[..prefilled]` is already in the KV, with `logits` those of its last token.
    fn start(tok: &'t Tokenizer, prompt: &[u32], prefilled: usize, logits: Vec<f32>, p: &GenerateParams) -> Result<Generator<'t>, GenerateError> {
        let mut sampler = Sampler::new(p.sampler.clone())?;
        prompt.iter().for_each(|&t| sampler.accept(t));
        let constraint = p.grammar.as_ref().map(Constraint::new).transpose()?;
        Ok(Generator {
            tok,
            params: p.clone(),
            sampler,
            stream: tok.stream_decoder(),
            stops: StopStrings::new(p.stop.iter().cloned()),
            prefilled,
            logits,
            constraint,
            masked: false,
            out: Generation {
                prompt_ids: prompt.to_vec(),
                generated_ids: Vec::new(),
                text: String::new(),
                stop: StopReason::MaxTokens,
                prompt_secs: 0.0,
                gen_secs: 0.0,
                n_decoded: 0,
            },
        })
    }

    /// What has been generated so far (the whole result once a step reported `finished`).
    pub fn generation(&self) -> &Generation {
        &self.out
    }

    pub fn into_generation(self) -> Generation {
        self.out
    }

    /// Prompt tokens still to evaluate.
    pub fn prompt_left(&self) -> usize {
        self.out.prompt_ids.len() - self.prefilled
    }

    /// Steps until generation ends; `on_text` gets the text as it becomes final.
    pub fn run_to_end(mut self, engine: &mut Engine, on_text: &mut dyn FnMut(&str) -> Result<(), String>) -> Result<Generation, GenerateError> {
        loop {
            let step = self.step(engine)?;
            if !step.text.is_empty() {
                on_text(&step.text).map_err(GenerateError::Sink)?;
            }
            if step.finished.is_some() {
                return Ok(self.into_generation());
            }
        }
    }

    /// One forward pass: the next prefill chunk, or sample a token, emit its text and evaluate
    /// it. Do not call again after a step reported `finished`.
    pub fn step(&mut self, engine: &mut Engine) -> Result<StepOutput, GenerateError> {
        let t0 = Instant::now();
        match self.next_pass(engine.n_past(), engine.n_ctx(), usize::MAX)? {
            NextPass::Done(step) => {
                self.out.gen_secs += t0.elapsed().as_secs_f64();
                Ok(step)
            }
            NextPass::Eval(pass) => {
                let logits = engine.eval(&pass.tokens, 1)?;
                Ok(self.evaluated(pass, logits, t0.elapsed().as_secs_f64()))
            }
        }
    }

    /// What the next forward pass of this generation is, for a caller that evaluates it itself
    /// (a server batching several sequences into one pass): the next prefill chunk (at most
    /// `max_chunk` tokens and the `ubatch` asked for), or the token sampled now with its
    /// output, or the end. `n_past` and `n_ctx` are the sequence's KV use and size. Hand the
    /// pass's logits to [`Generator::evaluated`].
    pub fn next_pass(&mut self, n_past: usize, n_ctx: usize, max_chunk: usize) -> Result<NextPass, GenerateError> {
        if self.prompt_left() > 0 {
            let chunk = self.params.ubatch.unwrap_or(usize::MAX).min(max_chunk).max(1).min(self.prompt_left());
            let tokens = self.out.prompt_ids[self.prefilled..self.prefilled + chunk].to_vec();
            return Ok(NextPass::Eval(Pass { tokens, step: StepOutput::default(), prefill: true }));
        }
        if self.out.generated_ids.len() >= self.params.max_tokens {
            return Ok(NextPass::Done(self.finish(StepOutput::default(), StopReason::MaxTokens)));
        }
        self.constrain()?;
        let id = self.sampler.sample(&self.logits)?;
        let step = self.take(id)?;
        if step.finished.is_some() {
            return Ok(NextPass::Done(step));
        }
        if n_past >= n_ctx {
            return Ok(NextPass::Done(self.finish(step, StopReason::ContextFull)));
        }
        Ok(NextPass::Eval(Pass { tokens: vec![id], step, prefill: false }))
    }

    /// Takes the logits of `pass`'s last token (`secs`: the time it took); returns the pass's
    /// output (the sampled token's, for a decode step).
    pub fn evaluated(&mut self, pass: Pass, logits: Vec<f32>, secs: f64) -> StepOutput {
        self.set_logits(logits);
        if pass.prefill {
            self.prefilled += pass.tokens.len();
            self.out.prompt_secs += secs;
        } else {
            self.out.n_decoded += 1;
            self.out.gen_secs += secs;
        }
        pass.step
    }

    /// Marks the first `n` prompt tokens as already in the KV (a cached prefix); their logits
    /// are not known, so at least one prompt token must be left to evaluate.
    pub fn skip_cached(&mut self, n: usize) {
        self.prefilled = self.prefilled.max(n.min(self.out.prompt_ids.len().saturating_sub(1)));
    }

    /// Prompt tokens already in the KV when the generation started (see
    /// [`Generator::skip_cached`]) plus those evaluated since.
    pub fn prefilled(&self) -> usize {
        self.prefilled
    }

    /// The logits the next token is chosen from.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    /// The distribution the next token is drawn from (the current logits under the grammar,
    /// the tokens taken so far for the penalties).
    pub fn distribution(&mut self) -> Result<TokenDist, GenerateError> {
        self.constrain()?;
        Ok(self.sampler.distribution(&self.logits)?)
    }

    /// Applies the grammar's mask to the current logits (once).
    fn constrain(&mut self) -> Result<(), GenerateError> {
        if let Some(c) = self.constraint.as_mut().filter(|_| !self.masked) {
            c.apply(&mut self.logits)?;
            self.masked = true;
        }
        Ok(())
    }

    /// A token drawn from `dist` with the sampler's random stream.
    pub fn draw(&mut self, dist: &TokenDist) -> u32 {
        self.sampler.draw(dist)
    }

    /// The next uniform number in [0, 1) of the sampler's random stream.
    pub fn uniform(&mut self) -> f64 {
        self.sampler.uniform()
    }

    /// Accounts decode work done outside [`Generator::step`] (a speculative round): `secs` of
    /// it, `n` tokens evaluated into the KV.
    pub fn record_decode(&mut self, secs: f64, n: usize) {
        self.out.gen_secs += secs;
        self.out.n_decoded += n;
    }

    /// Replaces them (speculative decoding verifies several tokens in one pass).
    pub fn set_logits(&mut self, logits: Vec<f32>) {
        self.logits = logits;
        self.masked = false;
    }

    /// Appends a chosen token without evaluating it: its text, stop strings, the token budget.
    /// `finished` is set when it ends the generation.
    pub fn take(&mut self, id: u32) -> Result<StepOutput, GenerateError> {
        if let Some(c) = self.constraint.as_mut() {
            c.commit(id)?;
        }
        let logprobs = match self.params.n_probs {
            None => None,
            // Before `accept`, which moves the penalties on: the distribution `id` came from.
            Some(n) if self.params.post_sampling_probs => Some(super::logprobs::dist_logprobs(&self.sampler.distribution(&self.logits)?, id, n)),
            Some(n) => Some(token_logprobs(&self.logits, id, n)),
        };
        self.sampler.accept(id);
        self.out.generated_ids.push(id);
        let mut step = StepOutput { token: Some(id), logprobs, ..StepOutput::default() };
        if self.tok.is_eog(id) {
            return Ok(self.finish(step, StopReason::EndOfGeneration));
        }
        let piece = self.stream.push(id)?;
        match self.stops.push(&piece) {
            StopOutcome::Continue(s) => self.emit(&mut step, &s),
            StopOutcome::Stop(s) => {
                self.emit(&mut step, &s);
                return Ok(self.finish(step, StopReason::StopString));
            }
        }
        if self.out.generated_ids.len() >= self.params.max_tokens {
            return Ok(self.finish(step, StopReason::MaxTokens));
        }
        Ok(step)
    }

    /// Ends generation for `reason` (the context is full, say).
    pub fn end(&mut self, reason: StopReason) -> StepOutput {
        self.finish(StepOutput::default(), reason)
    }

    /// Ends generation for `reason` with `step` (a token just taken) as the last step: the
    /// text held back so far joins its text, as a plain decode step ends.
    pub fn end_with(&mut self, step: StepOutput, reason: StopReason) -> StepOutput {
        self.finish(step, reason)
    }

    fn emit(&mut self, step: &mut StepOutput, s: &str) {
        self.out.text.push_str(s);
        step.text.push_str(s);
    }

    /// Ends generation; text held back (an unfinished code point or a partial stop string)
    /// is released unless a stop string matched.
    fn finish(&mut self, mut step: StepOutput, reason: StopReason) -> StepOutput {
        self.out.stop = reason;
        if reason != StopReason::StopString {
            let rest = self.stream.flush();
            let tail = match self.stops.push(&rest) {
                StopOutcome::Continue(s) => s + &self.stops.flush(),
                StopOutcome::Stop(s) => s,
            };
            self.emit(&mut step, &tail);
        }
        step.finished = Some(reason);
        step
    }
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
    Generator::new(engine, tok, prompt, p)?.run_to_end(engine, on_text)
}
