//! The inference thread: owns the slots and runs their forward passes, so every request
//! advances each round and no forward pass ever runs on the async runtime.
//!
//! The slots are sequences of one shared engine (their KV side by side). With batching on
//! (`--batch on`, the default; see docs/SERVER.md) a round is one forward pass: one token of every generating slot,
//! and the rest of the `--ubatch` budget filled with prefill chunks of slots still reading
//! their prompts. With it off, each busy slot gets a pass of its own per round. Either way a
//! sequence's logits are the same bits (the kernels compute a token's row the same way whatever
//! else is in the pass). With a draft model (`--draft`) every slot has engines of its own and
//! speculates on its own, one slot after another.
//!
//! A new request goes to the free slot whose KV shares the longest prefix with its prompt (ties:
//! the least recently used), which then evaluates only the rest (`cache_prompt`).
//!
//! A panic or an error in a batched pass is isolated: each of its sequences is evaluated again
//! on its own, so only the one that fails alone fails. After a panic the engine is made anew
//! and the surviving sequences' tokens are evaluated into it again (same bits: evaluation does
//! not depend on chunking).
//!
//! Requests wait in a FIFO queue for a free slot. A queued or running request whose client
//! went away, or whose `--timeout` passed, is dropped before the next step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use super::error::{ApiError, ServeError};
use super::metrics::Metrics;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use super::slot::{Job, Slot, SlotKv, Work, common_prefix, kv_tokens};
use crate::generate::{DraftParams, Engine, EngineParams, EngineShared, Pass, SeqChunk, Speculator};
use crate::http::panic_text;
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
    /// One forward pass per round for all slots (else one per slot).
    pub batch: bool,
    pub metrics: Arc<Metrics>,
}

/// Builds the engines (so load errors surface here) and starts the thread.
pub fn start(setup: InferenceSetup) -> Result<InferenceHandle, ServeError> {
    let shared = EngineShared::new(&setup.model, setup.engine.n_threads)?;
    let drafts = Drafts::new(&setup, &shared)?;
    let (engine, kvs) = if drafts.draft.is_some() {
        let kvs = (0..setup.n_slots)
            .map(|_| Ok(SlotKv::Own(Box::new(Engine::with_shared(setup.model.clone(), &setup.engine, &shared)?), drafts.speculator()?)))
            .collect::<Result<Vec<_>, ServeError>>()?;
        (None, kvs)
    } else {
        let e = Engine::with_shared(setup.model.clone(), &shared_params(&setup), &shared)?;
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        eprintln!(
            "minfer serve: KV {} cells ({} slots x {}) of {}: {:.1} MiB, {:.1} MiB per slot",
            e.n_ctx() * setup.n_slots,
            setup.n_slots,
            e.n_ctx(),
            e.kv_type(),
            mib(e.kv_bytes()),
            mib(e.kv_bytes() / setup.n_slots.max(1))
        );
        (Some(e), (0..setup.n_slots).map(SlotKv::Seq).collect())
    };
    let (tx, rx) = channel();
    let metrics = setup.metrics.clone();
    metrics.set_slots(setup.n_slots);
    let alive = Arc::new(AtomicBool::new(true));
    let guard = AliveGuard(alive.clone());
    std::thread::Builder::new()
        .name("minfer-infer".into())
        .spawn(move || {
            let _guard = guard;
            run(setup, shared, drafts, (engine, kvs), rx)
        })
        .map_err(ServeError::Thread)?;
    Ok(InferenceHandle { tx, metrics, alive })
}

