//! A slot: one [`Engine`] (its own `GraphCache`, so its own KV) and the request it serves.
//!
//! A slot is reset when it takes a request, so no request can observe another's KV. Every
//! forward pass runs under `catch_unwind`: a panic answers the request with a 500, and the
//! slot's engine is rebuilt so the next request starts from a clean graph cache.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::admission::Ticket;
use super::error::ApiError;
use super::metrics::Metrics;
use crate::generate::{Engine, GenerateError, GenerateParams, Generator, Speculator, StopReason, TokenLogprobs};
use crate::http::panic_text;
use crate::tokenizer::Tokenizer;

/// A generation request on its way to a slot.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub events: UnboundedSender<Event>,
    /// `--timeout` from the request's arrival.
    pub deadline: Option<Instant>,
    pub timeout_secs: u64,
    /// Test lever (`MINFER_INJECT_PANIC`): the first forward pass panics.
    pub inject_panic: bool,
    pub ticket: Ticket,
}

/// What a slot reports to the request's handler.
#[derive(Debug)]
pub enum Event {
    Token(TokenEvent),
    Done(Finished),
    Failed(ApiError),
}

#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub id: u32,
    /// Text that became final with this token (possibly empty).
    pub text: String,
    pub logprobs: Option<TokenLogprobs>,
}

#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
}

impl Finished {
    /// OpenAI's `finish_reason`.
    pub fn finish_reason(&self) -> &'static str {
        match self.reason {
            StopReason::EndOfGeneration | StopReason::StopString => "stop",
            StopReason::MaxTokens | StopReason::ContextFull => "length",
        }
    }
}

struct Task<'t> {
    job: Job,
    generator: Generator<'t>,
}

pub struct Slot<'t> {
    engine: Engine,
    /// The slot's draft engine when the server speculates (`--draft`).
    spec: Option<Speculator>,
    task: Option<Task<'t>>,
}

impl Job {
    /// Sends `ev` unless the client is gone.
    fn send(&self, ev: Event) {
        let _ = self.events.send(ev);
    }

    /// The client went away (its handler dropped the receiver).
    pub fn abandoned(&self) -> bool {
        self.events.is_closed()
    }

    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Ends the request with an error; the ticket is given back first, so a client that
    /// retries at once finds the place free.
    pub fn fail(self, err: ApiError) {
        let Job { events, ticket, .. } = self;
        drop(ticket);
        let _ = events.send(Event::Failed(err));
    }
}

impl<'t> Slot<'t> {
    pub fn new(engine: Engine, spec: Option<Speculator>) -> Slot<'t> {
        Slot { engine, spec, task: None }
    }

    pub fn busy(&self) -> bool {
        self.task.is_some()
    }

    /// Takes a request: the KV is forgotten, the prompt checked against the slot's context.
    pub fn start(&mut self, tok: &'t Tokenizer, job: Job) {
        self.engine.reset();
        let (engine, spec) = (&self.engine, &mut self.spec);
        let made = catch_unwind(AssertUnwindSafe(|| {
            if let Some(s) = spec {
                s.begin(&job.params.sampler).map_err(|e| GenerateError::Sink(e.to_string()))?;
            }
            Generator::new(engine, tok, &job.prompt, &job.params)
        }));
        match made {
            Ok(Ok(generator)) => self.task = Some(Task { job, generator }),
            Ok(Err(GenerateError::PromptTooLong { n_prompt, n_ctx, .. })) => {
                job.fail(ApiError::ExceedContext { n_prompt_tokens: n_prompt, n_ctx })
            }
            Ok(Err(e)) => job.fail(ApiError::Internal(e.to_string())),
            Err(panic) => job.fail(ApiError::Internal(format!("starting the generation panicked: {}", panic_text(&*panic)))),
        }
    }

    /// One forward pass of the slot's request (with a draft model: one speculative round once
    /// the prompt is in), unless its client left or its time ran out. `rebuild` makes fresh
    /// engines after a panic.
    pub fn step(&mut self, metrics: &Metrics, rebuild: &dyn Fn() -> Option<(Engine, Option<Speculator>)>) {
        let Some(task) = self.task.as_mut() else { return };
        if task.job.abandoned() {
            metrics.cancelled();
            self.task = None;
            return;
        }
        if task.job.expired(Instant::now()) {
            metrics.timed_out();
            let secs = task.job.timeout_secs;
            self.end(Event::Failed(ApiError::Timeout { secs }));
            return;
        }
        let prompt_left = task.generator.prompt_left();
        let t0 = Instant::now();
        let (engine, spec) = (&mut self.engine, &mut self.spec);
        let before = spec.as_ref().map(|s| s.stats()).unwrap_or_default();
        let result = catch_unwind(AssertUnwindSafe(|| {
            if task.job.inject_panic {
                panic!("injected fault (MINFER_INJECT_PANIC)");
            }
            match spec {
                Some(s) if prompt_left == 0 => s.round(&mut task.generator, engine).map_err(|e| e.to_string()),
                _ => task.generator.step(engine).map(|s| vec![s]).map_err(|e| e.to_string()),
            }
        }));
        let secs = t0.elapsed().as_secs_f64();
        match result {
            Ok(Ok(steps)) => {
                let tokens = steps.iter().filter(|s| s.token.is_some()).count();
                if prompt_left > 0 {
                    metrics.prompt(prompt_left - task.generator.prompt_left(), secs);
                } else if tokens > 0 {
                    metrics.generated(tokens, secs);
                }
                if let Some(after) = spec.as_ref().map(|s| s.stats()) {
                    metrics.drafted(after.drafted - before.drafted, after.accepted - before.accepted);
                }
                for step in steps {
                    if let Some(id) = step.token {
                        task.job.send(Event::Token(TokenEvent { id, text: step.text, logprobs: step.logprobs }));
                    }
                    if let Some(reason) = step.finished {
                        let g = task.generator.generation();
                        let done = Finished {
                            reason,
                            prompt_tokens: g.prompt_ids.len(),
                            completion_tokens: g.generated_ids.len(),
                            prompt_secs: g.prompt_secs,
                            gen_secs: g.gen_secs,
                        };
                        self.end(Event::Done(done));
                        break;
                    }
                }
            }
            Ok(Err(e)) => self.end(Event::Failed(ApiError::Internal(e))),
            Err(panic) => {
                metrics.panicked();
                let what = panic_text(&*panic);
                eprintln!("minfer serve: inference panicked: {what}; the slot's engines are rebuilt");
                if let Some((fresh, fresh_spec)) = rebuild() {
                    self.engine = fresh;
                    self.spec = fresh_spec;
                }
                self.end(Event::Failed(ApiError::Internal(format!("inference panicked: {what}"))));
            }
        }
    }

    /// Frees the slot and sends the request's last event (ticket first, see [`Job::fail`]).
    fn end(&mut self, last: Event) {
        if let Some(task) = self.task.take() {
            let Job { events, ticket, .. } = task.job;
            drop(ticket);
            let _ = events.send(last);
        }
    }
}
