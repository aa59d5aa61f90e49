//! The server's shared state: its settings, counters, admission, and the model once loaded.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::admission::Admission;
use super::error::{ApiError, ServeError};
use super::metrics::Metrics;
use super::scheduler::{InferenceHandle, InferenceSetup, start};
use crate::chat::{ChatTemplate, RenderOptions, chat_template_for};
use crate::generate::{DraftParams, EngineParams, NodeDump, Pooling, check_vocab};
use crate::gguf::GgufFile;
use crate::grammar::GrammarVocab;
use crate::models::load_model;
use crate::tokenizer::Tokenizer;

/// `minfer serve`'s settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub model: PathBuf,
    pub host: String,
    pub port: u16,
    pub slots: usize,
    /// One forward pass per step for all busy slots (else one per slot).
    pub batch: bool,
    /// Total KV context, split evenly across the slots; `None`: 4096 per slot (at most the
    /// model's training context).
    pub ctx_total: Option<usize>,
    pub threads: usize,
    /// Requests that may wait for a slot beyond those generating.
    pub queue: usize,
    pub api_key: Option<String>,
    /// Longest a request may take, queue wait included; 0: no limit.
    pub timeout_secs: u64,
    /// The model id reported by `/v1/models` and in responses (default: the file's stem).
    pub alias: Option<String>,
    /// Prefill chunk: a long prompt is evaluated this many tokens per step, so other slots'
    /// decoding goes on between chunks.
    pub ubatch: usize,
    pub backends: Option<String>,
    /// Test lever `MINFER_INJECT_PANIC`: a request whose prompt text contains this string
    /// panics in its first forward pass.
    pub inject_panic: Option<String>,
    /// How the slots' KV cells are stored.
    pub kv_type: crate::graph::KvType,
    /// Draft model for speculative decoding, and how it drafts.
    pub draft: Option<(PathBuf, DraftParams)>,
    /// Time a connection has to send a request's headers (also the longest a kept-alive
    /// connection may sit idle), and, after them, its body.
    pub read_timeout_secs: u64,
    /// A client that accepts no response bytes for this long is disconnected.
    pub idle_timeout_secs: u64,
    /// Open connections at most; one more is answered 503.
    pub max_connections: usize,
    /// On SIGTERM, how long generations in flight may take to finish.
    pub drain_timeout_secs: u64,
    /// `--chat-template FILE`: the chat template instead of the model's.
    pub chat_template: Option<PathBuf>,
    /// `--tags`: labels `/v1/models` reports (llama-server's).
    pub tags: Vec<String>,
    /// What a request leaves out: `--temp`, `--seed`, `--n-predict` (llama-server's flags).
    pub defaults: RequestDefaults,
    /// `--cors-origins`: which browser origins may read responses (`None`: no CORS headers).
    pub cors: Option<super::cors::CorsOrigins>,
    /// `/metrics` and `/slots` answer (else 501, as llama-server without `--metrics` or with
    /// `--no-slots`).
    pub metrics_endpoint: bool,
    pub slots_endpoint: bool,
    /// `GET /` serves the chat page (else 404: `--no-ui`).
    pub ui: bool,
    /// `--slot-save-path`: the directory slot files are saved to and restored from (`None`:
    /// slot actions answer 501).
    pub slot_save_path: Option<PathBuf>,
    /// `--pooling`: how embeddings pool (`None`: the model's `pooling_type`, else last).
    pub pooling: Option<Pooling>,
}

/// Server-wide defaults for the sampling fields a request leaves out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestDefaults {
    /// `--temp`: else the sampler's default (0.8, as llama.cpp).
    pub temperature: Option<f32>,
    /// `--seed`: else a fresh seed per request.
    pub seed: Option<u64>,
    /// `--n-predict`: the most tokens a request generates when it names no limit (else until
    /// the slot's context is full).
    pub n_predict: Option<usize>,
    /// `--prefill-assistant`: a conversation that ends with an assistant message is continued
    /// from it (llama-server's default) instead of answered with a new turn (OpenAI's).
    pub prefill_assistant: bool,
    /// `--verbose`: every whole response carries `__verbose` (the prompt as the model read
    /// it), as a request's `"verbose": true` asks.
    pub verbose: bool,
}

/// Defaults of the connection limits (`minfer serve --read-timeout` etc.).
pub const DEFAULT_READ_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;
pub const DEFAULT_MAX_CONNECTIONS: u32 = 512;
pub const DEFAULT_DRAIN_TIMEOUT_SECS: u64 = 30;

/// Per-slot context when none is given.
pub const DEFAULT_SLOT_CTX: usize = 4096;

