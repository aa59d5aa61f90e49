//! A multi-turn conversation that keeps its KV: each turn prefills only the tokens the KV does
//! not already hold.
//!
//! Every turn renders the whole conversation with the model's template and tokenizes it. The
//! KV holds the previous rendering plus the tokens generated since. The longest common prefix
//! of the two stays; anything after it is removed (`kv_rm`); only the rest is prefilled. For
//! Qwen templates that rest is the end of the last answer (`<|im_end|>` and the newline,
//! which were sampled but never evaluated) and the new user turn. A from-scratch run over the
//! same transcript holds the same tokens at the same positions, so the answers are the same
//! token for token (logits do not depend on how a prompt is chunked).
//!
//! Context shift: when the KV is full, the oldest `n_discard` tokens after the first `keep` (the
//! system prompt by default) are dropped and the rest moved down ([`Engine::context_shift`]).
//! The dropped tokens are remembered, so the conversation's full token history can still be
//! compared with the next rendering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::engine::{Engine, EngineError};
use super::run::{GenerateError, GenerateParams, Generator, StopReason};
use super::session::{Session, SessionError};
use super::speculative::{SpecError, Speculator};
use crate::chat::{ChatMessage, ChatTemplate, RenderOptions, TemplateError};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct ConversationParams {
    pub system: Option<String>,
    /// Tokens kept at the start by a context shift; `None`: those of the system prompt.
    pub keep: Option<usize>,
    /// On a full context, drop old tokens (`true`) or fail.
    pub context_shift: bool,
    /// Sampling, stop strings, most tokens per answer, prefill chunk.
    pub generate: GenerateParams,
}

/// What the last turn did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TurnStats {
    /// Tokens evaluated before the answer (the new part of the rendering).
    pub n_prefilled: usize,
    pub prefill_secs: f64,
    pub n_generated: usize,
    pub gen_secs: f64,
    /// Tokens dropped by context shifts during the turn.
    pub n_discarded: usize,
}

impl TurnStats {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        if self.prefill_secs > 0.0 { self.n_prefilled as f64 / self.prefill_secs } else { 0.0 }
    }

    pub fn gen_tokens_per_s(&self) -> f64 {
        if self.gen_secs > 0.0 { self.n_generated as f64 / self.gen_secs } else { 0.0 }
    }
}

#[derive(Debug, Clone)]
pub struct Turn {
    /// The answer shown (no end-of-generation token, no stop string).
    pub text: String,
    /// Every sampled token.
    pub generated_ids: Vec<u32>,
    /// `None` when the turn was cancelled.
    pub stop: Option<StopReason>,
    pub stats: TurnStats,
}

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the conversation needs {needed} tokens of context but n_ctx is {n_ctx} (context shift is off: raise --ctx, /reset, or allow context shift)")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("the text sink failed: {0}")]
    Sink(String),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Speculative(#[from] SpecError),
}

pub struct Conversation<'t> {
    engine: Engine,
    tok: &'t Tokenizer,
    template: &'t ChatTemplate,
    render: RenderOptions,
    params: ConversationParams,
    messages: Vec<ChatMessage>,
    /// Tokens dropped from the KV by context shifts, in order; they stood right after `keep`.
    dropped: Vec<u32>,
    keep: usize,
    last: TurnStats,
    /// Called after every prefill chunk with (tokens done, tokens to prefill).
    prefill_progress: Option<Box<dyn FnMut(usize, usize) + 't>>,
    /// Speculative decoding of the answers, with a draft model.
    spec: Option<Speculator>,
}

pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'t> Conversation<'t> {
    /// A conversation over `engine` (its KV is reset). `render` supplies the template's
    /// BOS/EOS texts and extra variables; generation prompts are added per turn.
    pub fn new(
        mut engine: Engine,
        tok: &'t Tokenizer,
        template: &'t ChatTemplate,
        render: RenderOptions,
        params: ConversationParams,
    ) -> Result<Conversation<'t>, ConversationError> {
        engine.reset();
        let mut c = Conversation { engine, tok, template, render, params, messages: Vec::new(), dropped: Vec::new(), keep: 0, last: TurnStats::default(), prefill_progress: None, spec: None };
        c.reset()?;
        Ok(c)
    }

    /// Forgets every turn (the system prompt stays).
    pub fn reset(&mut self) -> Result<(), ConversationError> {
        self.engine.reset();
        self.dropped.clear();
        self.messages = self.params.system.iter().map(|s| ChatMessage::system(s.clone())).collect();
        self.keep = match self.params.keep {
            Some(k) => k,
            None if self.messages.is_empty() => 0,
            None => self.tok.encode_prompt(&self.render_text(&self.messages, false)?, true).len(),
        };
        // A keep that leaves no room would make every shift fail; cap it at half the context.
        self.keep = self.keep.min(self.engine.n_ctx() / 2);
        self.last = TurnStats::default();
        Ok(())
    }

    /// Reports prefill progress (a progress bar) after every chunk.
    pub fn set_prefill_progress(&mut self, f: Box<dyn FnMut(usize, usize) + 't>) {
        self.prefill_progress = Some(f);
    }

    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Answers are decoded speculatively with `spec`'s draft model from now on (its KV follows
    /// the conversation's by common prefix, so a reset, a shift or a loaded session only cost
    /// it a catch-up prefill).
    pub fn set_speculator(&mut self, spec: Speculator) {
        self.spec = Some(spec);
    }

    pub fn speculator(&self) -> Option<&Speculator> {
        self.spec.as_ref()
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    pub fn last_stats(&self) -> TurnStats {
        self.last
    }

    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Tokens dropped by context shifts so far.
    pub fn dropped(&self) -> &[u32] {
        &self.dropped
    }

    /// The conversation's tokens as they were evaluated: the KV's, with the dropped ones put
    /// back in their place.
    pub fn history(&self) -> Vec<u32> {
        let kv = self.engine.tokens();
        let k = self.keep.min(kv.len());
        let mut h = Vec::with_capacity(kv.len() + self.dropped.len());
        h.extend_from_slice(&kv[..k]);
        h.extend_from_slice(&self.dropped);
        h.extend_from_slice(&kv[k..]);
        h
    }

    /// The conversation as a session (KV, token history, messages) of the model with
    /// `fingerprint` ([`super::session::model_fingerprint`]).
    pub fn to_session(&mut self, fingerprint: u64) -> Result<Session, ConversationError> {
        Ok(Session {
            fingerprint,
            keep: self.keep,
            kv: self.engine.kv_snapshot()?,
            dropped: self.dropped.clone(),
            messages: self.messages.clone(),
        })
    }

    /// Continues a saved conversation. Everything is checked first: on an error the
    /// conversation is unchanged.
    pub fn restore_session(&mut self, s: Session, fingerprint: u64) -> Result<(), ConversationError> {
        s.check_compatible(fingerprint, self.engine.kv_type())?;
        let n_ctx = self.engine.n_ctx();
        if !s.dropped.is_empty() && s.keep > s.kv.tokens.len() {
            return Err(SessionError::Malformed(format!("keep {} is past the {} tokens in the KV", s.keep, s.kv.tokens.len())).into());
        }
        self.engine.kv_restore(&s.kv)?;
        self.messages = s.messages;
        self.dropped = s.dropped;
        // A session saved with a larger context may keep more than this one can.
        self.keep = s.keep.min(n_ctx / 2);
        self.last = TurnStats::default();
        Ok(())
    }

    fn render_text(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let opts = RenderOptions { add_generation_prompt, ..self.render.clone() };
        self.template.render(messages, &opts)
    }

    /// Drops old tokens so that `n_new` more fit.
    fn make_room(&mut self, n_new: usize, stats: &mut TurnStats) -> Result<(), ConversationError> {
        let (n_past, n_ctx) = (self.engine.n_past(), self.engine.n_ctx());
        if n_past + n_new <= n_ctx {
            return Ok(());
        }
        if !self.params.context_shift {
            return Err(ConversationError::ContextFull { needed: n_past + n_new, n_ctx });
        }
        if self.keep + n_new > n_ctx {
            return Err(EngineError::ShiftTooSmall { keep: self.keep, n_new, n_ctx }.into());
        }
        // Half of what follows `keep`, as llama.cpp does, or more when that is not enough.
        let n_discard = ((n_past - self.keep) / 2).max(n_past + n_new - n_ctx);
        let gone = self.engine.tokens()[self.keep..self.keep + n_discard].to_vec();
        if let Err(e) = self.engine.context_shift(self.keep, n_discard) {
            // The engine forgot its KV on the failure: so does the conversation's history.
            self.dropped.clear();
            return Err(e.into());
        }
        self.dropped.extend_from_slice(&gone);
        stats.n_discarded += n_discard;
        Ok(())
    }

    /// Makes the KV hold `full` (the rendered conversation); returns the logits of its last
    /// token.
    /// `None` when `cancel` was set between two chunks (what was evaluated stays in the KV).
    fn sync(&mut self, full: &[u32], stats: &mut TurnStats, cancel: &AtomicBool) -> Result<Option<Vec<f32>>, ConversationError> {
        let history = self.history();
        // At least one token is evaluated: its logits start the answer.
        let mut c = common_prefix(&history, full).min(full.len().saturating_sub(1));
        let dropped_end = self.keep + self.dropped.len();
        let restart = !self.dropped.is_empty() && c < dropped_end;
        // Cells the KV keeps, and the tokens to evaluate after them.
        let (kept, n_new) = if restart { (0, full.len()) } else { (c - self.dropped.len(), full.len() - c) };
        let n_ctx = self.engine.n_ctx();
        if !self.params.context_shift && kept + n_new > n_ctx {
            // Checked before the KV is touched.
            return Err(ConversationError::ContextFull { needed: kept + n_new, n_ctx });
        }
        if restart {
            // The change reaches into what a shift dropped: start over.
            self.engine.reset();
            self.dropped.clear();
            c = 0;
        } else {
            let at = if self.dropped.is_empty() { c } else { c - self.dropped.len() };
            let n_past = self.engine.n_past();
            self.engine.kv_rm(at, n_past)?;
        }
        let new = &full[c..];
        let t0 = Instant::now();
        let ubatch = self.params.generate.ubatch.unwrap_or(512).max(1);
        let chunk = if self.params.context_shift { ubatch.min((n_ctx.saturating_sub(self.keep) / 2).max(1)) } else { ubatch };
        let mut logits = Vec::new();
        for (i, part) in new.chunks(chunk).enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            self.make_room(part.len(), stats)?;
            logits = self.engine.eval(part, 1)?;
            if let Some(report) = &mut self.prefill_progress {
                report((i * chunk + part.len()).min(new.len()), new.len());
            }
        }
        stats.n_prefilled = new.len();
        stats.prefill_secs = t0.elapsed().as_secs_f64();
        Ok(Some(logits))
    }

    /// One exchange: the user's message, then the streamed answer (`on_text` gets text as it
    /// becomes final). Setting `cancel` ends the answer early; what was said so far is kept.
    pub fn turn(&mut self, user: &str, cancel: &AtomicBool, on_text: &mut dyn FnMut(&str) -> Result<(), String>) -> Result<Turn, ConversationError> {
        let mut messages = self.messages.clone();
        messages.push(ChatMessage::user(user));
        let full = self.tok.encode_prompt(&self.render_text(&messages, true)?, true);
        let mut stats = TurnStats::default();
        let Some(logits) = self.sync(&full, &mut stats, cancel)? else {
            // Cancelled during the prefill: no answer, and the turn is not part of the
            // conversation (the next turn re-uses whatever of its prompt reached the KV).
            self.last = stats;
            return Ok(Turn { text: String::new(), generated_ids: Vec::new(), stop: None, stats });
        };
        let context = self.history();
        let mut g = Generator::resume(self.tok, &context, logits, &self.params.generate)?;
        if let Some(spec) = &mut self.spec {
            spec.begin(&self.params.generate.sampler)?;
        }
        let t0 = Instant::now();
        let mut stop = None;
        'answer: while !cancel.load(Ordering::Relaxed) {
            // A decode step evaluates one token at its end (a speculative round as many as the
            // room left allows). Without context shift the generator ends the answer itself
            // when the context is full ("length").
            if self.params.context_shift {
                self.make_room(1, &mut stats)?;
            }
            let steps = match &mut self.spec {
                Some(spec) => spec.round(&mut g, &mut self.engine)?,
                None => vec![g.step(&mut self.engine)?],
            };
            for step in steps {
                if !step.text.is_empty() {
                    on_text(&step.text).map_err(ConversationError::Sink)?;
                }
                if step.finished.is_some() {
                    stop = step.finished;
                    break 'answer;
                }
            }
        }
        let out = g.into_generation();
        stats.n_generated = out.generated_ids.len();
        stats.gen_secs = t0.elapsed().as_secs_f64();
        self.last = stats;
        // A turn cancelled before its first token is not part of the conversation.
        if stop.is_some() || !out.generated_ids.is_empty() {
            messages.push(ChatMessage::assistant(out.text.clone()));
            self.messages = messages;
        }
        Ok(Turn { text: out.text, generated_ids: out.generated_ids, stop, stats })
    }
}
