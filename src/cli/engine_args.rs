//! The engine options `run` and `logits` share.

use std::sync::Arc;

use clap::Args;

use super::CliError;
use crate::generate::{Engine, EngineParams, NodeDump, default_threads, trace_from_env};
use crate::gguf::GgufFile;
use crate::graph::KvType;
use crate::models::load_model;

#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Worker threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default 4096, at most the model's training context; never less
    /// than the prompt).
    #[arg(long = "ctx")]
    pub ctx: Option<usize>,
    /// Most tokens per forward pass (llama.cpp's n_ubatch, default 512): the compute memory is
    /// reserved for it once, and longer prompts are evaluated in chunks of N.
    #[arg(long = "ubatch", value_parser = clap::value_parser!(u32).range(1..))]
    pub ubatch_arg: Option<u32>,
    /// Backends allowed to run nodes, comma-separated (cpu, metal, cuda); default: all usable
    /// (`MINFER_BACKENDS` when set).
    #[arg(long = "backend")]
    pub backend: Option<String>,
    /// KV cache storage: f32 (default), f16 or q8_0 (packed; about 0.27x the memory). Default:
    /// MINFER_CACHE_TYPE when set.
    #[arg(long = "cache-type")]
    pub cache_type: Option<String>,
    #[arg(skip)]
    pub ubatch: Option<usize>,
}

/// A `--cache-type` option (`serve` and `viz` have their own): the name given, else
/// `MINFER_CACHE_TYPE`, else f32; an unknown name is an error.
pub fn kv_type_arg(cache_type: Option<&str>) -> Result<KvType, CliError> {
    let t = match cache_type {
        Some(s) => Some(KvType::parse(s)),
        None => KvType::from_env().transpose(),
    };
    Ok(t.transpose().map_err(|e| CliError::KvType(e.to_string()))?.unwrap_or_default())
}

/// The default context when none is asked for.
pub const DEFAULT_CTX: usize = 4096;

impl EngineArgs {
    /// Fills derived fields after parsing.
    pub fn resolved(mut self) -> EngineArgs {
        self.ubatch = self.ubatch_arg.map(|u| u as usize);
        self
    }

    /// `--cache-type`, else `MINFER_CACHE_TYPE`, else f32; an unknown name is an error.
    pub fn kv_type(&self) -> Result<KvType, CliError> {
        kv_type_arg(self.cache_type.as_deref())
    }

    /// An engine for `file` that uses `other`'s worker threads (a draft model).
    pub fn engine_beside(&self, file: Arc<GgufFile>, other: &Engine) -> Result<Engine, CliError> {
        super::progress::load_with_bar(&file);
        let model = Arc::new(load_model(file)?);
        // No trace or node dump (those are the target's), the same backends as the target.
        let p = EngineParams {
            n_ctx: other.n_ctx(),
            n_seq: 1,
            n_ubatch: self.ubatch.unwrap_or(crate::generate::DEFAULT_UBATCH),
            memory_cap: None,
            n_threads: 1,
            backends: self.backend.clone(),
            trace: false,
            dump: None,
            kv_type: self.kv_type()?,
        };
        let shared = crate::generate::EngineShared::with_pool(&model, other.pool().clone())?;
        Ok(Engine::with_shared(model, &p, &shared)?)
    }

    /// An engine for `file`, with a context of at least `min_ctx` tokens.
    pub fn engine(&self, file: Arc<GgufFile>, min_ctx: usize) -> Result<Engine, CliError> {
        self.engine_seqs(file, min_ctx, 1)
    }

    /// [`EngineArgs::engine`] whose KV holds `n_seq` sequences of the context each.
    pub fn engine_seqs(&self, file: Arc<GgufFile>, min_ctx: usize, n_seq: usize) -> Result<Engine, CliError> {
        super::progress::load_with_bar(&file);
        let model = Arc::new(load_model(file)?);
        let train = model.hparams().n_ctx_train as usize;
        let n_ctx = match self.ctx {
            Some(0) => return Err(CliError::Usage("--ctx must be at least 1")),
            Some(n) => n,
            None => DEFAULT_CTX.min(train.max(1)).max(min_ctx),
        };
        if min_ctx > n_ctx {
            return Err(CliError::PromptTooLong { n_prompt: min_ctx, n_ctx });
        }
        let p = EngineParams {
            n_ctx,
            n_seq,
            n_ubatch: self.ubatch.unwrap_or(crate::generate::DEFAULT_UBATCH),
            memory_cap: None,
            n_threads: self.threads.unwrap_or_else(default_threads).max(1),
            backends: self.backend.clone(),
            trace: trace_from_env(),
            dump: NodeDump::from_env(),
            kv_type: self.kv_type()?,
        };
        Ok(Engine::new(model, &p)?)
    }
}
