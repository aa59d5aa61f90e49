//! The Llama forward pass (llama.cpp's `src/models/llama.cpp`): the shared decoder with plain
//! Q/K/V projections and the architecture's normal RoPE, read from the `llama.*` keys alone.
//!
//! What the file may hold that this builder does not compute is refused at load, never skipped:
//! a fused `attn_qkv`, Llama 3 `rope_freqs`, FFN biases, experts.

use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{ComputeGraph, GraphBuilder, GraphError, GraphParams};
use crate::models::decoder::{Head, LayerCommon, LayerCtx, Qkv, build_decoder, opt_tensor, tensor};
use crate::models::{HParams, ModelDef, ModelError};

#[derive(Debug, Clone)]
struct Attn {
    wq: TensorInfo,
    wk: TensorInfo,
    wv: TensorInfo,
    bq: Option<TensorInfo>,
    bk: Option<TensorInfo>,
    bv: Option<TensorInfo>,
}

/// A loaded Llama model's structure (tensor infos by name; the bytes stay in the file).
#[derive(Debug, Clone)]
pub struct Llama {
    hp: HParams,
    head: Head,
    layers: Vec<LayerCommon>,
    attn: Vec<Attn>,
}

/// Tensors of layer 0 whose presence means the file needs a computation this builder lacks.
const UNSUPPORTED_TENSORS: &[(&str, &str)] = &[
    ("rope_freqs.weight", "Llama 3 RoPE frequency factors (rope_freqs)"),
    ("blk.0.rope_freqs.weight", "Llama 3 RoPE frequency factors (rope_freqs)"),
    ("blk.0.attn_qkv.weight", "a fused attn_qkv projection"),
    ("blk.0.ffn_gate.bias", "FFN biases"),
    ("blk.0.ffn_up.bias", "FFN biases"),
    ("blk.0.ffn_down.bias", "FFN biases"),
    ("blk.0.ffn_gate_inp.weight", "mixture-of-experts layers"),
];

impl Llama {
    pub fn load(f: &GgufFile, hp: HParams) -> Result<Llama, ModelError> {
        if let Some(&(name, what)) = UNSUPPORTED_TENSORS.iter().find(|(name, _)| f.tensor(name).is_some()) {
            return Err(ModelError::Unsupported { what: "a Llama file with this tensor", found: format!("{name}: {what}") });
        }
        if let Some(n) = f.opt_u32("llama.expert_count")?.filter(|&n| n > 0) {
            return Err(ModelError::Unsupported { what: "a mixture-of-experts Llama model", found: format!("llama.expert_count = {n}") });
        }
        let mut layers = Vec::new();
        let mut attn = Vec::new();
        for il in 0..hp.n_layer as usize {
            layers.push(LayerCommon::load(f, il)?);
            let t = |name: &str| tensor(f, &format!("blk.{il}.{name}"));
            let o = |name: &str| opt_tensor(f, &format!("blk.{il}.{name}"));
            attn.push(Attn {
                wq: t("attn_q.weight")?,
                wk: t("attn_k.weight")?,
                wv: t("attn_v.weight")?,
                bq: o("attn_q.bias"),
                bk: o("attn_k.bias"),
                bv: o("attn_v.bias"),
            });
        }
        Ok(Llama { head: Head::load(f)?, hp, layers, attn })
    }
}

impl ModelDef for Llama {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        build_decoder(&self.hp, &self.head, &self.layers, p, |b: &mut GraphBuilder, cx: &LayerCtx| {
            let a = &self.attn[cx.il];
            let q = b.matmul(cx.normed, &a.wq, a.bq.as_ref())?; // [n_head*hd, nt]
            let k = b.matmul(cx.normed, &a.wk, a.bk.as_ref())?; // [n_head_kv*hd, nt]
            let v = b.matmul(cx.normed, &a.wv, a.bv.as_ref())?; // [n_head_kv*hd, nt]
            Ok(Qkv { q, k, v })
        })
    }
}
