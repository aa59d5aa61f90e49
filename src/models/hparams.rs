//! Hyper-parameters of a transformer model, read from GGUF metadata.

use serde::Serialize;

use crate::gguf::{GgufError, GgufFile, MetaArray, MetaValue};
use crate::graph::RopeStyle;

/// What an architecture fixes that its GGUF keys do not say (llama.cpp's per-architecture
/// rules): the RoPE layout and the sliding-window layer pattern when the file has none.
#[derive(Debug, Clone, Copy)]
pub struct ArchRules {
    pub name: &'static str,
    /// llama.cpp's `llama_model_rope_type`: NORM (adjacent pairs) or NEOX (halves).
    pub rope_style: RopeStyle,
    /// `Some(n)`: the architecture has windowed layers. With `{arch}.attention.sliding_window`
    /// set and no `sliding_window_pattern` key, every `n`-th layer is global and the others
    /// windowed (llama.cpp's `set_swa_pattern(n)`). `None`: the window key is ignored.
    pub swa_pattern: Option<u32>,
    /// llama.cpp refuses `rope.dimension_count != head_dim` for this architecture.
    pub full_rotation: bool,
}

/// The architectures minfer can run, one row each.
pub const ARCHITECTURES: &[ArchRules] = &[
    ArchRules { name: "qwen2", rope_style: RopeStyle::NonInterleaved, swa_pattern: None, full_rotation: false },
    ArchRules { name: "qwen3", rope_style: RopeStyle::NonInterleaved, swa_pattern: None, full_rotation: false },
    ArchRules { name: "llama", rope_style: RopeStyle::Interleaved, swa_pattern: None, full_rotation: true },
    ArchRules { name: "gemma3", rope_style: RopeStyle::NonInterleaved, swa_pattern: Some(6), full_rotation: false },
];

/// The names of [`ARCHITECTURES`], comma-separated (for messages).
pub fn supported_architectures() -> String {
    ARCHITECTURES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The rules of `arch`, or the unsupported-architecture error.
pub fn arch_rules(arch: &str) -> Result<&'static ArchRules, ModelError> {
    ARCHITECTURES
        .iter()
        .find(|a| a.name == arch)
        .ok_or_else(|| ModelError::UnsupportedArchitecture { arch: arch.to_string() })
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture '{arch}' (supported: {})", supported_architectures())]
    UnsupportedArchitecture { arch: String },
    #[error("model has no tensor '{name}'")]
    MissingTensor { name: String },
    #[error("{key} = {value} is invalid: {why}")]
    BadHParam { key: String, value: String, why: &'static str },
    #[error("{what} is not supported (found {found})")]
    Unsupported { what: &'static str, found: String },
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
    /// RoPE layout: `normal` (adjacent pairs) or `neox` (halves).
    pub rope_style: RopeStyle,
    /// Rotated dims per head: `rope.dimension_count`, or `head_dim`.
    pub n_rot: u32,
    /// Sliding window in cells (`attention.sliding_window`); 0: every layer is global.
    pub n_swa: u32,
    /// Per layer: does it attend through the sliding window (and rotate with
    /// `rope_freq_base_swa`)?
    pub swa_layers: Vec<bool>,
    /// RoPE base of the windowed layers: `rope.freq_base_swa`, or llama.cpp's 10000.
    pub rope_freq_base_swa: f32,
    /// `attention.scale`: the score scale when the file sets one (llama.cpp's
    /// `f_attention_scale`); `None` is `1/sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
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
        let rules = arch_rules(&arch).ok();
        let n_rot = f.opt_u32(&k("rope.dimension_count"))?.unwrap_or(head_dim);
        if rules.is_some_and(|r| r.full_rotation) && n_rot != head_dim {
            return Err(ModelError::BadHParam {
                key: k("rope.dimension_count"),
                value: n_rot.to_string(),
                why: "this architecture rotates whole heads (rope.dimension_count must equal the head dim)",
            });
        }
        check_rope_scaling(f, &k)?;
        // Only an architecture with windowed layers reads the window (llama.cpp ignores the key
        // elsewhere).
        let swa_period = rules.and_then(|r| r.swa_pattern);
        let n_swa = match swa_period {
            Some(_) => f.opt_u32(&k("attention.sliding_window"))?.unwrap_or(0),
            None => 0,
        };
        let swa_layers = swa_layers(f, &k("attention.sliding_window_pattern"), n_layer, n_swa, swa_period)?;
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
            rope_style: rules.map_or(RopeStyle::NonInterleaved, |r| r.rope_style),
            n_rot,
            n_swa,
            swa_layers,
            rope_freq_base_swa: f.opt_f32(&k("rope.freq_base_swa"))?.unwrap_or(10000.0),
            attn_scale: f.opt_f32(&k("attention.scale"))?.filter(|&s| s != 0.0),
            arch,
        })
    }

    /// Does layer `il` attend through the sliding window?
    pub fn is_swa(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// An error listing the supported architectures when this one is not.
    pub fn check_supported(&self) -> Result<(), ModelError> {
        arch_rules(&self.arch).map(|_| ())
    }
}

/// RoPE scaling: none, or linear with factor 1, runs as plain RoPE; any other scaling
/// (linear with a factor, YaRN, LongRoPE) is refused rather than computed wrong.
fn check_rope_scaling(f: &GgufFile, k: &impl Fn(&str) -> String) -> Result<(), ModelError> {
    let kind = f.opt_str(&k("rope.scaling.type"))?.unwrap_or("linear");
    let factor = match f.opt_f32(&k("rope.scaling.factor"))? {
        Some(x) => x,
        None => f.opt_f32(&k("rope.scale_linear"))?.unwrap_or(0.0),
    };
    match kind {
        "none" => Ok(()),
        "linear" if factor == 0.0 || factor == 1.0 => Ok(()),
        "linear" => Err(ModelError::Unsupported { what: "linear RoPE scaling", found: format!("factor {factor}") }),
        other => Err(ModelError::Unsupported { what: "RoPE scaling", found: format!("{} = {other:?}", k("rope.scaling.type")) }),
    }
}

/// Which layers are windowed: the `sliding_window_pattern` key (one bool per layer, or a
/// period `n`: every `n`-th layer global), else the architecture's default period; no window,
/// no windowed layer.
fn swa_layers(f: &GgufFile, key: &str, n_layer: u32, n_swa: u32, default: Option<u32>) -> Result<Vec<bool>, ModelError> {
    let n = n_layer as usize;
    if n_swa == 0 {
        return Ok(vec![false; n]);
    }
    let period = match f.get(key) {
        Some(MetaValue::Array(MetaArray::Bool(v))) if v.len() >= n => return Ok(v[..n].to_vec()),
        Some(MetaValue::Array(a)) => {
            return Err(ModelError::BadHParam {
                key: key.to_string(),
                value: format!("an array of {} {}", a.len(), a.elem_type().name()),
                why: "must hold one bool per layer",
            });
        }
        Some(_) => f.opt_u32(key)?,
        None => default,
    };
    Ok(match period {
        // llama.cpp: a period of 0 (or none) makes every layer windowed.
        None | Some(0) => vec![true; n],
        Some(p) => (0..n_layer).map(|il| il % p < p - 1).collect(),
    })
}
