//! Shared helpers for the graph tests: fake tensor infos, a mock backend, and a Qwen2-shaped
//! model builder written the way a model's `build_graph` would be.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use minfer::gguf::TensorInfo;
use minfer::graph::{
    AttnMeta, AttnMode, Backend, BackendImpl, BufRef, CNode, CParams, ComputeGraph, DType, FusedOp,
    GraphBuilder, GraphError, GraphParams, GraphType, KvPair, NodeId, Op, RoPEMeta, RopeStyle,
};
use minfer::quants::GgmlType;

/// A tensor info as the GGUF reader would produce it (`dims` = ggml `ne`).
pub fn tensor(name: &str, dims: &[u64], ty: GgmlType) -> TensorInfo {
    let n_elements: u64 = dims.iter().product();
    TensorInfo {
        name: name.to_string(),
        dims: dims.to_vec(),
        type_id: ty.id(),
        ty: Some(ty),
        offset: 0,
        n_elements,
        n_bytes: n_elements / ty.block_size() as u64 * ty.type_size() as u64,
    }
}

/// A tensor stored in a type minfer does not implement (IQ2_XS, id 17).
pub fn iquant_tensor(name: &str, dims: &[u64]) -> TensorInfo {
    TensorInfo {
        name: name.to_string(),
        dims: dims.to_vec(),
        type_id: 17,
        ty: None,
        offset: 0,
        n_elements: dims.iter().product(),
        n_bytes: 0,
    }
}

pub fn cparams(n_ctx: usize) -> CParams {
    CParams {
        n_ctx,
        flash_attn: false,
        gpu: false,
        fuse_qkv: false,
        fuse_ffn: false,
        kv_type: Default::default(),
    }
}

/// Prefill (`n_out = 1`) or decode params.
pub fn params(n_tokens: usize, n_ctx: usize) -> GraphParams {
    GraphParams {
        n_tokens,
        n_out: 1,
        gtype: GraphType::for_tokens(n_tokens),
        cparams: cparams(n_ctx),
        weights_version: 1,
    }
}

/// Hyper-parameters of a Qwen2-shaped model.
#[derive(Debug, Clone, Copy)]
pub struct Qwen2Shape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub eps: f32,
}

impl Qwen2Shape {
    /// Qwen2.5-0.5B: the walkthrough's census model.
    pub fn qwen2_05b() -> Qwen2Shape {
        Qwen2Shape {
            n_layer: 24,
            n_embd: 896,
            n_head: 14,
            n_head_kv: 2,
            n_ff: 4864,
            n_vocab: 151936,
            eps: 1e-6,
        }
    }

