//! The Gemma 3 forward pass (llama.cpp's `src/models/gemma3.cpp`), node by node:
//!
//! - the token embedding times `sqrt(n_embd)` (`inp_scaled`);
//! - per layer: RMSNorm; Q/K/V projections; per-head RMSNorm of Q and K; NeoX RoPE with the
//!   layer's base (`rope.freq_base_swa`, default 10000, on the windowed layers; the file's
//!   `rope.freq_base` on the global ones); Q times the attention scale (`1/sqrt(head_dim)`),
//!   attention with score scale 1 over the layer's window; the output projection, RMSNorm
//!   (`attn_post_norm`) and the residual (`sa_out`); RMSNorm, `gelu(gate) * up`, the down
//!   projection, RMSNorm (`ffn_post_norm`) and the residual (`l_out`);
//! - the final RMSNorm and the lm_head (tied to the embedding when the file has no `output`), or
//!   for embeddings the normed hidden states.
//!
//! The norm weights in a Gemma GGUF already hold `1 + w` (the converter adds the one), so the
//! norms are the plain weighted RMSNorm.

use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{ComputeGraph, GraphBuilder, GraphError, GraphParams, NodeId};
use crate::models::decoder::{Head, Inputs, tensor};
use crate::models::{HParams, ModelDef, ModelError};

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: TensorInfo,
    wq: TensorInfo,
    wk: TensorInfo,
    wv: TensorInfo,
    q_norm: TensorInfo,
    k_norm: TensorInfo,
    wo: TensorInfo,
    attn_post_norm: TensorInfo,
    ffn_norm: TensorInfo,
    ffn_gate: TensorInfo,
    ffn_up: TensorInfo,
    ffn_down: TensorInfo,
    ffn_post_norm: TensorInfo,
}

/// A loaded Gemma 3 model's structure.
#[derive(Debug, Clone)]
pub struct Gemma3 {
    hp: HParams,
    head: Head,
    layers: Vec<Layer>,
    /// The factor on Q before attention (llama.cpp's `f_attention_scale`).
    q_scale: f32,
}

impl Gemma3 {
    pub fn load(f: &GgufFile, hp: HParams) -> Result<Gemma3, ModelError> {
        if let Some(cap) = f.opt_f32("gemma3.final_logit_softcapping")?.filter(|&c| c != 0.0) {
            return Err(ModelError::Unsupported { what: "final logit soft-capping", found: format!("gemma3.final_logit_softcapping = {cap}") });
        }
        let mut layers = Vec::new();
        for il in 0..hp.n_layer as usize {
            let t = |name: &str| tensor(f, &format!("blk.{il}.{name}.weight"));
            layers.push(Layer {
                attn_norm: t("attn_norm")?,
                wq: t("attn_q")?,
                wk: t("attn_k")?,
                wv: t("attn_v")?,
                q_norm: t("attn_q_norm")?,
                k_norm: t("attn_k_norm")?,
                wo: t("attn_output")?,
                attn_post_norm: t("post_attention_norm")?,
                ffn_norm: t("ffn_norm")?,
                ffn_gate: t("ffn_gate")?,
                ffn_up: t("ffn_up")?,
                ffn_down: t("ffn_down")?,
                ffn_post_norm: t("post_ffw_norm")?,
            });
        }
        // llama.cpp (after gemma_pytorch): 1/sqrt(head_dim), except the 62-layer 27B model,
        // which scales by 1/sqrt(n_embd / n_head).
        let q_scale = match hp.n_layer {
            62 => 1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt(),
            _ => 1.0 / (hp.head_dim as f32).sqrt(),
        };
        Ok(Gemma3 { head: Head::load(f)?, hp, layers, q_scale })
    }
}