impl ServeConfig {
    /// The context of one slot, given the model's training context.
    pub fn slot_ctx(&self, n_ctx_train: usize) -> Result<usize, ServeError> {
        let per = match self.ctx_total {
            Some(total) => total / self.slots,
            None => DEFAULT_SLOT_CTX.min(n_ctx_train.max(1)),
        };
        if per == 0 {
            return Err(ServeError::Config(format!(
                "--ctx {} gives less than one token per slot for {} slots",
                self.ctx_total.unwrap_or(0),
                self.slots
            )));
        }
        Ok(per)
    }
}

/// The opened model file and draft (with its settings), before loading.
pub struct Opened {
    pub file: GgufFile,
    pub draft: Option<(GgufFile, DraftParams)>,
}

/// The model, its tokenizer and template, and the inference thread.
/// What Ollama's `/api/tags` and `/api/show` report of the model file.
#[derive(Debug, Clone, Default)]
pub struct ModelFacts {
    pub arch: String,
    pub n_params: u64,
    pub file_size: u64,
    /// The type most of the weights' bytes are stored in (`Q4_K`, `F16`, …).
    pub quantization: String,
}

impl ModelFacts {
    fn of(f: &GgufFile) -> ModelFacts {
        ModelFacts {
            arch: f.opt_str("general.architecture").ok().flatten().unwrap_or("").to_string(),
            n_params: f.n_params(),
            file_size: f.file_size(),
            quantization: f.type_mix().into_iter().max_by_key(|(_, (_, bytes))| *bytes).map(|(t, _)| t.to_string()).unwrap_or_default(),
        }
    }
}

pub struct Loaded {
    pub model_id: String,
    pub facts: ModelFacts,
    /// Every name of `--alias` (sorted; the id is the first).
    pub aliases: Vec<String>,
    /// Unix time the model was loaded (`created` of `/v1/models`).
    pub created: u64,
    pub tok: Arc<Tokenizer>,
    /// `None` when the file has no usable chat template (chat requests then get a 400).
    pub template: Option<Arc<ChatTemplate>>,
    /// Template options with the model's BOS/EOS texts.
    pub render: RenderOptions,
    pub n_ctx_slot: usize,
    pub n_vocab: usize,
    /// Width of an embedding.
    pub n_embd: usize,
    /// How embeddings pool (`--pooling`, else the model's), or why the model cannot embed.
    pub pooling: Result<Pooling, String>,
    pub inference: InferenceHandle,
    /// The vocabulary's token trie for structured output, built by the first request that
    /// needs it (about half a second for a 150k vocabulary) and shared by all after it.
    grammar_vocab: OnceLock<Result<Arc<GrammarVocab>, String>>,
}