/// The shared engine's settings: a sequence per slot.
fn shared_params(setup: &InferenceSetup) -> EngineParams {
    EngineParams { n_seq: setup.n_slots, ..setup.engine.clone() }
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

fn run(setup: InferenceSetup, shared: EngineShared, drafts: Drafts, (mut engine, kvs): (Option<Engine>, Vec<SlotKv>), rx: Receiver<Job>) {
    let batch = setup.batch;
    let make_shared = || Engine::with_shared(setup.model.clone(), &shared_params(&setup), &shared);
    let InferenceSetup { model, tok, engine: params, metrics, .. } = &setup;
    let rebuild = || {
        let fresh = Engine::with_shared(model.clone(), params, &shared).map_err(ServeError::from).and_then(|e| Ok((e, drafts.speculator()?)));
        match fresh {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("minfer serve: cannot rebuild a slot's engines ({e}); keeping the old ones");
                None
            }
        }
    };
    let tok: &Tokenizer = tok;
    let fingerprint = super::slot_files::fingerprint(&model.file);
    let mut slots: Vec<Slot<'_>> = kvs.into_iter().map(Slot::new).collect();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut open = true;
    let mut round = 0u64;
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
        round += 1;
        while let Some(job) = queue.front() {
            let Some(i) = pick_slot(&slots, engine.as_ref(), job) else { break };
            let Some(job) = queue.pop_front() else { break };
            metrics.queued_sub();
            let broken = match job.work {
                Work::Generate(_) => {
                    slots[i].start(tok, job, engine.as_mut(), round, metrics);
                    false
                }
                Work::SlotAction(_) => {
                    slots[i].act(job, engine.as_mut(), fingerprint);
                    false
                }
                Work::Embed { .. } => slots[i].embed(job, engine.as_mut(), round, metrics),
            };
            if broken {
                match (engine.take(), &slots[i].kv) {
                    (Some(e), _) => engine = Some(remake_shared(e, &make_shared, &mut slots)),
                    (None, SlotKv::Own(..)) => {
                        if let Some((fresh, spec)) = rebuild() {
                            slots[i].kv = SlotKv::Own(Box::new(fresh), spec);
                        }
                    }
                    (None, SlotKv::Seq(_)) => {}
                }
            }
        }
        metrics.set_busy(slots.iter().filter(|s| s.busy()).count());
        slots.iter_mut().for_each(|s| s.drop_if_gone(metrics));
        match engine.take() {
            Some(mut e) => {
                let broken = if batch { step_batched(&mut e, &mut slots, metrics) } else { step_serial(&mut e, &mut slots, metrics) };
                engine = Some(if broken { remake_shared(e, &make_shared, &mut slots) } else { e });
            }
            None => slots.iter_mut().for_each(|s| s.step_own(metrics, &rebuild)),
        }
        metrics.set_busy(slots.iter().filter(|s| s.busy()).count());
    }
}

