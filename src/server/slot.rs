//! A slot: one sequence of KV and the request it serves. The sequence is either the slot's own
//! in the server's shared engine ([`SlotKv::Seq`], which lets one forward pass hold several
//! slots) or, with a draft model, an engine of the slot's own ([`SlotKv::Own`]).
//!
//! When a slot takes a request it keeps the longest prefix its KV shares with the prompt
//! (prompt caching) and forgets the rest, so no request observes another's KV beyond tokens
//! that are the same as its own, and its answer is the same bits as from an empty KV. Every
//! step of a slot runs under `catch_unwind`: a panic answers the request with a 500, and the
//! engine it ran on is rebuilt (see `scheduler.rs`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::admission::Ticket;
use super::slot_files::{SlotAction, SlotReport};
use super::error::ApiError;
use super::metrics::Metrics;
use crate::generate::{Engine, GenerateError, GenerateParams, Generator, NextPass, Pass, Pooling, Speculator, StepOutput, StopReason, TokenLogprobs, embed};
use crate::http::panic_text;
use crate::tokenizer::Tokenizer;

/// What a job asks of its slot.
pub enum Work {
    /// Generate after the prompt.
    Generate(Box<GenerateParams>),
    /// Embed each input in turn (the job's `prompt` is empty), pooled this way; answered with
    /// one [`Reply::Embedded`] and the slot is free again in the same round.
    Embed { inputs: Vec<Vec<u32>>, pooling: Pooling },
    /// Save, restore or erase the KV of the slot the job names (`Job::slot`); answered with
    /// one [`Reply::Slot`].
    SlotAction(SlotAction),
}

/// A request on its way to a slot.
pub struct Job {
    pub prompt: Vec<u32>,
    pub work: Work,
    pub events: UnboundedSender<Event>,
    /// `--timeout` from the request's arrival.
    pub deadline: Option<Instant>,
    pub timeout_secs: u64,
    /// Test lever (`MINFER_INJECT_PANIC`): the request's forward passes panic.
    pub inject_panic: bool,
    /// Start from the slot's KV prefix shared with the prompt (`cache_prompt`).
    pub cache_prompt: bool,
    /// llama-server's `return_progress`: an [`Event::Progress`] when the prompt starts and
    /// after each of its chunks.
    pub return_progress: bool,
    /// `id_slot`: this slot only (the job waits for it).
    pub slot: Option<usize>,
    pub ticket: Ticket,
}

/// What a slot reports to the request's handler.
#[derive(Debug)]
pub enum Event {
    /// How far the prompt's evaluation has come (only with `return_progress`).
    Progress(Progress),
    Token(TokenEvent),
    Done(Finished),
    Failed(ApiError),
    /// The one answer of a job that is not a generation.
    Reply(Reply),
}

/// What a job other than a generation answers.
#[derive(Debug)]
pub enum Reply {
    Embedded(Embedded),
    Slot(SlotReport),
}

/// Per input, its pooled vector (or every token's, pooling none), and its token count.
#[derive(Debug)]
pub struct Embedded {
    pub vectors: Vec<Vec<Vec<f32>>>,
    pub n_tokens: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub id: u32,
    /// Text that became final with this token (possibly empty).
    pub text: String,
    pub logprobs: Option<TokenLogprobs>,
    /// The counts and times so far, this token included (llama-server's `timings_per_token`).
    pub so_far: Usage,
}

/// The prompt's evaluation so far: llama-server's `prompt_progress`.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Prompt tokens in all, taken from the cache, and in the KV now (cached included).
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    /// Since the request reached its slot.
    pub time_ms: f64,
    /// The timings so far (`processed` as the prompt's tokens).
    pub so_far: Usage,
}

/// Tokens and seconds of a generation, so far or in all.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens found in the slot's KV, not evaluated.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_secs: f64,
    /// Seconds of the decode passes (the first token comes from the prompt's pass, so
    /// `completion_tokens - 1` passes).
    pub gen_secs: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub reason: StopReason,
    pub usage: Usage,
}

impl std::ops::Deref for Finished {
    type Target = Usage;
    fn deref(&self) -> &Usage {
        &self.usage
    }
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
    /// Prompt tokens taken from the KV.
    cached: usize,
    /// When the slot took the request.
    started: Instant,
}

