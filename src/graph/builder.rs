//! The graph builder: an append-only, pure factory.
//!
//! The builder assigns ids, propagates shapes, records op payloads and metadata and wires the
//! `src` edges. It never computes and never allocates, so building the same model with equal
//! `GraphParams` yields the same graph — the precondition for reuse. A node can only reference
//! ids the builder already returned, so node order is a topological order by construction.
//!
//! Inputs are leaves filled with data every step, which is why a changing `n_past` never forces
//! a rebuild: positions are data.
//!
//! Every constructor that reads an operand's shape returns `Result`: a dimension that does not
//! fit, or a weight stored in a type minfer cannot compute with, is a typed error that names the
//! node (and the tensor) at build time rather than a wrong answer at run time.
//!
//! Names follow llama.cpp's callback names: `"{base}-{layer}"` inside a layer (`"attn_norm-3"`),
//! `"{base}"` outside. Weight-reading nodes take their base from the GGUF tensor name
//! (`blk.3.attn_q.weight` → `attn_q-3`); [`GraphBuilder::rename`] re-labels a node the way
//! llama.cpp's `cb(cur, "ffn_inp", il)` does.

use super::error::GraphError;
use super::ops::{
    AttnMeta, EmbedMeta, KvShiftMeta, KvcacheMeta, MatMulMeta, NodeMeta, NormMeta, Op, RoPEMeta,
    RopeStyle,
};
use super::weights::WeightId;
use super::{CNode, ComputeGraph, DType, KvType, NodeId};
use crate::gguf::TensorInfo;
use crate::quants::GgmlType;

/// Everything [`GraphBuilder::node`] needs to append a node (instead of six positional
/// arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Base name; the builder appends `-{layer}` when the node belongs to a layer.
    pub base: String,
    pub op: Op,
    pub src: Vec<NodeId>,
    pub out_shape: [usize; 4],
    pub out_dtype: DType,
    pub meta: NodeMeta,
    /// Overrides the builder's current layer.
    pub layer: Option<usize>,
}

impl NodeSpec {
    /// An F32 node without metadata in the builder's current layer.
    pub fn new(base: &str, op: Op, src: &[NodeId], out_shape: [usize; 4]) -> NodeSpec {
        NodeSpec {
            base: base.to_string(),
            op,
            src: src.to_vec(),
            out_shape,
            out_dtype: DType::F32,
            meta: NodeMeta::None,
            layer: None,
        }
    }
}

/// `blk.3.attn_q.weight` → (`attn_q`, `Some(3)`); `token_embd.weight` → (`token_embd`, `None`).
fn tensor_base(name: &str) -> (&str, Option<usize>) {
    let stem = name
        .strip_suffix(".weight")
        .or_else(|| name.strip_suffix(".bias"))
        .unwrap_or(name);
    if let Some(rest) = stem.strip_prefix("blk.")
        && let Some((idx, base)) = rest.split_once('.')
        && let Ok(layer) = idx.parse::<usize>()
    {
        return (base, Some(layer));
    }
    (stem, None)
}