/// The free slot for `job`: the one it names (`id_slot`, when free), else the longest KV prefix
/// shared with its prompt (when it caches), then the least recently used.
fn pick_slot(slots: &[Slot<'_>], engine: Option<&Engine>, job: &Job) -> Option<usize> {
    if let Some(i) = job.slot {
        return slots.get(i).filter(|s| !s.busy()).map(|_| i);
    }
    let shared = |s: &Slot<'_>| if job.cache_prompt { common_prefix(kv_tokens(&s.kv, engine), &job.prompt) } else { 0 };
    slots.iter().enumerate().filter(|(_, s)| !s.busy()).max_by_key(|(_, s)| (shared(s), std::cmp::Reverse(s.last_used))).map(|(i, _)| i)
}

/// The sequence of a slot of the shared engine.
fn seq_of(slot: &Slot<'_>) -> Option<usize> {
    match slot.kv {
        SlotKv::Seq(s) => Some(s),
        SlotKv::Own(..) => None,
    }
}

/// Evaluates `chunks` under `catch_unwind`; `inject` panics first (the test lever).
fn guarded(engine: &mut Engine, chunks: &[SeqChunk<'_>], inject: bool) -> Result<Result<(Vec<f32>, f64), String>, String> {
    let t0 = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(|| {
        if inject {
            panic!("injected fault (MINFER_INJECT_PANIC)");
        }
        engine.eval_batch(chunks)
    }));
    match r {
        Ok(Ok(logits)) => Ok(Ok((logits, t0.elapsed().as_secs_f64()))),
        Ok(Err(e)) => Ok(Err(e.to_string())),
        Err(panic) => Err(panic_text(&*panic)),
    }
}

/// Evaluates slot `i`'s pass on its own; true when it panicked (the engine is then suspect).
fn eval_alone(engine: &mut Engine, slot: &mut Slot<'_>, pass: Pass, metrics: &Metrics) -> bool {
    let Some(seq) = seq_of(slot) else { return false };
    let chunk = [SeqChunk { seq, tokens: &pass.tokens }];
    match guarded(engine, &chunk, slot.inject_panic()) {
        Ok(Ok((logits, secs))) => {
            slot.evaluated(pass, logits, secs, metrics);
            false
        }
        Ok(Err(e)) => {
            slot.failed(e);
            false
        }
        Err(what) => {
            slot.panicked(metrics, &what);
            true
        }
    }
}

/// The next pass of slot `i` (`max_chunk` tokens at most).
fn plan(engine: &Engine, slot: &mut Slot<'_>, max_chunk: usize, metrics: &Metrics) -> Option<Pass> {
    let seq = seq_of(slot)?;
    let n_past = engine.seq_tokens(seq).map_or(0, <[u32]>::len);
    slot.plan((n_past, engine.n_ctx()), max_chunk, metrics)
}

/// One pass per busy slot. True when a pass panicked.
fn step_serial(engine: &mut Engine, slots: &mut [Slot<'_>], metrics: &Metrics) -> bool {
    let mut broken = false;
    for slot in slots.iter_mut().filter(|s| s.busy()) {
        if let Some(pass) = plan(engine, slot, usize::MAX, metrics) {
            broken |= eval_alone(engine, slot, pass, metrics);
        }
    }
    broken
}

/// One pass for all busy slots: a token of each generating slot first, then prefill chunks
/// while the `n_ubatch` budget lasts. True when a pass panicked.
fn step_batched(engine: &mut Engine, slots: &mut [Slot<'_>], metrics: &Metrics) -> bool {
    let mut budget = engine.n_ubatch();
    let mut passes: Vec<(usize, Pass)> = Vec::new();
    for prefill in [false, true] {
        for (i, slot) in slots.iter_mut().enumerate().filter(|(_, s)| s.busy() && s.prefilling() == prefill) {
            if prefill && budget == 0 {
                break;
            }
            if let Some(pass) = plan(engine, slot, budget.max(1), metrics) {
                budget = budget.saturating_sub(pass.tokens.len());
                passes.push((i, pass));
            }
        }
    }
    if passes.is_empty() {
        return false;
    }
    let chunks: Vec<SeqChunk<'_>> = passes.iter().filter_map(|(i, p)| Some(SeqChunk { seq: seq_of(&slots[*i])?, tokens: &p.tokens })).collect();
    let inject = passes.iter().any(|(i, _)| slots[*i].inject_panic());
    match guarded(engine, &chunks, inject) {
        Ok(Ok((logits, secs))) => {
            let n_vocab = engine.n_vocab();
            for ((i, pass), row) in passes.into_iter().zip(logits.chunks_exact(n_vocab)) {
                slots[i].evaluated(pass, row.to_vec(), secs, metrics);
            }
            false
        }
        // Something in the pass failed: each sequence again on its own, so only the one that
        // fails alone fails.
        _ => {
            drop(chunks);
            let mut broken = false;
            for (i, pass) in passes {
                broken |= eval_alone(engine, &mut slots[i], pass, metrics);
            }
            broken
        }
    }
}

/// After a panic: a new shared engine, with every busy slot's tokens evaluated into it again
/// (idle slots lose their cached prompts). A slot whose tokens cannot be restored fails.
fn remake_shared(old: Engine, make: &dyn Fn() -> Result<Engine, crate::generate::EngineError>, slots: &mut [Slot<'_>]) -> Engine {
    let mut fresh = match make() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("minfer serve: cannot rebuild the engine ({e}); keeping the old one");
            return old;
        }
    };
    let ub = fresh.n_ubatch().max(1);
    for slot in slots.iter_mut().filter(|s| s.busy()) {
        let Some(seq) = seq_of(slot) else { continue };
        let tokens = old.seq_tokens(seq).unwrap_or(&[]).to_vec();
        let restored = tokens.chunks(ub).try_for_each(|part| fresh.eval_batch(&[SeqChunk { seq, tokens: part }]).map(drop));
        if let Err(e) = restored {
            slot.failed(format!("restoring the sequence after a fault: {e}"));
        }
    }
    fresh
}