impl ModelDef for Gemma3 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        let hp = &self.hp;
        let n_ctx = p.cparams.n_ctx;
        let kv_type = p.cparams.kv_type;
        let eps = hp.rms_eps;
        let hd = hp.head_dim as usize;
        let (nh, nk) = (hp.n_head as usize, hp.n_head_kv as usize);
        let n_embd_kv = nk * hd;

        let mut b = GraphBuilder::new();
        let inputs = Inputs::declare(&mut b, p);
        let (pos, tail) = (inputs.pos, inputs.tail);

        let embd = b.embedding(inputs.ids, &self.head.tok_embd)?; // [n_embd, nt]
        let mut inp = b.scale(embd, (hp.n_embd as f32).sqrt())?;
        b.rename(inp, "inp_scaled")?;
        for (il, l) in self.layers.iter().enumerate() {
            b.set_layer(Some(il));
            let normed = b.rms_norm(inp, Some(&l.attn_norm), eps)?;
            b.rename(normed, "attn_norm")?;

            // self-attention
            let q = b.matmul(normed, &l.wq, None)?; // [nh*hd, nt]
            let k = b.matmul(normed, &l.wk, None)?; // [nk*hd, nt]
            let v = b.matmul(normed, &l.wv, None)?; // [nk*hd, nt]
            let q = b.qk_norm(q, Some(&l.q_norm), hd, nh, eps)?;
            b.rename(q, "Qcur_normed")?;
            let q = b.rope(q, pos, hp.rope_style, hp.rope_meta(il, nh))?;
            let k = b.qk_norm(k, Some(&l.k_norm), hd, nk, eps)?;
            b.rename(k, "Kcur_normed")?;
            let k = b.rope(k, pos, hp.rope_style, hp.rope_meta(il, nk))?;
            let q = b.scale(q, self.q_scale)?;
            b.rename(q, "Qcur_scaled")?;
            let meta = crate::graph::AttnMeta { scale: 1.0, ..hp.attn_meta(il, n_ctx, kv_type) };
            let attn = inputs.attend(&mut b, (q, k, v), n_embd_kv, meta)?; // [nh*hd, nt]
            let mut wo = b.matmul(attn, &l.wo, None)?; // [n_embd, nt]
            if let (Some(tail), true) = (tail, il + 1 == self.layers.len()) {
                // G3: from here on only the n_out wanted rows are computed.
                wo = b.get_rows(wo, tail)?;
                inp = b.get_rows(inp, tail)?;
            }
            let post = b.rms_norm(wo, Some(&l.attn_post_norm), eps)?;
            b.rename(post, "attn_post_norm")?;
            let sa_out = b.add(post, inp)?; // [n_embd, rows]
            b.rename(sa_out, "sa_out")?;

            // feed-forward
            let normed = b.rms_norm(sa_out, Some(&l.ffn_norm), eps)?;
            b.rename(normed, "ffn_norm")?;
            let ffn = self.ffn(&mut b, normed, l)?;
            let post = b.rms_norm(ffn, Some(&l.ffn_post_norm), eps)?;
            b.rename(post, "ffn_post_norm")?;
            inp = b.add(post, sa_out)?;
            b.rename(inp, "l_out")?;
        }
        b.set_layer(None);
        self.head.finish(&mut b, inp, eps, p.output)?;
        Ok(b.build())
    }
}

impl Gemma3 {
    /// `down(gelu(gate(x)) * up(x))`, built unfused: the fusion pass folds gelu + mul into
    /// GeGLU where the backend can.
    fn ffn(&self, b: &mut GraphBuilder, x: NodeId, l: &Layer) -> Result<NodeId, GraphError> {
        let gate = b.matmul(x, &l.ffn_gate, None)?; // [n_ff, rows]
        let up = b.matmul(x, &l.ffn_up, None)?; // [n_ff, rows]
        let g = b.gelu(gate)?;
        let gu = b.mul(g, up)?;
        let down = b.matmul(gu, &l.ffn_down, None)?; // [n_embd, rows]
        b.rename(down, "ffn_out")?;
        Ok(down)
    }
}
