//! Shared helpers for the graph tests: fake tensor infos, a mock backend, and a Qwen2-shaped
//! model builder written the way a model's `build_graph` would be.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use minfer::gguf::TensorInfo;
use minfer::graph::{
    AttnMeta, Backend, BackendImpl, BufferId, BufferUsage, CNode, CParams, ComputeGraph, DType, FusedOp, GraphBuilder,
    GraphError, GraphParams, GraphType, MemoryStats, NodeId, Op, OutOfMemory, RoPEMeta, RopeStyle, SplitWork, TensorRef,
    WeightId, WeightStore,
};
use minfer::quants::GgmlType;

/// A tensor info as the GGUF reader would produce it (`dims` = ggml `ne`).
pub fn tensor(name: &str, dims: &[u64], ty: GgmlType) -> TensorInfo {
    let n_elements: u64 = dims.iter().product();
    TensorInfo {
        index: 0,
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
        index: 0,
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
    CParams { n_ctx, n_seq: 1, gpu: false, kv_type: Default::default() }
}

/// Prefill (`n_out = 1`) or decode params.
pub fn params(n_tokens: usize, n_ctx: usize) -> GraphParams {
    GraphParams {
        n_tokens,
        n_out: 1,
        output: Default::default(),
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
                window: None,
                n_ctx,
                kv_type: Default::default(),
            };
            let attn = b.attn(q, kv, pos, meta)?;
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

/// A device stand-in: its own byte buffers, configurable capabilities, Add/Mul kernels, and a
/// log of the nodes it executed.
pub struct MockBackend {
    pub handle: Backend,
    pub ops: OpFilter,
    pub fused: bool,
    pub buffers: Vec<Option<Vec<u8>>>,
    pub stats: MemoryStats,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl MockBackend {
    pub fn new(handle: Backend, ops: OpFilter, fused: bool) -> MockBackend {
        MockBackend { handle, ops, fused, buffers: Vec::new(), stats: MemoryStats::default(), log: Arc::default() }
    }

    fn region(&self, t: TensorRef, offset: usize, len: usize) -> Result<std::ops::Range<usize>, GraphError> {
        let buf = self.buffers.get(t.buf.id.0 as usize).and_then(Option::as_ref).ok_or(GraphError::BadBufferId { backend: self.handle, id: t.buf.id })?;
        let range = t.offset + offset..t.offset + offset + len;
        match t.buf.backend == self.handle && offset + len <= t.bytes && range.end <= buf.len() {
            true => Ok(range),
            false => Err(GraphError::TensorRange { backend: self.handle, offset, bytes: len, size: t.bytes }),
        }
    }

    fn f32s(&self, t: TensorRef) -> Result<Vec<f32>, GraphError> {
        let r = self.region(t, 0, t.bytes)?;
        let b = &self.buffers[t.buf.id.0 as usize].as_ref().unwrap()[r];
        Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl BackendImpl for MockBackend {
    fn supports_node(&self, node: &CNode) -> bool {
        (self.ops)(&node.op, node.out_dtype)
    }
    fn supports_fused(&self, _fused: FusedOp) -> bool {
        self.fused
    }
    fn alloc_buffer(&mut self, bytes: usize, _usage: BufferUsage) -> Result<BufferId, OutOfMemory> {
        self.buffers.push(Some(vec![0u8; bytes]));
        self.stats.allocations += 1;
        self.stats.bytes_in_use += bytes;
        Ok(BufferId(self.buffers.len() as u32 - 1))
    }
    fn free_buffer(&mut self, id: BufferId) {
        if let Some(b) = self.buffers.get_mut(id.0 as usize).and_then(Option::take) {
            self.stats.frees += 1;
            self.stats.bytes_in_use -= b.len();
        }
    }
    fn buffer_size(&self, id: BufferId) -> Option<usize> {
        self.buffers.get(id.0 as usize)?.as_ref().map(Vec::len)
    }
    fn memory(&self) -> MemoryStats {
        self.stats
    }
    fn set_tensor(&mut self, dst: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        let r = self.region(dst, offset, data.len())?;
        self.buffers[dst.buf.id.0 as usize].as_mut().unwrap()[r].copy_from_slice(data);
        Ok(())
    }
    fn get_tensor(&mut self, src: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let r = self.region(src, offset, out.len())?;
        out.copy_from_slice(&self.buffers[src.buf.id.0 as usize].as_ref().unwrap()[r]);
        Ok(())
    }
    fn copy_tensor(&mut self, src: TensorRef, dst: TensorRef) -> Result<(), GraphError> {
        let mut tmp = vec![0u8; src.bytes];
        self.get_tensor(src, 0, &mut tmp)?;
        self.set_tensor(dst, 0, &tmp)
    }
    fn load_weights(&mut self, _store: &Arc<WeightStore>, _ids: &[WeightId]) -> Result<(), GraphError> {
        Ok(())
    }
    fn compute(&mut self, split: &SplitWork) -> Result<(), GraphError> {
        for w in split.nodes {
            let node = split.node(w)?;
            for t in w.srcs.iter().chain([&w.out]) {
                if t.buf.backend != self.handle {
                    return Err(GraphError::BackendMismatch { node: node.name.clone(), split: self.handle, buffer: t.buf.backend });
                }
            }
            let f: fn(f32, f32) -> f32 = match node.op {
                Op::Add => |a, b| a + b,
                Op::Mul => |a, b| a * b,
                _ => return Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() }),
            };
            let (a, b) = (self.f32s(w.srcs[0])?, self.f32s(w.srcs[1])?);
            let out: Vec<u8> = a.iter().zip(&b).flat_map(|(&x, &y)| f(x, y).to_le_bytes()).collect();
            self.set_tensor(w.out, 0, &out)?;
            if let Ok(mut log) = self.log.lock() {
                log.push(node.name.clone());
            }
        }
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
