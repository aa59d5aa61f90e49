//! The decoder skeleton Qwen2, Qwen3 and Llama share: inputs, embedding, per layer attention and FFN
//! with residuals, the G3 tail-row reduction after the last layer's attention, the final norm and
//! the lm_head. An architecture supplies only its Q/K/V projection (biases, per-head norms).

use crate::gguf::{GgufFile, TensorInfo};
use crate::graph::{
    AttnMeta, ComputeGraph, DType, GraphBuilder, GraphError, GraphOutput, GraphParams, KvType, KvcacheMeta, NodeId, RoPEMeta,
};

use super::{HParams, ModelError};

/// Looks up a tensor by name; a missing one names itself.
pub fn tensor(f: &GgufFile, name: &str) -> Result<TensorInfo, ModelError> {
    f.tensor(name).cloned().ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })
}

/// Like [`tensor`], `None` when absent.
pub fn opt_tensor(f: &GgufFile, name: &str) -> Option<TensorInfo> {
    f.tensor(name).cloned()
}

/// The tensors every decoder layer has, whatever the architecture.
#[derive(Debug, Clone)]
pub struct LayerCommon {
    pub attn_norm: TensorInfo,
    pub wo: TensorInfo,
    /// `attn_output.bias`, where the file has one (llama.cpp loads it when present).
    pub wo_b: Option<TensorInfo>,
    pub ffn_norm: TensorInfo,
    pub ffn_gate: TensorInfo,
    pub ffn_up: TensorInfo,
    pub ffn_down: TensorInfo,
}

impl LayerCommon {
    pub fn load(f: &GgufFile, il: usize) -> Result<LayerCommon, ModelError> {
        let t = |base: &str| tensor(f, &format!("blk.{il}.{base}.weight"));
        Ok(LayerCommon {
            attn_norm: t("attn_norm")?,
            wo: t("attn_output")?,
            wo_b: opt_tensor(f, &format!("blk.{il}.attn_output.bias")),
            ffn_norm: t("ffn_norm")?,
            ffn_gate: t("ffn_gate")?,
            ffn_up: t("ffn_up")?,
            ffn_down: t("ffn_down")?,
        })
    }
}

/// Token embedding, final norm and lm_head (tied to the embedding when the file has no
/// `output.weight`).
#[derive(Debug, Clone)]
pub struct Head {
    pub tok_embd: TensorInfo,
    pub output_norm: TensorInfo,
    pub output: TensorInfo,
}

impl Head {
    pub fn load(f: &GgufFile) -> Result<Head, ModelError> {
        let tok_embd = tensor(f, "token_embd.weight")?;
        let output = opt_tensor(f, "output.weight").unwrap_or_else(|| tok_embd.clone());
        Ok(Head { output_norm: tensor(f, "output_norm.weight")?, tok_embd, output })
    }
}

impl Head {
    /// The tail of a forward pass from the last layer's output `h` (`[n_embd, n_out]`): the
    /// final norm, then the lm_head's logits (`[n_vocab, n_out]`) or, for embeddings, the
    /// normed hidden states themselves.
    pub fn finish(&self, b: &mut GraphBuilder, h: NodeId, eps: f32, output: GraphOutput) -> Result<NodeId, GraphError> {
        let normed = b.rms_norm(h, Some(&self.output_norm), eps)?; // [n_embd, n_out]
        b.rename(normed, "result_norm")?;
        let out = match output {
            GraphOutput::Logits => {
                let logits = b.matmul(normed, &self.output, None)?; // [n_vocab, n_out]
                b.rename(logits, "result_output")?;
                logits
            }
            GraphOutput::Hidden => normed,
        };
        b.output(out)?;
        Ok(out)
    }
}

/// The graph-level handles an architecture's projection step gets.
pub struct LayerCtx {
    pub il: usize,
    /// `[n_embd, nt]`: the attention-normed hidden state.
    pub normed: NodeId,
    /// `[nt]` i32 positions.
    pub pos: NodeId,
}

/// Q (`[n_head*hd, nt]`), K and V (`[n_head_kv*hd, nt]`) before RoPE.
pub struct Qkv {
    pub q: NodeId,
    pub k: NodeId,
    pub v: NodeId,
}

impl HParams {
    /// The RoPE of layer `il` over `n_head` heads: the windowed layers rotate with their own
    /// base (llama.cpp's `get_rope_freq_base`).
    pub fn rope_meta(&self, il: usize, n_head: usize) -> RoPEMeta {
        RoPEMeta {
            n_head,
            head_dim: self.head_dim as usize,
            n_rot: self.n_rot as usize,
            freq_base: if self.is_swa(il) { self.rope_freq_base_swa } else { self.rope_freq_base },
        }
    }

    /// The attention of layer `layer`: scale `attention.scale` or `1/sqrt(head_dim)`, the
    /// sliding window on the windowed layers.
    pub fn attn_meta(&self, layer: usize, n_ctx: usize, kv_type: KvType) -> AttnMeta {
        AttnMeta {
            layer,
            n_head: self.n_head as usize,
            n_head_kv: self.n_head_kv as usize,
            head_dim: self.head_dim as usize,
            scale: self.attn_scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt()),
            n_ctx,
            kv_type,
            window: self.is_swa(layer).then_some(self.n_swa as usize),
        }
    }
}

/// The host-filled inputs of a forward pass, declared at the head of the graph (a mid-graph
/// input would split GPU runs).
pub struct Inputs {
    /// `[nt]` i32 token ids.
    pub ids: NodeId,
    /// `[nt]` i32: each token's position in its sequence (RoPE, the causal bound).
    pub pos: NodeId,
    /// `[nt]` i32: the KV cell each token's K and V go to, when several sequences share the
    /// regions (`n_seq > 1`); with one sequence the cell is the position.
    pub cells: Option<NodeId>,
    /// `[n_out]` i32: the rows whose logits are wanted, when not all of them.
    pub tail: Option<NodeId>,
}

