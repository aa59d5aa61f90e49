//! The Qwen2 forward pass: the shared decoder with biased Q/K/V projections.

use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{ComputeGraph, GraphBuilder, GraphError, GraphParams};
use crate::models::decoder::{Head, LayerCommon, LayerCtx, Qkv, build_decoder, tensor};
use crate::models::{HParams, ModelDef, ModelError};

#[derive(Debug, Clone)]
struct Attn {
    wq: TensorInfo,
    bq: TensorInfo,
    wk: TensorInfo,
    bk: TensorInfo,
    wv: TensorInfo,
    bv: TensorInfo,
}

/// A loaded Qwen2 model's structure (tensor infos by name; the bytes stay in the file).
#[derive(Debug, Clone)]
pub struct Qwen2 {
    hp: HParams,
    head: Head,
    layers: Vec<LayerCommon>,
    attn: Vec<Attn>,
}

impl Qwen2 {
    pub fn load(f: &GgufFile, hp: HParams) -> Result<Qwen2, ModelError> {
        let mut layers = Vec::new();
        let mut attn = Vec::new();
        for il in 0..hp.n_layer as usize {
            layers.push(LayerCommon::load(f, il)?);
            let t = |name: &str| tensor(f, &format!("blk.{il}.{name}"));
            attn.push(Attn {
                wq: t("attn_q.weight")?,
                bq: t("attn_q.bias")?,
                wk: t("attn_k.weight")?,
                bk: t("attn_k.bias")?,
                wv: t("attn_v.weight")?,
                bv: t("attn_v.bias")?,
            });
        }
        Ok(Qwen2 { head: Head::load(f)?, hp, layers, attn })
    }
}

impl ModelDef for Qwen2 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        build_decoder(&self.hp, &self.head, &self.layers, p, |b: &mut GraphBuilder, cx: &LayerCtx| {
            let a = &self.attn[cx.il];
            Ok(Qkv {
                q: b.matmul(cx.normed, &a.wq, Some(&a.bq))?, // [n_head*hd, nt], bias inline
                k: b.matmul(cx.normed, &a.wk, Some(&a.bk))?, // [n_head_kv*hd, nt]
                v: b.matmul(cx.normed, &a.wv, Some(&a.bv))?,
            })
        })
    }
}