/// A node name without its `-{layer}` suffix.
fn name_base(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((base, idx)) if !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

fn label(base: &str, layer: Option<usize>) -> String {
    match layer {
        Some(l) => format!("{base}-{l}"),
        None => base.to_string(),
    }
}

/// The weight's compute type, or a typed error naming the node and the tensor.
fn checked_type(node: &str, t: &TensorInfo) -> Result<GgmlType, GraphError> {
    t.weight_type()
        .map_err(|source| GraphError::UnsupportedWeight {
            node: node.to_string(),
            source,
        })
}

/// GGUF `ne` as `usize`; `dims[k]` beyond the rank is 1.
fn dim(t: &TensorInfo, k: usize) -> usize {
    t.dims
        .get(k)
        .map_or(1, |&d| usize::try_from(d).unwrap_or(usize::MAX))
}

/// A weight that must be a matrix `[in, out]` (trailing dims 1).
fn matrix_dims(t: &TensorInfo) -> Result<(usize, usize), GraphError> {
    if t.dims.len() < 2 || t.dims[2..].iter().any(|&d| d != 1) {
        return Err(GraphError::WeightRank {
            tensor: t.name.clone(),
            dims: t.dims.clone(),
            what: "a matrix weight must be [in, out]",
        });
    }
    Ok((dim(t, 0), dim(t, 1)))
}

fn expect_dim(
    node: &str,
    what: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), GraphError> {
    if expected == got {
        Ok(())
    } else {
        Err(GraphError::DimMismatch {
            node: node.to_string(),
            what,
            expected,
            got,
        })
    }
}

/// The append-only graph factory.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: ComputeGraph,
    /// Layer the next nodes belong to (naming and `CNode::layer`).
    layer: Option<usize>,
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// Sets the layer the following nodes belong to (`None` after the last layer).
    pub fn set_layer(&mut self, layer: Option<usize>) {
        self.layer = layer;
    }

    pub fn layer(&self) -> Option<usize> {
        self.layer
    }

    /// The graph so far.
    pub fn graph(&self) -> &ComputeGraph {
        &self.graph
    }

    /// Output shape of node `id`.
    pub fn shape(&self, id: NodeId) -> Result<[usize; 4], GraphError> {
        self.graph
            .nodes
            .get(id)
            .map(|n| n.out_shape)
            .ok_or(GraphError::DanglingId {
                id,
                n_nodes: self.graph.nodes.len(),
            })
    }

    fn node_ref(&self, id: NodeId) -> Result<&CNode, GraphError> {
        self.graph.nodes.get(id).ok_or(GraphError::DanglingId {
            id,
            n_nodes: self.graph.nodes.len(),
        })
    }

    /// Appends a node. Every source must already exist.
    pub fn node(&mut self, spec: NodeSpec) -> Result<NodeId, GraphError> {
        let n_nodes = self.graph.nodes.len();
        if let Some(&id) = spec.src.iter().find(|&&s| s >= n_nodes) {
            return Err(GraphError::DanglingId { id, n_nodes });
        }
        let layer = spec.layer.or(self.layer);
        self.graph.nodes.push(CNode {
            id: n_nodes,
            name: label(&spec.base, layer),
            op: spec.op,
            src: spec.src,
            out_shape: spec.out_shape,
            out_dtype: spec.out_dtype,
            layer,
            backend: None,
            meta: spec.meta,
        });
        Ok(n_nodes)
    }

    /// Re-labels node `id` as `"{base}-{layer}"` (llama.cpp's `cb(cur, name, il)`).
    pub fn rename(&mut self, id: NodeId, base: &str) -> Result<(), GraphError> {
        let n_nodes = self.graph.nodes.len();
        let node = self
            .graph
            .nodes
            .get_mut(id)
            .ok_or(GraphError::DanglingId { id, n_nodes })?;
        node.name = label(base, node.layer);
        Ok(())
    }

    /// A host-filled leaf, named exactly `name` (`"token_ids"`, `"positions"`).
    pub fn input(&mut self, name: &str, shape: [usize; 4], dtype: DType) -> NodeId {
        let id = self.graph.nodes.len();
        self.graph.nodes.push(CNode {
            id,
            name: name.to_string(),
            op: Op::Input,
            src: Vec::new(),
            out_shape: shape,
            out_dtype: dtype,
            layer: None,
            backend: None,
            meta: NodeMeta::None,
        });
        self.graph.inputs.push(id);
        id
    }

    /// Marks `node` as a graph output (read back after execution; its buffer is never reused).
    pub fn output(&mut self, node: NodeId) -> Result<(), GraphError> {
        self.node_ref(node)?;
        if !self.graph.outputs.contains(&node) {
            self.graph.outputs.push(node);
        }
        Ok(())
    }

    pub fn build(self) -> ComputeGraph {
        self.graph
    }

    /// Names a node from a weight: base from the tensor name, layer from the builder's context
    /// or the tensor's `blk.N.` prefix.
    fn weight_label(&self, t: &TensorInfo) -> (String, Option<usize>) {
        let (base, layer) = tensor_base(&t.name);
        let layer = self.layer.or(layer);
        (label(base, layer), layer)
    }

    /// Token embedding: `ids` `[nt]` (I32) × weight GGUF `[n_embd, n_vocab]` → `[n_embd, nt]`.
    pub fn embedding(&mut self, ids: NodeId, weight: &TensorInfo) -> Result<NodeId, GraphError> {
        let (name, layer) = self.weight_label(weight);
        let weight_type = checked_type(&name, weight)?;
        let (n_embd, _n_vocab) = matrix_dims(weight)?;
        let nt = self.shape(ids)?[0];
        self.node(NodeSpec {
            base: tensor_base(&weight.name).0.to_string(),
            op: Op::GetRows,
            src: vec![ids],
            out_shape: [n_embd, nt, 1, 1],
            out_dtype: DType::F32,
            meta: NodeMeta::Embed(EmbedMeta {
                weight: WeightId(weight.index),
                weight_name: weight.name.clone(),
                weight_type,
                n_embd,
            }),
            layer,
        })
    }

    /// RMSNorm over each token row of `x` `[d, nt]`, scaled by `weight` `[d]` when given.
    pub fn rms_norm(
        &mut self,
        x: NodeId,
        weight: Option<&TensorInfo>,
        eps: f32,
    ) -> Result<NodeId, GraphError> {
        let d = self.shape(x)?[0];
        let weight_len = (d, "norm weight length vs row width");
        self.norm_node(x, weight, "norm", weight_len, Op::RmsNorm { eps })
    }

    /// Per-head RMSNorm (Qwen3): `x` `[hd * nh, nt]` normalised per `hd`-row, weight `[hd]`.
    pub fn qk_norm(
        &mut self,
        x: NodeId,
        weight: Option<&TensorInfo>,
        hd: usize,
        nh: usize,
        eps: f32,
    ) -> Result<NodeId, GraphError> {
        let width = self.shape(x)?[0];
        let name = match weight {
            Some(w) => self.weight_label(w).0,
            None => label("qk_norm", self.layer),
        };
        expect_dim(&name, "row width vs head_dim * n_head", hd * nh, width)?;
        let weight_len = (hd, "qk-norm weight length vs head_dim");
        self.norm_node(x, weight, "qk_norm", weight_len, Op::QkNorm { hd, nh, eps })
    }

    /// A norm node over `x` (its shape kept), labelled after its weight (or `default_base`),
    /// whose weight must be a float vector of `weight_len.0` values.
    fn norm_node(
        &mut self,
        x: NodeId,
        weight: Option<&TensorInfo>,
        default_base: &str,
        weight_len: (usize, &'static str),
        op: Op,
    ) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let (name, layer) = match weight {
            Some(w) => self.weight_label(w),
            None => (label(default_base, self.layer), self.layer),
        };
        if let Some(w) = weight {
            checked_type(&name, w)?;
            expect_dim(&name, weight_len.1, weight_len.0, dim(w, 0))?;
        }
        self.node(NodeSpec {
            base: name_base(&name).to_string(),
            op,
            src: vec![x],
            out_shape: shape,
            out_dtype: DType::F32,
            meta: NodeMeta::Norm(NormMeta {
                weight: weight.map(|w| WeightId(w.index)),
                weight_name: weight.map(|w| w.name.clone()),
            }),
            layer,
        })
    }

    /// `y = W x (+ b)`: `x` `[in, nt]`, weight GGUF `[in, out]` (memory `[out][in]`), optional
    /// bias `[out]` applied inline by the kernel → `[out, nt]`.
    pub fn matmul(
        &mut self,
        x: NodeId,
        weight: &TensorInfo,
        bias: Option<&TensorInfo>,
    ) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let (name, layer) = self.weight_label(weight);
        let weight_type = checked_type(&name, weight)?;
        let (in_dim, out_dim) = matrix_dims(weight)?;
        expect_dim(&name, "weight in-dim vs input features", in_dim, shape[0])?;
        if let Some(b) = bias {
            checked_type(&name, b)?;
            expect_dim(&name, "bias length vs weight out-dim", out_dim, dim(b, 0))?;
        }
        self.node(NodeSpec {
            base: name_base(&name).to_string(),
            op: Op::MatMul,
            src: vec![x],
            out_shape: [out_dim, shape[1], 1, 1],
            out_dtype: DType::F32,
            meta: NodeMeta::MatMul(MatMulMeta {
                weight: WeightId(weight.index),
                weight_name: weight.name.clone(),
                bias: bias.map(|b| WeightId(b.index)),
                bias_name: bias.map(|b| b.name.clone()),
                weight_type,
                in_dim,
                out_dim,
            }),
            layer,
        })
    }

    /// Row gather: rows of `x` `[d, nt]` at the i32 `ids` `[n]` → `[d, n]` (tail-row selection).
    pub fn get_rows(&mut self, x: NodeId, ids: NodeId) -> Result<NodeId, GraphError> {
        let d = self.shape(x)?[0];
        let n = self.shape(ids)?[0];
        let base = format!("{}_rows", name_base(&self.node_ref(x)?.name));
        self.node(NodeSpec::new(&base, Op::GetRows, &[x, ids], [d, n, 1, 1]))
    }

    /// Rotary embedding of `x` `[n_head * head_dim, nt]` at the i32 positions `pos` `[nt]`.
    pub fn rope(
        &mut self,
        x: NodeId,
        pos: NodeId,
        style: RopeStyle,
        meta: RoPEMeta,
    ) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let base = format!("{}_rope", name_base(&self.node_ref(x)?.name));
        let name = label(&base, self.layer);
        expect_dim(
            &name,
            "row width vs n_head * head_dim",
            meta.n_head * meta.head_dim,
            shape[0],
        )?;
        expect_dim(&name, "positions vs tokens", shape[1], self.shape(pos)?[0])?;
        if meta.n_rot > meta.head_dim || !meta.n_rot.is_multiple_of(2) {
            return Err(GraphError::DimMismatch {
                node: name,
                what: "n_rot must be even and at most head_dim",
                expected: meta.head_dim,
                got: meta.n_rot,
            });
        }
        let mut spec = NodeSpec::new(&base, Op::RoPE { style }, &[x, pos], shape);
        spec.meta = NodeMeta::Rope(meta);
        self.node(spec)
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let base = format!("{}_silu", name_base(&self.node_ref(x)?.name));
        self.node(NodeSpec::new(&base, Op::Silu, &[x], shape))
    }

    /// `x * s` (ggml `scale`), its shape kept.
    pub fn scale(&mut self, x: NodeId, s: f32) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let base = format!("{}_scaled", name_base(&self.node_ref(x)?.name));
        self.node(NodeSpec::new(&base, Op::Scale { s }, &[x], shape))
    }

    /// GELU (tanh approximation, ggml's table), its shape kept.
    pub fn gelu(&mut self, x: NodeId) -> Result<NodeId, GraphError> {
        let shape = self.shape(x)?;
        let base = format!("{}_gelu", name_base(&self.node_ref(x)?.name));
        self.node(NodeSpec::new(&base, Op::Gelu, &[x], shape))
    }

    fn binary(&mut self, base: &str, op: Op, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        let (left, right) = (self.shape(a)?, self.shape(b)?);
        if left != right {
            return Err(GraphError::ShapeMismatch {
                node: label(base, self.layer),
                left,
                right,
            });
        }
        self.node(NodeSpec::new(base, op, &[a, b], left))
    }

    /// `a + b`, equal shapes (residual adds).
    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.binary("add", Op::Add, a, b)
    }

    /// `a * b`, equal shapes.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, GraphError> {
        self.binary("mul", Op::Mul, a, b)
    }

    /// `silu(gate) * up` in one node. Models normally build `silu` + `mul` and let the fusion
    /// pass fold them where the backend claims the fused kernel.
    pub fn swiglu(&mut self, gate: NodeId, up: NodeId) -> Result<NodeId, GraphError> {
        self.binary("swiglu", Op::SwiGLU, gate, up)
    }

    /// `gelu(gate) * up` in one node (models build `gelu` + `mul`; the fusion pass folds them).
    pub fn geglu(&mut self, gate: NodeId, up: NodeId) -> Result<NodeId, GraphError> {
        self.binary("geglu", Op::GeGLU, gate, up)
    }

    /// Attention of `q` over the layer's KV (`kv` must be that layer's `kv_load`), causal by
    /// `pos`. `src = [q, kv, pos]`; output `[n_head * head_dim, nt]` from `meta` (a fused q
    /// handle may be wider than that).
    pub fn attn(
        &mut self,
        q: NodeId,
        kv: NodeId,
        pos: NodeId,
        meta: AttnMeta,
    ) -> Result<NodeId, GraphError> {
        self.attn_in(q, kv, pos, None, meta)
    }

    /// Attention over KV regions several sequences share: `cells` `[nt]` i32 is the cell each
    /// token's K and V were stored at, so token `t` attends the cells of its own sequence,
    /// `cells[t] - pos[t] ..= cells[t]` (and within its window). `src = [q, kv, pos, cells]`.
    pub fn attn_cells(
        &mut self,
        q: NodeId,
        kv: NodeId,
        pos: NodeId,
        cells: NodeId,
        meta: AttnMeta,
    ) -> Result<NodeId, GraphError> {
        self.attn_in(q, kv, pos, Some(cells), meta)
    }

    fn attn_in(
        &mut self,
        q: NodeId,
        kv: NodeId,
        pos: NodeId,
        cells: Option<NodeId>,
        meta: AttnMeta,
    ) -> Result<NodeId, GraphError> {
        let name = label("attn", Some(meta.layer));
        let q_shape = self.shape(q)?;
        let kv_node = self.node_ref(kv)?;
        let kv_meta = match (&kv_node.op, &kv_node.meta) {
            (Op::KvcacheLoad { layer }, NodeMeta::Kvcache(m)) if *layer == meta.layer => m.clone(),
            _ => {
                return Err(GraphError::AttnKvSource {
                    node: name,
                    kv: kv_node.name.clone(),
                    layer: meta.layer,
                });
            }
        };
        let width = meta.n_head * meta.head_dim;
        if q_shape[0] < width {
            return Err(GraphError::DimMismatch {
                node: name,
                what: "q rows must hold at least n_head * head_dim",
                expected: width,
                got: q_shape[0],
            });
        }
        if meta.n_head_kv == 0 || !meta.n_head.is_multiple_of(meta.n_head_kv) {
            return Err(GraphError::DimMismatch {
                node: name,
                what: "n_head must be a multiple of n_head_kv",
                expected: meta.n_head,
                got: meta.n_head_kv,
            });
        }
        expect_dim(
            &name,
            "KV row width vs n_head_kv * head_dim",
            kv_meta.n_embd_kv,
            meta.n_embd_kv(),
        )?;
        expect_dim(&name, "KV rows vs n_ctx", kv_meta.n_ctx, meta.n_ctx)?;
        if meta.window == Some(0) {
            return Err(GraphError::DimMismatch {
                node: name,
                what: "a sliding window must hold at least one cell",
                expected: 1,
                got: 0,
            });
        }
        expect_dim(
            &name,
            "positions vs tokens",
            q_shape[1],
            self.shape(pos)?[0],
        )?;
        let nt = q_shape[1];
        let mut src = vec![q, kv, pos];
        if let Some(cells) = cells {
            expect_dim(&name, "cells vs tokens", nt, self.shape(cells)?[0])?;
            src.push(cells);
        }
        let layer = Some(meta.layer);
        self.node(NodeSpec {
            base: "attn".to_string(),
            op: Op::Attn,
            src,
            out_shape: [width, nt, 1, 1],
            out_dtype: DType::F32,
            meta: NodeMeta::Attn(meta),
            layer,
        })
    }

    /// Writes this step's K and V `[n_embd_kv, nt]` into the layer's persistent regions at the
    /// rows `pos` names. `src = [k, v, pos]`. The payload is the layer only; the declared shape
    /// `[n_embd_kv, n_ctx]` is the allocator's sizing contract for each region.
    pub fn kvcache_store(
        &mut self,
        layer: usize,
        k: NodeId,
        v: NodeId,
        pos: NodeId,
        n_ctx: usize,
        (kv_type, head_dim): (KvType, usize),
    ) -> Result<NodeId, GraphError> {
        let name = label("kv_store", Some(layer));
        let (k_shape, v_shape) = (self.shape(k)?, self.shape(v)?);
        if k_shape != v_shape {
            return Err(GraphError::ShapeMismatch {
                node: name,
                left: k_shape,
                right: v_shape,
            });
        }
        expect_dim(
            &name,
            "positions vs tokens",
            k_shape[1],
            self.shape(pos)?[0],
        )?;
        if k_shape[1] > n_ctx {
            return Err(GraphError::DimMismatch {
                node: name,
                what: "tokens per step must fit in n_ctx",
                expected: n_ctx,
                got: k_shape[1],
            });
        }
        let n_embd_kv = k_shape[0];
        self.node(NodeSpec {
            base: "kv_store".to_string(),
            op: Op::KvcacheStore { layer },
            src: vec![k, v, pos],
            out_shape: [n_embd_kv, n_ctx, 1, 1],
            out_dtype: kv_type.dtype(),
            meta: NodeMeta::Kvcache(KvcacheMeta {
                layer,
                n_embd_kv,
                n_ctx,
                kv_type,
                head_dim,
            }),
            layer: Some(layer),
        })
    }

    /// Re-rotates the K rows of the layer's cells by `deltas` `[n_ctx]` (i32, one per cell; `0`
    /// leaves the cell as it is) with the RoPE of `rope`: llama.cpp's K-shift. The node's buffer
    /// is the layer's K region, like the store's.
    pub fn kv_shift(
        &mut self,
        layer: usize,
        deltas: NodeId,
        rope: RoPEMeta,
        style: RopeStyle,
        kv: KvcacheMeta,
    ) -> Result<NodeId, GraphError> {
        let name = label("kv_shift", Some(layer));
        expect_dim(&name, "deltas vs n_ctx", kv.n_ctx, self.shape(deltas)?[0])?;
        expect_dim(&name, "KV row width vs n_head_kv * head_dim", kv.n_embd_kv, rope.n_head * rope.head_dim)?;
        self.node(NodeSpec {
            base: "kv_shift".to_string(),
            op: Op::KvShift { layer },
            src: vec![deltas],
            out_shape: [kv.n_embd_kv, kv.n_ctx, 1, 1],
            out_dtype: kv.kv_type.dtype(),
            meta: NodeMeta::KvShift(KvShiftMeta { kv, rope, style }),
            layer: Some(layer),
        })
    }

    /// A view of the layer's K region (`[n_embd_kv, n_ctx]`; no sources). Attention reads both
    /// halves through the allocator's `kv_pair(layer)`.
    pub fn kvcache_load(&mut self, layer: usize, n_embd_kv: usize, n_ctx: usize, (kv_type, head_dim): (KvType, usize)) -> NodeId {
        let id = self.graph.nodes.len();
        self.graph.nodes.push(CNode {
            id,
            name: label("kv_load", Some(layer)),
            op: Op::KvcacheLoad { layer },
            src: Vec::new(),
            out_shape: [n_embd_kv, n_ctx, 1, 1],
            out_dtype: kv_type.dtype(),
            layer: Some(layer),
            backend: None,
            meta: NodeMeta::Kvcache(KvcacheMeta {
                layer,
                n_embd_kv,
                n_ctx,
                kv_type,
                head_dim,
            }),
        });
        id
    }
}

#[cfg(test)]
mod tests {
    use super::{name_base, tensor_base};

    #[test]
    fn tensor_names_split_into_base_and_layer() {
        assert_eq!(
            tensor_base("blk.3.attn_norm.weight"),
            ("attn_norm", Some(3))
        );
        assert_eq!(tensor_base("blk.12.attn_q.bias"), ("attn_q", Some(12)));
        assert_eq!(tensor_base("token_embd.weight"), ("token_embd", None));
        assert_eq!(tensor_base("blk.x.attn_q.weight"), ("blk.x.attn_q", None));
        assert_eq!(name_base("attn_q-3"), "attn_q");
        assert_eq!(name_base("token_embd"), "token_embd");
        assert_eq!(name_base("kv-store"), "kv-store");
    }
}