    /// Two small layers.
    pub fn tiny() -> Qwen2Shape {
        Qwen2Shape {
            n_layer: 2,
            n_embd: 8,
            n_head: 2,
            n_head_kv: 1,
            n_ff: 16,
            n_vocab: 10,
            eps: 1e-6,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim()
    }

    fn w(&self, il: usize, base: &str, dims: &[usize], ty: GgmlType) -> TensorInfo {
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        tensor(&format!("blk.{il}.{base}.weight"), &dims, ty)
    }

    fn b(&self, il: usize, base: &str, n: usize) -> TensorInfo {
        tensor(&format!("blk.{il}.{base}.bias"), &[n as u64], GgmlType::F32)
    }

    fn rope_meta(&self, n_head: usize) -> RoPEMeta {
        RoPEMeta {
            n_head,
            head_dim: self.head_dim(),
            n_rot: self.head_dim(),
            freq_base: 1_000_000.0,
            freq_scale: 1.0,
            n_ctx_orig: 32768,
        }
    }

    /// The Qwen2 forward pass, node for node as walkthrough 05 lists it: inputs, embedding,
    /// 18 nodes per layer (the last layer plus two tail `get_rows` when `n_out < nt`), final
    /// norm and lm_head. The FFN is built as silu + mul for the fusion pass to fold.
    pub fn build(&self, p: &GraphParams) -> Result<ComputeGraph, GraphError> {
        let (nt, ne, nkv, nf) = (p.n_tokens, self.n_embd, self.n_embd_kv(), self.n_ff);
        let n_ctx = p.cparams.n_ctx;
        let q8 = GgmlType::Q8_0;
        let mut b = GraphBuilder::new();
        let ids = b.input("token_ids", [nt, 1, 1, 1], DType::I32);
        let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
        // Declared at the head, consumed at the last layer.
        let tail = (p.n_out < nt).then(|| b.input("tail_ids", [p.n_out, 1, 1, 1], DType::I32));
        let embd = tensor("token_embd.weight", &[ne as u64, self.n_vocab as u64], q8);
        let mut h = b.embedding(ids, &embd)?;
        let mode = if p.cparams.flash_attn {
            AttnMode::Flash
        } else {
            AttnMode::Gqa
        };
        for il in 0..self.n_layer {
            b.set_layer(Some(il));
            let residual = h;
            let normed = b.rms_norm(
                h,
                Some(&self.w(il, "attn_norm", &[ne], GgmlType::F32)),
                self.eps,
            )?;
            let q = b.matmul(
                normed,
                &self.w(il, "attn_q", &[ne, ne], q8),
                Some(&self.b(il, "attn_q", ne)),
            )?;
            let k = b.matmul(
                normed,
                &self.w(il, "attn_k", &[ne, nkv], q8),
                Some(&self.b(il, "attn_k", nkv)),
            )?;
            let v = b.matmul(
                normed,
                &self.w(il, "attn_v", &[ne, nkv], q8),
                Some(&self.b(il, "attn_v", nkv)),
            )?;
            let q = b.rope(
                q,
                pos,
                RopeStyle::NonInterleaved,
                self.rope_meta(self.n_head),
            )?;
            let k = b.rope(
                k,
                pos,
                RopeStyle::NonInterleaved,
                self.rope_meta(self.n_head_kv),
            )?;
            b.kvcache_store(il, k, v, pos, n_ctx, (Default::default(), self.head_dim()))?;
            let kv = b.kvcache_load(il, nkv, n_ctx, (Default::default(), self.head_dim()));
            let meta = AttnMeta {
                layer: il,
                n_head: self.n_head,
                n_head_kv: self.n_head_kv,
                head_dim: self.head_dim(),
                scale: 1.0 / (self.head_dim() as f32).sqrt(),
                n_ctx,
                kv_type: Default::default(),
            };
            let attn = b.attn(q, kv, pos, mode, meta)?;
            let wo = b.matmul(attn, &self.w(il, "attn_output", &[ne, ne], q8), None)?;
            h = match tail {
                Some(tail) if il + 1 == self.n_layer => {
                    let cur = b.get_rows(wo, tail)?;
                    let res = b.get_rows(residual, tail)?;
                    b.add(res, cur)?
                }
                _ => b.add(residual, wo)?,
            };
            b.rename(h, "ffn_inp")?;
            let residual = h;
            let normed = b.rms_norm(
                h,
                Some(&self.w(il, "ffn_norm", &[ne], GgmlType::F32)),
                self.eps,
            )?;
            let gate = b.matmul(normed, &self.w(il, "ffn_gate", &[ne, nf], q8), None)?;
            let up = b.matmul(normed, &self.w(il, "ffn_up", &[ne, nf], q8), None)?;
            let g = b.silu(gate)?;
            let sw = b.mul(g, up)?;
            let down = b.matmul(sw, &self.w(il, "ffn_down", &[nf, ne], q8), None)?;
            h = b.add(residual, down)?;
            b.rename(h, "l_out")?;
        }
        b.set_layer(None);
        let norm_w = tensor("output_norm.weight", &[ne as u64], GgmlType::F32);
        let normed = b.rms_norm(h, Some(&norm_w), self.eps)?;
        let out_w = tensor("output.weight", &[ne as u64, self.n_vocab as u64], q8);
        let logits = b.matmul(normed, &out_w, None)?;
        b.output(logits)?;
        Ok(b.build())
    }
}

/// Which ops a mock claims.
pub type OpFilter = fn(&Op, DType) -> bool;

pub fn all_f32(op: &Op, dtype: DType) -> bool {
    *op != Op::Input && dtype == DType::F32
}

pub fn only_add_mul(op: &Op, dtype: DType) -> bool {
    matches!(op, Op::Add | Op::Mul) && dtype == DType::F32
}

/// A device stand-in: its own pool, configurable capabilities, Add/Mul kernels, and a log of
/// the nodes it executed.
pub struct MockBackend {
    pub handle: Backend,
    pub ops: OpFilter,
    pub fused: bool,
    pub buffers: Vec<Vec<f32>>,
    pub free: Vec<usize>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl MockBackend {
    pub fn new(handle: Backend, ops: OpFilter, fused: bool) -> MockBackend {
        MockBackend {
            handle,
            ops,
            fused,
            buffers: Vec::new(),
            free: Vec::new(),
            log: Arc::default(),
        }
    }
}

impl BackendImpl for MockBackend {
    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        (self.ops)(op, dtype)
    }
    fn supports_fused(&self, _fused: FusedOp) -> bool {
        self.fused
    }
    fn alloc_buffer(&mut self, len: usize) -> usize {
        if let Some(pos) = self
            .free
            .iter()
            .position(|&id| self.buffers[id].len() == len)
        {
            let id = self.free.swap_remove(pos);
            self.buffers[id].fill(0.0);
            return id;
        }
        self.alloc_fresh(len)
    }
    fn free_buffer(&mut self, id: usize) {
        if !self.free.contains(&id) {
            self.free.push(id);
        }
    }
    fn alloc_fresh(&mut self, len: usize) -> usize {
        self.buffers.push(vec![0.0; len]);
        self.buffers.len() - 1
    }
    fn pool_len(&self) -> usize {
        self.buffers.len()
    }
    fn buffer_len(&self, id: usize) -> Option<usize> {
        self.buffers.get(id).map(Vec::len)
    }
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        _kv: Option<KvPair>,
    ) -> Result<(), GraphError> {
        for b in in_bufs.iter().chain([&out_buf]) {
            if b.backend != self.handle {
                return Err(GraphError::BackendMismatch {
                    node: node.name.clone(),
                    split: self.handle,
                    buffer: b.backend,
                });
            }
        }
        let f: fn(f32, f32) -> f32 = match node.op {
            Op::Add => |a, b| a + b,
            Op::Mul => |a, b| a * b,
            _ => {
                return Err(GraphError::NoKernel {
                    node: node.name.clone(),
                    op: node.op.clone(),
                });
            }
        };
        let out: Vec<f32> = self.buffers[in_bufs[0].id]
            .iter()
            .zip(&self.buffers[in_bufs[1].id])
            .map(|(&a, &b)| f(a, b))
            .collect();
        self.buffers[out_buf.id] = out;
        if let Ok(mut log) = self.log.lock() {
            log.push(node.name.clone());
        }
        Ok(())
    }
    fn read_host(&self, id: usize) -> Option<&[f32]> {
        self.buffers.get(id).map(Vec::as_slice)
    }
    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), GraphError> {
        let buf = self.buffers.get_mut(id).ok_or(GraphError::BadBufferId {
            backend: self.handle,
            id,
        })?;
        if buf.len() != data.len() {
            return Err(GraphError::HostLength {
                backend: self.handle,
                id,
                expected: buf.len(),
                got: data.len(),
            });
        }
        buf.copy_from_slice(data);
        Ok(())
    }
}

/// Ids of the nodes with op `op`.
pub fn ids_of(graph: &ComputeGraph, op: &Op) -> Vec<NodeId> {
    graph
        .nodes
        .iter()
        .filter(|n| n.op == *op)
        .map(|n| n.id)
        .collect()
}

/// Number of nodes whose op has the short name `name`.
pub fn count_op(graph: &ComputeGraph, name: &str) -> usize {
    graph.nodes.iter().filter(|n| n.op.name() == name).count()
}
