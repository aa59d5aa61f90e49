//! Model architectures. Each architecture reads its hyper-parameters from GGUF metadata under
//! its own key prefix (`qwen2.block_count`) and builds its forward pass as a compute graph
//! (`models/<arch>/graph.rs`); [`load_model`] dispatches on `general.architecture`.

pub mod decoder;
mod gemma3;
mod hparams;
mod llama;
pub mod profile;
mod qwen2;
mod qwen3;

use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::graph::{ComputeGraph, GraphError, GraphParams};

pub use gemma3::Gemma3;
pub use hparams::{ARCHITECTURES, ArchRules, HParams, ModelError, arch_rules, supported_architectures};
pub use llama::Llama;
pub use qwen2::Qwen2;
pub use qwen3::Qwen3;

/// What an architecture provides: its hyper-parameters and a pure graph builder (equal params
/// ⇒ identical graph).
pub trait ModelDef: Send + Sync {
    fn hparams(&self) -> &HParams;
    fn build_graph(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError>;
    /// The K-shift graph: every layer's K rows re-rotated by the `kv_deltas` input (one i32
    /// per cell), with the RoPE the layers were built with.
    fn build_kv_shift(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        decoder::build_kv_shift(self.hparams(), p)
    }
}

/// A model file and its architecture.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub def: Box<dyn ModelDef>,
}

impl Model {
    pub fn hparams(&self) -> &HParams {
        self.def.hparams()
    }

    /// `general.name`, else the architecture (exports and traces name the model this way).
    pub fn display_name(&self) -> String {
        match self.file.opt_str("general.name") {
            Ok(Some(n)) if !n.is_empty() => n.to_string(),
            _ => self.hparams().arch.clone(),
        }
    }
}

/// Builds the architecture named by `general.architecture`; an unknown one is an error listing
/// the supported architectures.
pub fn load_model(file: Arc<GgufFile>) -> Result<Model, ModelError> {
    let hp = HParams::from_gguf(&file)?;
    hp.check_supported()?;
    let def: Box<dyn ModelDef> = match hp.arch.as_str() {
        "qwen2" => Box::new(Qwen2::load(&file, hp)?),
        "qwen3" => Box::new(Qwen3::load(&file, hp)?),
        "llama" => Box::new(Llama::load(&file, hp)?),
        "gemma3" => Box::new(Gemma3::load(&file, hp)?),
        other => return Err(ModelError::UnsupportedArchitecture { arch: other.to_string() }),
    };
    Ok(Model { file, def })
}
