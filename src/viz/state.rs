//! What the visualizer's handlers share: settings, the model and its one engine, the event
//! channel every page subscribes to, and the last finished trace.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::VizError;
use crate::chat::{ChatTemplate, chat_template_for};
use crate::generate::{Engine, EngineParams};
use crate::gguf::GgufFile;
use crate::graph::KvType;
use crate::models::load_model;
use crate::tokenizer::Tokenizer;

/// `minfer viz`'s settings.
#[derive(Debug, Clone)]
pub struct VizConfig {
    pub model: PathBuf,
    pub host: String,
    pub port: u16,
    pub threads: usize,
    /// KV rows: the longest prompt + generation a run may have.
    pub n_ctx: usize,
    pub backends: Option<String>,
    pub kv_type: KvType,
    /// Samples kept per node.
    pub max_values: usize,
    /// Saved traces the page can open (`GET /viz/samples`); `MINFER_VIZ_DIR` by default.
    pub trace_dir: Option<PathBuf>,
    /// `--chat-template FILE`: the chat template instead of the model's.
    pub chat_template: Option<PathBuf>,
}

/// Most tokens one run may generate.
pub const MAX_RUN_TOKENS: usize = 512;

/// Events a subscriber may fall behind by before it is told it missed some (`lagged`). A
/// decode step of a 24-layer model is about 370 node events.
const EVENT_BACKLOG: usize = 1 << 16;

/// One server-sent event: its name and JSON data.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub event: &'static str,
    pub data: String,
}

impl Frame {
    pub fn new(event: &'static str, data: &Value) -> Arc<Frame> {
        Arc::new(Frame { event, data: data.to_string() })
    }
}

pub struct VizState {
    pub cfg: VizConfig,
    /// `general.name`, else the architecture.
    pub model_name: String,
    pub tok: Arc<Tokenizer>,
    /// `None` when the model has no chat template (a `chat` run is then refused).
    pub template: Option<ChatTemplate>,
    engine: Mutex<Engine>,
    events: broadcast::Sender<Arc<Frame>>,
    busy: AtomicBool,
    cancel: AtomicBool,
    run_seq: AtomicU64,
    /// The id of the run holding the engine (0: none).
    current: AtomicU64,
    /// Held while a run is claimed and while a run ends (engine freed, `done` sent), so that a
    /// run's last event precedes the next run's first.
    gate: Mutex<()>,
    /// The last finished run's trace (a `minfer-trace` document), serialized.
    last_trace: Mutex<Option<Bytes>>,
}

/// `lock`, also after a panic elsewhere (the data is replaced wholesale or only read).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VizState {
    /// Opens the model and builds its engine.
    pub fn load(cfg: VizConfig) -> Result<Arc<VizState>, VizError> {
        let fail = |reason: String| VizError::Load { path: cfg.model.display().to_string(), reason };
        let file = GgufFile::open(&cfg.model).map_err(|e| fail(e.to_string()))?;
        let tok = Tokenizer::from_gguf(&file).map_err(|e| fail(e.to_string()))?;
        // A `--chat-template FILE` must load; the model's own, when it does not compile, turns
        // chat runs off with a word on stderr.
        let template = match (&cfg.chat_template, chat_template_for(&file, cfg.chat_template.as_deref())) {
            (_, Ok(t)) => t,
            (Some(_), Err(e)) => return Err(fail(e.to_string())),
            (None, Err(e)) => {
                eprintln!("minfer viz: the model's chat template does not compile ({e}); chat runs are off");
                None
            }
        };
        let model = Arc::new(load_model(Arc::new(file)).map_err(|e| fail(e.to_string()))?);
        let p = EngineParams {
            n_ctx: cfg.n_ctx,
            n_seq: 1,
            n_ubatch: crate::generate::DEFAULT_UBATCH,
            memory_cap: None,
            n_threads: cfg.threads,
            backends: cfg.backends.clone(),
            trace: false,
            dump: None,
            kv_type: cfg.kv_type,
        };
        let engine = Engine::new(model.clone(), &p).map_err(|e| fail(e.to_string()))?;
        let (events, _) = broadcast::channel(EVENT_BACKLOG);
        Ok(Arc::new(VizState {
            model_name: model.display_name(),
            cfg,
            tok: Arc::new(tok),
            template,
            engine: Mutex::new(engine),
            events,
            busy: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            run_seq: AtomicU64::new(0),
            current: AtomicU64::new(0),
            gate: Mutex::new(()),
            last_trace: Mutex::new(None),
        }))
    }

    pub fn engine(&self) -> MutexGuard<'_, Engine> {
        lock(&self.engine)
    }

    /// The engine if no run holds it.
    pub fn try_engine(&self) -> Option<MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Frame>> {
        self.events.subscribe()
    }

    /// Sends to every page listening (nobody listening is fine).
    pub fn send(&self, frame: Arc<Frame>) {
        let _ = self.events.send(frame);
    }

    pub fn sender(&self) -> broadcast::Sender<Arc<Frame>> {
        self.events.clone()
    }

    /// Claims the engine for a new run; `None` while another run holds it.
    pub fn try_start(self: &Arc<Self>) -> Option<RunGuard> {
        let _gate = lock(&self.gate);
        self.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok()?;
        self.cancel.store(false, Ordering::Release);
        let id = self.run_seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.current.store(id, Ordering::Release);
        Some(RunGuard { st: self.clone(), id, ended: false })
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// The run holding the engine, if any.
    pub fn current_run(&self) -> Option<u64> {
        Some(self.current.load(Ordering::Acquire)).filter(|&id| id != 0 && self.busy())
    }

    /// Asks the run in progress to stop after its current forward pass; false when none runs.
    pub fn request_stop(&self) -> bool {
        self.cancel.store(true, Ordering::Release);
        self.busy()
    }

    pub fn stop_requested(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    pub fn set_last_trace(&self, trace: Vec<u8>) {
        *lock(&self.last_trace) = Some(Bytes::from(trace));
    }

    /// Shared, not copied.
    pub fn last_trace(&self) -> Option<Bytes> {
        lock(&self.last_trace).clone()
    }
}

/// The claim on the engine for one run; [`RunGuard::finish`] (or a drop, after a panic) frees
/// the engine.
pub struct RunGuard {
    pub st: Arc<VizState>,
    pub id: u64,
    ended: bool,
}

impl RunGuard {
    /// Frees the engine and sends the run's last event, before any other run can claim it: a
    /// client that sees the event finds the engine free, and the next run's events follow it.
    pub fn finish(mut self, last: Arc<Frame>) {
        let st = self.st.clone();
        let _gate = lock(&st.gate);
        self.release();
        st.send(last);
    }

    fn release(&mut self) {
        if !self.ended {
            self.ended = true;
            self.st.current.store(0, Ordering::Release);
            self.st.busy.store(false, Ordering::Release);
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        self.release();
    }
}