pub struct AppState {
    pub cfg: ServeConfig,
    pub lifecycle: super::lifecycle::Lifecycle,
    /// KiB of request bodies that may be read at once ([`super::routes::BODY_BUDGET`]).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    pub metrics: Arc<Metrics>,
    pub admission: Arc<Admission>,
    pub loaded: OnceLock<Loaded>,
    /// Unix time the server started (`/metrics`' `Process-Start-Time-Unix`).
    pub started: u64,
    /// Recent Responses API conversations, for `previous_response_id`.
    pub responses: super::responses::ResponseStore,
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl AppState {
    pub fn new(cfg: ServeConfig) -> Arc<AppState> {
        let admission = Admission::new(cfg.slots, cfg.queue);
        Arc::new(AppState {
            cfg,
            lifecycle: Default::default(),
            body_budget: Arc::new(tokio::sync::Semaphore::new(super::routes::BODY_BUDGET / 1024)),
            metrics: Arc::new(Metrics::default()),
            admission,
            loaded: OnceLock::new(),
            started: unix_now(),
            responses: Default::default(),
        })
    }

    /// The loaded model, or 503 while it loads (or after its inference thread died).
    pub fn model(&self) -> Result<&Loaded, ApiError> {
        let m = self.loaded.get().ok_or(ApiError::Loading)?;
        if !m.inference.alive() {
            return Err(ApiError::Stopped);
        }
        Ok(m)
    }

    /// Opens the model file and the draft's (their headers and metadata: quick) and checks
    /// that the draft shares the model's vocabulary, so that a missing or malformed file, or a
    /// draft that cannot draft, fails before the server listens.
    pub fn open_model(&self) -> Result<Opened, ServeError> {
        let open = |path: &std::path::Path| {
            GgufFile::open(path).map_err(|e| ServeError::Load { path: path.display().to_string(), reason: e.to_string() })
        };
        let file = open(&self.cfg.model)?;
        let Some((draft_path, params)) = &self.cfg.draft else { return Ok(Opened { file, draft: None }) };
        let draft = open(draft_path)?;
        let tokenizer = |f: &GgufFile, path: &std::path::Path| {
            Tokenizer::from_gguf(f).map_err(|e| ServeError::Load { path: path.display().to_string(), reason: e.to_string() })
        };
        let (tok, draft_tok) = (tokenizer(&file, &self.cfg.model)?, tokenizer(&draft, draft_path)?);
        let fail = |reason: String| ServeError::Load { path: draft_path.display().to_string(), reason };
        check_vocab(&tok, &draft_tok).map_err(|e| fail(e.to_string()))?;
        Ok(Opened { file, draft: Some((draft, *params)) })
    }

    /// Loads the model (and the draft) from the opened files and starts the inference thread
    /// (blocking: call off the runtime).
    pub fn load(&self, opened: Opened) -> Result<(), ServeError> {
        let Opened { file, draft } = opened;
        let path = self.cfg.model.display().to_string();
        let fail = |reason: String| ServeError::Load { path: path.clone(), reason };
        let tok = Tokenizer::from_gguf(&file).map_err(|e| fail(e.to_string()))?;
        let facts = ModelFacts::of(&file);
        // `--chat-template FILE` must load; the model's own template, when it does not compile,
        // turns chat off with a word on stderr (completions still work).
        let template = match (&self.cfg.chat_template, chat_template_for(&file, self.cfg.chat_template.as_deref())) {
            (_, Ok(t)) => t.map(Arc::new),
            (Some(_), Err(e)) => return Err(fail(e.to_string())),
            (None, Err(e)) => {
                eprintln!("minfer serve: the model's chat template does not compile ({e}); /v1/chat/completions is off");
                None
            }
        };
        let render = RenderOptions::for_tokenizer(&tok);
        let model = Arc::new(load_model(Arc::new(file)).map_err(|e| fail(e.to_string()))?);
        let n_ctx_slot = self.cfg.slot_ctx(model.hparams().n_ctx_train as usize)?;
        let n_vocab = model.hparams().n_vocab as usize;
        let n_embd = model.hparams().n_embd as usize;
        let pooling = match self.cfg.pooling {
            Some(p) => Ok(p),
            None => Pooling::of_model(&model.file).map_err(|e| e.to_string()),
        };
        let tok = Arc::new(tok);
        let engine = EngineParams {
            n_ctx: n_ctx_slot,
            n_seq: 1,
            n_ubatch: self.cfg.ubatch.max(1),
            memory_cap: None,
            n_threads: self.cfg.threads,
            backends: self.cfg.backends.clone(),
            trace: false,
            dump: None::<NodeDump>,
            kv_type: self.cfg.kv_type,
        };
        let draft = match draft {
            None => None,
            Some((f, params)) => {
                let path = self.cfg.draft.as_ref().map_or_else(String::new, |d| d.0.display().to_string());
                let m = load_model(Arc::new(f)).map_err(|e| ServeError::Load { path, reason: e.to_string() })?;
                Some((Arc::new(m), params))
            }
        };
        let inference = start(InferenceSetup {
            model,
            draft,
            tok: tok.clone(),
            n_slots: self.cfg.slots,
            engine,
            batch: self.cfg.batch,
            metrics: self.metrics.clone(),
        })?;
        // `--alias a,b,c` (llama-server's form): every name answers, the first in sorted order
        // is the id.
        let mut aliases: Vec<String> = self.cfg.alias.as_deref().unwrap_or("").split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect();
        aliases.sort();
        aliases.dedup();
        let model_id = aliases.first().cloned().unwrap_or_else(|| {
            self.cfg.model.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        });
        let loaded = Loaded { model_id, facts, aliases, created: unix_now(), tok, template, render, n_ctx_slot, n_vocab, n_embd, pooling, inference, grammar_vocab: OnceLock::new() };
        let _ = self.loaded.set(loaded);
        Ok(())
    }
}

impl Loaded {
    /// Whether `name` is this model's id or one of its `--alias` names.
    pub fn answers_to(&self, name: &str) -> bool {
        self.model_id == name || self.aliases.iter().any(|a| a == name)
    }

    /// The token trie for structured output (built on first use; blocking: call off the
    /// runtime).
    pub fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, ApiError> {
        self.grammar_vocab
            .get_or_init(|| GrammarVocab::new(self.tok.clone()).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(ApiError::Internal)
    }

    /// Template render options for a generation prompt.
    pub fn render_options(&self, tools: Option<serde_json::Value>, extra: serde_json::Map<String, serde_json::Value>) -> RenderOptions {
        RenderOptions { add_generation_prompt: true, tools, extra, ..self.render.clone() }
    }
}
