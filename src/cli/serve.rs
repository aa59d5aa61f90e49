//! `minfer serve`: the OpenAI-compatible HTTP server.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use super::draft_args::DraftArgs;
use super::engine_args::kv_type_arg;
use crate::generate::{Pooling, default_threads};
use crate::server::state::{DEFAULT_DRAIN_TIMEOUT_SECS, DEFAULT_IDLE_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_SECS};
use crate::server::state::RequestDefaults;
use crate::server::{ServeConfig, serve};

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The GGUF model file.
    #[arg(short, long, allow_hyphen_values = true)]
    pub model: PathBuf,
    /// Address to listen on; several separated by commas (e.g. 127.0.0.1,::1).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generated at the same time; each slot has its own KV cells.
    /// One forward pass per step for all slots (`on`, the default) or one per slot (`off`);
    /// answers are the same bits either way. Default: MINFER_BATCH=0/1, else on (measured
    /// faster: docs/SERVER.md).
    #[arg(long = "batch", value_parser = ["on", "off"])]
    pub batch: Option<String>,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub slots: u32,
    /// TOTAL context in tokens, split evenly across the slots (each slot gets ctx / slots).
    /// Default: 4096 per slot, at most the model's training context.
    #[arg(long = "ctx")]
    pub ctx: Option<usize>,
    /// Worker threads of the forward passes (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Requests that may wait for a free slot; beyond that the server answers 503.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on the API routes (/health and /metrics stay open).
    /// Default: the MINFER_API_KEY environment variable, if set.
    #[arg(long = "api-key", allow_hyphen_values = true)]
    pub api_key: Option<String>,
    /// Longest a request may take, queue wait included, in seconds (0: no limit); past it the
    /// generation stops and the request gets a 504 (or an error event in a stream).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Render chat requests with this Jinja chat template file instead of the model's (a model
    /// without one needs it for /v1/chat/completions), or a template llama.cpp knows by name:
    /// chatml, llama3, command-r.
    #[arg(long, allow_hyphen_values = true)]
    pub chat_template: Option<PathBuf>,
    /// Model id reported by /v1/models and in responses (default: the file name without .gguf);
    /// several names separated by commas all answer, the first in sorted order is the id.
    #[arg(long, allow_hyphen_values = true)]
    pub alias: Option<String>,
    /// Prefill chunk in tokens: long prompts are evaluated in pieces so that other slots keep
    /// generating between them.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub ubatch: u32,
    /// Backends allowed to run nodes, comma-separated (cpu, metal, cuda).
    #[arg(long = "backend")]
    pub backend: Option<String>,
    /// KV cache storage of every slot: f32 (default), f16 or q8_0. Default: MINFER_CACHE_TYPE.
    #[arg(long = "cache-type")]
    pub cache_type: Option<String>,
    /// Seconds a client has to send a request's headers, and then its body; also the longest
    /// a kept-alive connection may sit idle. A slower client is disconnected (headers) or
    /// answered 408 (body).
    #[arg(long = "read-timeout", default_value_t = DEFAULT_READ_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub read_timeout: u64,
    /// Seconds a client may accept no response bytes (a stream it stopped reading) before it
    /// is disconnected and its generation stopped.
    #[arg(long = "idle-timeout", default_value_t = DEFAULT_IDLE_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout: u64,
    /// Open connections at most; beyond it a connection is answered 503 with Retry-After.
    #[arg(long = "max-connections", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// On SIGTERM or Ctrl-C: seconds the generations in flight may take to finish (no new
    /// ones are taken, /health says "draining"); the rest then end with finish_reason
    /// "shutdown".
    #[arg(long = "drain-timeout", default_value_t = DEFAULT_DRAIN_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub drain_timeout: u64,
    /// Temperature of requests that give none (llama-server's --temp) [default: 0.8].
    #[arg(long = "temp", value_parser = parse_temp)]
    pub temp: Option<f32>,
    /// Seed of requests that give none (llama-server's --seed; -1: a fresh one per request,
    /// the default).
    #[arg(long, allow_hyphen_values = true)]
    pub seed: Option<i64>,
    /// Most tokens a request generates when it sets no max_tokens / n_predict (llama-server's
    /// --n-predict; -1: until the slot's context is full, the default).
    #[arg(long = "n-predict", allow_hyphen_values = true)]
    pub n_predict: Option<i64>,
    /// Browser origins allowed to read responses (CORS): `*` (any, echoed back), `localhost`
    /// (http(s)://localhost, 127.0.0.1 or [::1] on any port), or a comma-separated list of
    /// exact origins. Default: `*`, as llama-server.
    #[arg(long = "cors-origins", default_value = "*")]
    pub cors_origins: String,
    /// Continue a conversation that ends with an assistant message from that message
    /// (llama-server's default), instead of answering it with a new turn (OpenAI's, the
    /// default here). `continue_final_message` asks for it per request.
    #[arg(long = "prefill-assistant")]
    pub prefill_assistant: bool,
    /// Add `__verbose` (the prompt as the model read it) to every whole response, as a
    /// request's `"verbose": true` does (llama-server's --verbose).
    #[arg(long = "verbose")]
    pub verbose: bool,
    /// Labels for /v1/models, comma-separated (llama-server's --tags).
    #[arg(long, value_delimiter = ',')]
    pub tags: Vec<String>,
    /// Do not serve the chat page at GET / (a plain page over /v1/chat/completions).
    #[arg(long = "no-ui")]
    pub no_ui: bool,
    /// Answer GET /metrics with 501 instead of the Prometheus text.
    #[arg(long = "no-metrics")]
    pub no_metrics: bool,
    /// Answer GET /slots with 501 (llama-server's --no-slots) instead of the slots' state.
    #[arg(long = "no-slots-endpoint")]
    pub no_slots_endpoint: bool,
    /// Directory where POST /slots/{id}?action=save writes a slot's KV and action=restore reads
    /// it (llama-server's --slot-save-path; created when missing). Without it those answer 501.
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// How embeddings pool the final hidden states: none, mean, cls or last (llama-server's
    /// --pooling). Default: the model's `pooling_type`, else last.
    #[arg(long, value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    #[command(flatten)]
    pub draft: DraftArgs,
}

