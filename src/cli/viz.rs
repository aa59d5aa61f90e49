//! `minfer viz`: the graph visualizer's server.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use super::engine_args::kv_type_arg;
use crate::generate::{TraceOptions, default_threads};
use crate::viz::{VizConfig, viz};

/// Most samples per node the page is sent.
const MAX_VIZ_VALUES: usize = 4096;

#[derive(Debug, Clone, Args)]
pub struct VizArgs {
    /// The GGUF model file.
    #[arg(short, long, allow_hyphen_values = true)]
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// Worker threads of the forward passes (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context in tokens: the longest prompt plus generation of a run.
    #[arg(long = "ctx", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(2..))]
    pub ctx: u32,
    /// Backends allowed to run nodes, comma-separated (cpu, metal, cuda).
    #[arg(long = "backend")]
    pub backend: Option<String>,
    /// KV cache storage: f32 (default), f16 or q8_0. Default: MINFER_CACHE_TYPE.
    #[arg(long = "cache-type")]
    pub cache_type: Option<String>,
    /// Chat runs use this Jinja chat template instead of the model's.
    #[arg(long, allow_hyphen_values = true)]
    pub chat_template: Option<PathBuf>,
    /// Saved traces (MINFER_TRACE files) the page can open. Default: MINFER_VIZ_DIR.
    #[arg(long = "trace-dir", allow_hyphen_values = true)]
    pub trace_dir: Option<PathBuf>,
    /// Values sampled per node and step (1 to 4096). Default: MINFER_TRACE_VALUES, else 64.
    #[arg(long = "values", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub values: Option<u32>,
}

pub fn run(a: VizArgs) -> Result<(), CliError> {
    let kv_type = kv_type_arg(a.cache_type.as_deref())?;
    let max_values = match a.values {
        Some(v) => v as usize,
        None => TraceOptions::values_from_env()?,
    };
    if max_values > MAX_VIZ_VALUES {
        return Err(CliError::Usage("MINFER_TRACE_VALUES is above 4096: viz sends every sample to the browser (use --values N, N <= 4096)"));
    }
    let trace_dir = a.trace_dir.or_else(|| std::env::var_os("MINFER_VIZ_DIR").filter(|d| !d.is_empty()).map(PathBuf::from));
    let cfg = VizConfig {
        model: a.model,
        host: a.host,
        port: a.port,
        threads: a.threads.unwrap_or_else(default_threads).max(1),
        n_ctx: a.ctx as usize,
        backends: a.backend,
        kv_type,
        max_values,
        trace_dir,
        chat_template: a.chat_template,
    };
    Ok(viz(cfg)?)
}
