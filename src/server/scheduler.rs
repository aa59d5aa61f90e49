//! The inference thread: owns the slots and interleaves their forward passes, one step per
//! busy slot per round (a prefill chunk or one token), so every request advances and no
//! forward pass ever runs on the async runtime. The slots share the model's weights and the
//! CPU worker pool; since one thread drives them, their passes never overlap.
//!
//! Requests wait in a FIFO queue for a free slot. A queued or running request whose client
//! went away, or whose `--timeout` passed, is dropped before the next step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use super::error::{ApiError, ServeError};
use super::metrics::Metrics;
use super::slot::{Job, Slot};
use crate::generate::{DraftParams, Engine, EngineParams, EngineShared, Speculator};
use crate::models::Model;
use crate::tokenizer::Tokenizer;

/// Where handlers hand requests to the inference thread.
pub struct InferenceHandle {
    tx: Sender<Job>,
    metrics: Arc<Metrics>,
    alive: Arc<AtomicBool>,
}

impl InferenceHandle {
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        if !self.alive() {
            return Err(ApiError::Stopped);
        }
        self.metrics.queued_add();
        self.tx.send(job).map_err(|_| {
            self.metrics.queued_sub();
            ApiError::Stopped
        })
    }

    /// False once the inference thread has ended (it only ends by a fault: `/health` then
    /// answers 503).
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// Clears the liveness flag when the inference thread ends, panicking or not.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the inference thread needs.
pub struct InferenceSetup {
    pub model: Arc<Model>,
    /// Draft model for speculative decoding: each slot gets a draft engine (weights shared,
    /// on the same worker threads).
    pub draft: Option<(Arc<Model>, DraftParams)>,
    pub tok: Arc<Tokenizer>,
    pub n_slots: usize,
    /// Engine settings of every slot (`n_ctx` is the slot's context).
    pub engine: EngineParams,
    pub metrics: Arc<Metrics>,
}

/// Builds the slots' engines (so load errors surface here) and starts the thread.
pub fn start(setup: InferenceSetup) -> Result<InferenceHandle, ServeError> {
    let shared = EngineShared::new(&setup.model, setup.engine.n_threads)?;
    let drafts = Drafts::new(&setup, &shared)?;
    let slots = (0..setup.n_slots)
        .map(|_| Ok((Engine::with_shared(setup.model.clone(), &setup.engine, &shared)?, drafts.speculator()?)))
        .collect::<Result<Vec<_>, ServeError>>()?;
    let (tx, rx) = channel();
    let metrics = setup.metrics.clone();
    metrics.set_slots(setup.n_slots);
    let alive = Arc::new(AtomicBool::new(true));
    let guard = AliveGuard(alive.clone());
    std::thread::Builder::new()
        .name("minfer-infer".into())
        .spawn(move || {
            let _guard = guard;
            run(setup, shared, drafts, slots, rx)
        })
        .map_err(ServeError::Thread)?;
    Ok(InferenceHandle { tx, metrics, alive })
}

/// The draft model's weights on the target's workers, and how each slot's draft engine is made.
struct Drafts {
    draft: Option<(Arc<Model>, DraftParams, EngineShared, EngineParams)>,
}

impl Drafts {
    fn new(setup: &InferenceSetup, target: &EngineShared) -> Result<Drafts, ServeError> {
        let Some((model, params)) = &setup.draft else { return Ok(Drafts { draft: None }) };
        let shared = EngineShared::with_pool(model, target.pool.clone())?;
        let engine = EngineParams { n_threads: 1, trace: false, dump: None, ..setup.engine.clone() };
        Ok(Drafts { draft: Some((model.clone(), *params, shared, engine)) })
    }

    /// A fresh speculator for a slot (`None` without a draft model).
    fn speculator(&self) -> Result<Option<Speculator>, ServeError> {
        let Some((model, params, shared, engine)) = &self.draft else { return Ok(None) };
        let e = Engine::with_shared(model.clone(), engine, shared)?;
        Ok(Some(Speculator::new(e, *params).map_err(|e| ServeError::Config(e.to_string()))?))
    }
}

fn run(setup: InferenceSetup, shared: EngineShared, drafts: Drafts, slots: Vec<(Engine, Option<Speculator>)>, rx: Receiver<Job>) {
    let InferenceSetup { model, tok, engine: params, metrics, .. } = setup;
    let rebuild = || {
        let fresh = Engine::with_shared(model.clone(), &params, &shared).map_err(ServeError::from).and_then(|e| Ok((e, drafts.speculator()?)));
        match fresh {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("minfer serve: cannot rebuild a slot's engines ({e}); keeping the old ones");
                None
            }
        }
    };
    let tok: &Tokenizer = &tok;
    let mut slots: Vec<Slot<'_>> = slots.into_iter().map(|(e, s)| Slot::new(e, s)).collect();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut open = true;
    loop {
        let idle = queue.is_empty() && !slots.iter().any(Slot::busy);
        if idle {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let now = std::time::Instant::now();
        let mut waiting = VecDeque::with_capacity(queue.len());
        for job in queue.drain(..) {
            if job.abandoned() {
                metrics.queued_sub();
                metrics.cancelled();
            } else if job.expired(now) {
                metrics.queued_sub();
                metrics.timed_out();
                let secs = job.timeout_secs;
                job.fail(ApiError::Timeout { secs });
            } else {
                waiting.push_back(job);
            }
        }
        queue = waiting;
        for slot in slots.iter_mut().filter(|s| !s.busy()) {
            let Some(job) = queue.pop_front() else { break };
            metrics.queued_sub();
            slot.start(tok, job);
        }
        metrics.set_busy(slots.iter().filter(|s| s.busy()).count());
        for slot in slots.iter_mut() {
            slot.step(&metrics, &rebuild);
        }
        metrics.set_busy(slots.iter().filter(|s| s.busy()).count());
    }
}
