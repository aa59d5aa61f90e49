//! The Qwen3 forward pass: the shared decoder with bias-free Q/K/V and per-head q/k RMSNorm
//! before RoPE (head dim from `key_length`, so q is `n_head * head_dim` wide, not n_embd).

use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{ComputeGraph, GraphBuilder, GraphError, GraphParams};
use crate::models::decoder::{Head, LayerCommon, LayerCtx, Qkv, build_decoder, tensor};
use crate::models::{HParams, ModelDef, ModelError};

#[derive(Debug, Clone)]
struct Attn {
    wq: TensorInfo,
    wk: TensorInfo,
    wv: TensorInfo,
    q_norm: TensorInfo,
    k_norm: TensorInfo,
}

/// A loaded Qwen3 model's structure.
#[derive(Debug, Clone)]
pub struct Qwen3 {
    hp: HParams,
    head: Head,
    layers: Vec<LayerCommon>,
    attn: Vec<Attn>,
}

impl Qwen3 {
    pub fn load(f: &GgufFile, hp: HParams) -> Result<Qwen3, ModelError> {
        let mut layers = Vec::new();
        let mut attn = Vec::new();
        for il in 0..hp.n_layer as usize {
            layers.push(LayerCommon::load(f, il)?);
            let t = |name: &str| tensor(f, &format!("blk.{il}.{name}.weight"));
            attn.push(Attn {
                wq: t("attn_q")?,
                wk: t("attn_k")?,
                wv: t("attn_v")?,
                q_norm: t("attn_q_norm")?,
                k_norm: t("attn_k_norm")?,
            });
        }
        Ok(Qwen3 { head: Head::load(f)?, hp, layers, attn })
    }
}

impl ModelDef for Qwen3 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        let hd = self.hp.head_dim as usize;
        let (nh, nk) = (self.hp.n_head as usize, self.hp.n_head_kv as usize);
        let eps = self.hp.rms_eps;
        build_decoder(&self.hp, &self.head, &self.layers, p, |b: &mut GraphBuilder, cx: &LayerCtx| {
            let a = &self.attn[cx.il];
            let q = b.matmul(cx.normed, &a.wq, None)?; // [nh*hd, nt]
            let k = b.matmul(cx.normed, &a.wk, None)?; // [nk*hd, nt]
            let v = b.matmul(cx.normed, &a.wv, None)?;
            let q = b.qk_norm(q, Some(&a.q_norm), hd, nh, eps)?;
            b.rename(q, "Qcur_normed")?;
            let k = b.qk_norm(k, Some(&a.k_norm), hd, nk, eps)?;
            b.rename(k, "Kcur_normed")?;
            Ok(Qkv { q, k, v })
        })
    }
}