impl Inputs {
    pub fn declare(b: &mut GraphBuilder, p: &GraphParams) -> Inputs {
        let nt = p.n_tokens;
        let ids = b.input("token_ids", [nt, 1, 1, 1], DType::I32); // [nt] i32
        let pos = b.input("positions", [nt, 1, 1, 1], DType::I32); // [nt] i32
        let cells = (p.cparams.n_seq > 1).then(|| b.input("kv_cells", [nt, 1, 1, 1], DType::I32)); // [nt] i32
        let tail = (p.n_out < nt).then(|| b.input("tail_ids", [p.n_out, 1, 1, 1], DType::I32)); // [n_out] i32
        Inputs { ids, pos, cells, tail }
    }

    /// Layer `il`'s attention: K and V (rotated) stored at the tokens' cells, then `q` attends
    /// the layer's regions (its own sequence's cells only). Returns `[n_head*hd, nt]`.
    pub fn attend(&self, b: &mut GraphBuilder, (q, k, v): (NodeId, NodeId, NodeId), n_embd_kv: usize, meta: AttnMeta) -> Result<NodeId, GraphError> {
        let (il, n_ctx, layout) = (meta.layer, meta.n_ctx, (meta.kv_type, meta.head_dim));
        b.kvcache_store(il, k, v, self.cells.unwrap_or(self.pos), n_ctx, layout)?;
        let kv = b.kvcache_load(il, n_embd_kv, n_ctx, layout);
        match self.cells {
            Some(cells) => b.attn_cells(q, kv, self.pos, cells, meta),
            None => b.attn(q, kv, self.pos, meta),
        }
    }
}

/// The K-shift graph of a decoder: input `kv_deltas` `[n_ctx]` i32, one `kv_shift` node per
/// layer (llama.cpp's `build_graph_shift`), each with its layer's RoPE.
pub fn build_kv_shift(hp: &HParams, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
    let n_ctx = p.cparams.n_ctx;
    let n_embd_kv = (hp.n_head_kv * hp.head_dim) as usize;
    let mut b = GraphBuilder::new();
    let deltas = b.input("kv_deltas", [n_ctx, 1, 1, 1], DType::I32); // [n_ctx] i32
    for il in 0..hp.n_layer as usize {
        b.set_layer(Some(il));
        let kv = KvcacheMeta { layer: il, n_embd_kv, n_ctx, kv_type: p.cparams.kv_type, head_dim: hp.head_dim as usize };
        b.kv_shift(il, deltas, hp.rope_meta(il, hp.n_head_kv as usize), hp.rope_style, kv)?;
    }
    b.set_layer(None);
    Ok(b.build())
}

/// Builds the forward pass for `p`; `qkv` is the architecture's projection of one layer.
pub fn build_decoder(
    hp: &HParams,
    head: &Head,
    layers: &[LayerCommon],
    p: &GraphParams,
    mut qkv: impl FnMut(&mut GraphBuilder, &LayerCtx) -> Result<Qkv, GraphError>,
) -> Result<ComputeGraph, GraphError> {
    let n_ctx = p.cparams.n_ctx;
    let kv_type = p.cparams.kv_type;
    let eps = hp.rms_eps;
    let n_embd_kv = (hp.n_head_kv * hp.head_dim) as usize;

    let mut b = GraphBuilder::new();
    let inputs = Inputs::declare(&mut b, p);
    let (pos, tail) = (inputs.pos, inputs.tail);

    let mut h = b.embedding(inputs.ids, &head.tok_embd)?; // [n_embd, nt]
    for (il, l) in layers.iter().enumerate() {
        b.set_layer(Some(il));
        let residual = h;
        let normed = b.rms_norm(h, Some(&l.attn_norm), eps)?;
        b.rename(normed, "attn_norm")?;
        let Qkv { q, k, v } = qkv(&mut b, &LayerCtx { il, normed, pos })?;
        let q = b.rope(q, pos, hp.rope_style, hp.rope_meta(il, hp.n_head as usize))?;
        let k = b.rope(k, pos, hp.rope_style, hp.rope_meta(il, hp.n_head_kv as usize))?;
        let attn = inputs.attend(&mut b, (q, k, v), n_embd_kv, hp.attn_meta(il, n_ctx, kv_type))?; // [n_head*hd, nt]
        let wo = b.matmul(attn, &l.wo, l.wo_b.as_ref())?; // [n_embd, nt]
        h = match tail {
            // G3: from here on only the n_out wanted rows are computed.
            Some(tail) if il + 1 == layers.len() => {
                let cur = b.get_rows(wo, tail)?;
                let res = b.get_rows(residual, tail)?;
                b.add(res, cur)?
            }
            _ => b.add(residual, wo)?,
        };
        b.rename(h, "ffn_inp")?;

        let residual = h;
        let normed = b.rms_norm(h, Some(&l.ffn_norm), eps)?;
        b.rename(normed, "ffn_norm")?;
        let gate = b.matmul(normed, &l.ffn_gate, None)?; // [n_ff, rows]
        let up = b.matmul(normed, &l.ffn_up, None)?;
        // Built unfused: the fusion pass folds silu + mul into SwiGLU where the backend can.
        let g = b.silu(gate)?;
        let sw = b.mul(g, up)?;
        let down = b.matmul(sw, &l.ffn_down, None)?; // [n_embd, rows]
        h = b.add(residual, down)?;
        b.rename(h, "l_out")?;
    }
    b.set_layer(None);
    head.finish(&mut b, h, eps, p.output)?;
    Ok(b.build())
}