fn parse_pooling(s: &str) -> Result<Pooling, String> {
    s.parse().map_err(|e: crate::generate::EmbedError| e.to_string())
}

fn parse_temp(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if (0.0..=2.0).contains(&t) => Ok(t),
        _ => Err(format!("'{s}' is not a temperature between 0 and 2")),
    }
}

/// `--batch on|off`, else `MINFER_BATCH=1/0`, else on: the load run measures it faster on the
/// CPU (docs/SERVER.md); the design record's "the default follows the device".
fn batch_arg(arg: Option<&str>) -> Result<bool, CliError> {
    match arg {
        Some(v) => Ok(v == "on"),
        None => match std::env::var("MINFER_BATCH").ok().as_deref() {
            None | Some("") => Ok(true),
            Some("1") => Ok(true),
            Some("0") => Ok(false),
            Some(_) => Err(CliError::Usage("MINFER_BATCH must be 0 or 1")),
        },
    }
}

pub fn run(a: ServeArgs) -> Result<(), CliError> {
    if a.ctx.is_some_and(|c| c < a.slots as usize) {
        return Err(CliError::Usage("--ctx is the total context: it must give every slot at least one token"));
    }
    let kv_type = kv_type_arg(a.cache_type.as_deref())?;
    a.draft.params().validate()?;
    let api_key = a.api_key.or_else(|| std::env::var("MINFER_API_KEY").ok()).filter(|k| !k.is_empty());
    let cfg = ServeConfig {
        model: a.model,
        host: a.host,
        port: a.port,
        slots: a.slots as usize,
        batch: batch_arg(a.batch.as_deref())?,
        ctx_total: a.ctx,
        threads: a.threads.unwrap_or_else(default_threads).max(1),
        queue: a.queue,
        api_key,
        timeout_secs: a.timeout,
        alias: a.alias,
        ubatch: a.ubatch as usize,
        backends: a.backend,
        inject_panic: std::env::var("MINFER_INJECT_PANIC").ok().filter(|s| !s.is_empty()),
        kv_type,
        draft: a.draft.draft.clone().map(|d| (d, a.draft.params())),
        read_timeout_secs: a.read_timeout,
        idle_timeout_secs: a.idle_timeout,
        max_connections: a.max_connections as usize,
        drain_timeout_secs: a.drain_timeout,
        chat_template: a.chat_template,
        tags: {
            let mut t: Vec<String> = a.tags.iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect();
            t.sort();
            t.dedup();
            t
        },
        defaults: RequestDefaults {
            temperature: a.temp,
            seed: a.seed.filter(|&s| s >= 0).map(|s| s as u64),
            n_predict: a.n_predict.filter(|&n| n >= 0).map(|n| n as usize),
            prefill_assistant: a.prefill_assistant,
            verbose: a.verbose,
        },
        cors: crate::server::cors::CorsOrigins::parse(&a.cors_origins).map_err(|why| CliError::BadFlag { flag: "--cors-origins", why })?,
        metrics_endpoint: !a.no_metrics,
        slots_endpoint: !a.no_slots_endpoint,
        ui: !a.no_ui,
        pooling: a.pooling,
        slot_save_path: match a.slot_save_path {
            Some(dir) => {
                std::fs::create_dir_all(&dir).map_err(|e| CliError::BadFlag { flag: "--slot-save-path", why: format!("{}: {e}", dir.display()) })?;
                Some(dir)
            }
            None => None,
        },
    };
    Ok(serve(cfg)?)
}