impl Task<'_> {
    /// Sends where the prompt stands, when the request asked.
    fn progress(&self) {
        if !self.job.return_progress {
            return;
        }
        let g = self.generator.generation();
        let total = g.prompt_ids.len();
        let processed = total - self.generator.prompt_left();
        let so_far = Usage { prompt_tokens: processed, cached_tokens: self.cached, completion_tokens: 0, prompt_secs: g.prompt_secs, gen_secs: 0.0 };
        let time_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.job.send(Event::Progress(Progress { total, cache: self.cached, processed, time_ms, so_far }));
    }
}

/// Where a slot's KV lives.
pub enum SlotKv {
    /// Sequence `n` of the server's shared engine.
    Seq(usize),
    /// An engine of its own, and its draft engine when the server speculates (`--draft`).
    Own(Box<Engine>, Option<Speculator>),
}

pub struct Slot<'t> {
    pub kv: SlotKv,
    task: Option<Task<'t>>,
    /// When the slot last took a request (a round number; the least recently used free slot
    /// wins a tie of cached prefixes).
    pub last_used: u64,
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

/// The tokens `kv` holds (`shared`: the server's shared engine).
pub fn kv_tokens<'a>(kv: &'a SlotKv, shared: Option<&'a Engine>) -> &'a [u32] {
    match kv {
        SlotKv::Seq(s) => shared.and_then(|e| e.seq_tokens(*s)).unwrap_or(&[]),
        SlotKv::Own(e, _) => e.tokens(),
    }
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'t> Slot<'t> {
    pub fn new(kv: SlotKv) -> Slot<'t> {
        Slot { kv, task: None, last_used: 0 }
    }

    pub fn busy(&self) -> bool {
        self.task.is_some()
    }

    /// Still evaluating its prompt.
    pub fn prefilling(&self) -> bool {
        self.task.as_ref().is_some_and(|t| t.generator.prompt_left() > 0)
    }

    /// The request's test lever.
    pub fn inject_panic(&self) -> bool {
        self.task.as_ref().is_some_and(|t| t.job.inject_panic)
    }

    /// Takes a request: the KV keeps the prefix it shares with the prompt (when the request
    /// caches, and one token short of the whole prompt, whose last logits are needed), the
    /// rest is forgotten; the prompt is checked against the slot's context.
    pub fn start(&mut self, tok: &'t Tokenizer, job: Job, shared: Option<&mut Engine>, round: u64, metrics: &Metrics) {
        self.last_used = round;
        let (engine, seq, spec): (&mut Engine, usize, Option<&mut Speculator>) = match (&mut self.kv, shared) {
            (SlotKv::Own(e, spec), _) => (e, 0, spec.as_mut()),
            (SlotKv::Seq(s), Some(e)) => (e, *s, None),
            (SlotKv::Seq(_), None) => return job.fail(ApiError::Internal("no engine for the slot's sequence".into())),
        };
        let params = match &job.work {
            Work::Generate(p) => p,
            Work::Embed { .. } | Work::SlotAction(_) => return job.fail(ApiError::Internal("a job that is not a generation reached a generating slot".into())),
        };
        let made = catch_unwind(AssertUnwindSafe(|| {
            // A draft engine holds its own copy of the context: with one, start empty.
            let cached = match (job.cache_prompt, &spec) {
                (true, None) => common_prefix(engine.seq_tokens(seq).unwrap_or(&[]), &job.prompt).min(job.prompt.len().saturating_sub(1)),
                _ => 0,
            };
            engine.seq_truncate(seq, cached).map_err(GenerateError::from)?;
            if let Some(s) = spec {
                s.begin(&params.sampler).map_err(|e| GenerateError::Sink(e.to_string()))?;
            }
            // The cached prefix is part of the prompt: the whole prompt must fit.
            let mut generator = Generator::in_context((0, engine.n_ctx()), tok, &job.prompt, params)?;
            generator.skip_cached(cached);
            Ok((generator, cached))
        }));
        match made {
            Ok(Ok((generator, cached))) => {
                metrics.cached(cached);
                let task = Task { job, generator, cached, started: Instant::now() };
                task.progress();
                self.task = Some(task);
            }
            Ok(Err(GenerateError::PromptTooLong { n_prompt, n_ctx, .. })) => {
                job.fail(ApiError::ExceedContext { n_prompt_tokens: n_prompt, n_ctx })
            }
            Ok(Err(e)) => job.fail(ApiError::Internal(e.to_string())),
            Err(panic) => job.fail(ApiError::Internal(format!("starting the generation panicked: {}", panic_text(&*panic)))),
        }
    }

    /// Runs an embedding job at once on the slot's sequence (its KV then holds the last
    /// input, like a prefill) and answers it; the slot stays free. True when a pass panicked
    /// (the engine is then suspect).
    pub fn embed(&mut self, job: Job, shared: Option<&mut Engine>, round: u64, metrics: &Metrics) -> bool {
        self.last_used = round;
        let (engine, seq) = match (&mut self.kv, shared) {
            (SlotKv::Own(e, _), _) => (&mut **e, 0),
            (SlotKv::Seq(s), Some(e)) => (e, *s),
            (SlotKv::Seq(_), None) => {
                job.fail(ApiError::Internal("no engine for the slot's sequence".into()));
                return false;
            }
        };
        let Work::Embed { inputs, pooling } = &job.work else {
            job.fail(ApiError::Internal("a generation reached the embedding path".into()));
            return false;
        };
        let t0 = Instant::now();
        let done = catch_unwind(AssertUnwindSafe(|| {
            if job.inject_panic {
                panic!("injected fault (MINFER_INJECT_PANIC)");
            }
            inputs.iter().map(|ids| embed(engine, seq, ids, *pooling)).collect::<Result<Vec<_>, _>>()
        }));
        match done {
            Ok(Ok(vectors)) => {
                let n_tokens: Vec<usize> = inputs.iter().map(Vec::len).collect();
                metrics.prompt(n_tokens.iter().sum(), t0.elapsed().as_secs_f64());
                let Job { events, ticket, .. } = job;
                drop(ticket);
                let _ = events.send(Event::Reply(Reply::Embedded(Embedded { vectors, n_tokens })));
                false
            }
            Ok(Err(e)) => {
                job.fail(ApiError::Internal(e.to_string()));
                false
            }
            Err(panic) => {
                let what = panic_text(&*panic);
                metrics.panicked();
                eprintln!("minfer serve: inference panicked: {what}; its engine is rebuilt");
                job.fail(ApiError::Internal(format!("inference panicked: {what}")));
                true
            }
        }
    }

    /// Saves, restores or erases this (free) slot's KV at once and answers the job.
    pub fn act(&mut self, job: Job, shared: Option<&mut Engine>, fingerprint: u64) {
        let engine_seq = match (&mut self.kv, shared) {
            (SlotKv::Own(e, _), _) => Some((&mut **e, 0)),
            (SlotKv::Seq(s), Some(e)) => Some((e, *s)),
            (SlotKv::Seq(_), None) => None,
        };
        let (Some((engine, seq)), Work::SlotAction(action)) = (engine_seq, &job.work) else {
            return job.fail(ApiError::Internal("a slot action reached a slot without its engine".into()));
        };
        let id = job.slot.unwrap_or_default();
        match action.run(engine, seq, id, fingerprint) {
            Ok(report) => {
                let Job { events, ticket, .. } = job;
                drop(ticket);
                let _ = events.send(Event::Reply(Reply::Slot(report)));
            }
            Err(e) => job.fail(e),
        }
    }

    /// Ends the request if its client left or its time ran out.
    pub fn drop_if_gone(&mut self, metrics: &Metrics) {
        let Some(task) = self.task.as_ref() else { return };
        if task.job.abandoned() {
            metrics.cancelled();
            self.task = None;
        } else if task.job.expired(Instant::now()) {
            metrics.timed_out();
            let secs = task.job.timeout_secs;
            self.end(Event::Failed(ApiError::Timeout { secs }));
        }
    }

    /// The slot's next pass, its tokens at most `max_chunk` (`n_past` and `n_ctx`: its
    /// sequence's KV). `None`: nothing to evaluate (idle, or the request just ended).
    pub fn plan(&mut self, (n_past, n_ctx): (usize, usize), max_chunk: usize, metrics: &Metrics) -> Option<Pass> {
        let task = self.task.as_mut()?;
        let next = catch_unwind(AssertUnwindSafe(|| task.generator.next_pass(n_past, n_ctx, max_chunk)));
        match next {
            Ok(Ok(NextPass::Eval(pass))) => Some(pass),
            Ok(Ok(NextPass::Done(step))) => {
                // A token sampled without a pass after it (the last one) is generated too.
                if step.token.is_some() {
                    metrics.generated(1, 0.0);
                }
                self.deliver(vec![step]);
                None
            }
            Ok(Err(e)) => {
                self.end(Event::Failed(ApiError::Internal(e.to_string())));
                None
            }
            Err(panic) => {
                self.end(Event::Failed(ApiError::Internal(format!("inference panicked: {}", panic_text(&*panic)))));
                None
            }
        }
    }

    /// Takes the logits of the slot's pass (`secs`: how long the pass took) and reports what
    /// it produced.
    pub fn evaluated(&mut self, pass: Pass, logits: Vec<f32>, secs: f64, metrics: &Metrics) {
        let Some(task) = self.task.as_mut() else { return };
        let (prefill, n) = (pass.is_prefill(), pass.tokens.len());
        let step = task.generator.evaluated(pass, logits, secs);
        if prefill {
            metrics.prompt(n, secs);
            task.progress();
        } else {
            metrics.generated(1, secs);
        }
        self.deliver(vec![step]);
    }

    /// One step of a slot with an engine of its own (a prefill chunk or one token; with a draft
    /// model, one speculative round once the prompt is in). A panic fails the request and
    /// makes its engines anew with `rebuild`.
    pub fn step_own(&mut self, metrics: &Metrics, rebuild: &dyn Fn() -> Option<(Engine, Option<Speculator>)>) {
        let (Some(task), SlotKv::Own(engine, spec)) = (self.task.as_mut(), &mut self.kv) else { return };
        let prompt_left = task.generator.prompt_left();
        let t0 = Instant::now();
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
                    task.progress();
                } else if tokens > 0 {
                    metrics.generated(tokens, secs);
                }
                if let Some(after) = spec.as_ref().map(|s| s.stats()) {
                    metrics.drafted(after.drafted - before.drafted, after.accepted - before.accepted);
                }
                self.deliver(steps);
            }
            Ok(Err(e)) => self.end(Event::Failed(ApiError::Internal(e))),
            Err(panic) => {
                let what = panic_text(&*panic);
                self.panicked(metrics, &what);
                if let Some((fresh, fresh_spec)) = rebuild() {
                    self.kv = SlotKv::Own(Box::new(fresh), fresh_spec);
                }
            }
        }
    }

    /// Fails the request after a panic in its forward pass.
    pub fn panicked(&mut self, metrics: &Metrics, what: &str) {
        metrics.panicked();
        eprintln!("minfer serve: inference panicked: {what}; its engine is rebuilt");
        self.end(Event::Failed(ApiError::Internal(format!("inference panicked: {what}"))));
    }

    /// Fails the request with an error of its forward pass.
    pub fn failed(&mut self, why: String) {
        self.end(Event::Failed(ApiError::Internal(why)));
    }

    /// Sends the steps' tokens; a step that finished ends the request with its usage.
    fn deliver(&mut self, steps: Vec<StepOutput>) {
        let Some(task) = self.task.as_mut() else { return };
        for step in steps {
            let g = task.generator.generation();
            let so_far = Usage {
                prompt_tokens: g.prompt_ids.len(),
                cached_tokens: task.cached,
                completion_tokens: g.generated_ids.len(),
                prompt_secs: g.prompt_secs,
                gen_secs: g.gen_secs,
            };
            if let Some(id) = step.token {
                task.job.send(Event::Token(TokenEvent { id, text: step.text, logprobs: step.logprobs, so_far }));
            }
            if let Some(reason) = step.finished {
                self.end(Event::Done(Finished { reason, usage: so_far }));
                return;
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
