//! Hyper-parameters of a transformer model, read from GGUF metadata.

use serde::Serialize;

use crate::gguf::{GgufError, GgufFile, MetaValue};

/// Architectures minfer can run.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["qwen2", "qwen3"];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture '{arch}' (supported: {})", SUPPORTED_ARCHITECTURES.join(", "))]
    UnsupportedArchitecture { arch: String },
    #[error("model has no tensor '{name}'")]
    MissingTensor { name: String },
    #[error("{key} = {value} is invalid: {why}")]
    BadHParam { key: String, value: String, why: &'static str },
}

/// The hyper-parameters `minfer info` prints and the graph builders use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HParams {
    pub arch: String,
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    /// Per-head dimension of K (and Q): `key_length`, or `n_embd / n_head` when absent.
    pub head_dim: u32,
    /// Per-head dimension of V: `value_length`, or `head_dim`.
    pub head_dim_v: u32,
    pub n_ff: u32,
    pub n_ctx_train: u32,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    pub n_vocab: u32,
}

impl HParams {
    /// Reads the hyper-parameters of the file's `general.architecture`. Works for any
    /// llama-style architecture that uses the standard keys; whether minfer can *run* the
    /// architecture is [`HParams::check_supported`].
    pub fn from_gguf(f: &GgufFile) -> Result<HParams, ModelError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let k = |name: &str| format!("{arch}.{name}");
        let n_layer = f.get_u32(&k("block_count"))?;
        let n_embd = f.get_u32(&k("embedding_length"))?;
        let n_head = f.get_u32(&k("attention.head_count"))?;
        let n_head_kv = f.opt_u32(&k("attention.head_count_kv"))?.unwrap_or(n_head);
        let positive = |key: String, v: u32| -> Result<u32, ModelError> {
            if v == 0 {
                return Err(ModelError::BadHParam { key, value: "0".into(), why: "must be positive" });
            }
            Ok(v)
        };
        let n_embd = positive(k("embedding_length"), n_embd)?;
        let n_head = positive(k("attention.head_count"), n_head)?;
        let n_head_kv = positive(k("attention.head_count_kv"), n_head_kv)?;
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadHParam {
                key: k("attention.head_count_kv"),
                value: n_head_kv.to_string(),
                why: "must divide attention.head_count",
            });
        }
        let head_dim = match f.opt_u32(&k("attention.key_length"))? {
            Some(d) => positive(k("attention.key_length"), d)?,
            None => n_embd / n_head,
        };
        let head_dim_v = f.opt_u32(&k("attention.value_length"))?.unwrap_or(head_dim);
        let n_vocab = match f.get("tokenizer.ggml.tokens") {
            Some(MetaValue::Array(a)) => u32::try_from(a.len()).unwrap_or(u32::MAX),
            _ => f.opt_u32(&k("vocab_size"))?.unwrap_or(0),
        };
        Ok(HParams {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff: f.get_u32(&k("feed_forward_length"))?,
            n_ctx_train: f.get_u32(&k("context_length"))?,
            rope_freq_base: f.opt_f32(&k("rope.freq_base"))?.unwrap_or(10000.0),
            rms_eps: f.get_f32(&k("attention.layer_norm_rms_epsilon"))?,
            n_vocab,
            arch,
        })
    }

    /// An error listing the supported architectures when this one is not.
    pub fn check_supported(&self) -> Result<(), ModelError> {
        if SUPPORTED_ARCHITECTURES.contains(&self.arch.as_str()) {
            Ok(())
        } else {
            Err(ModelError::UnsupportedArchitecture { arch: self.arch.clone() })
        }
    }
}
