//! The CPU backend: its buffer pool, its capability matrix and its node dispatch.
//!
//! This first version carries the pool and scalar reference loops for the element-wise ops the
//! graph tests need (Add, Mul, Silu, SwiGLU). The real kernels (quantized matmul, norms, RoPE,
//! attention, KV store, row gathers) live in `crate::vec_ops` and are wired into
//! [`CpuBackend::execute_node`] later: every op has its own arm there, and the ones without a
//! kernel yet return [`GraphError::NoKernel`] — never a silent no-op.

use std::sync::Arc;

use super::backend::{BackendImpl, KvPair};
use super::cpu_kernels::{self, KernelCtx, Operand};
use super::ops::NodeMeta;
use super::weights::WeightStore;
use crate::vec_ops::Pool;
use super::error::GraphError;
use super::ops::{FusedOp, Op, OpKind};
use super::registry::{Backend, Capabilities};
use super::{BufRef, CNode, DType};

/// The CPU capability matrix: every op on F32 outputs except the builder-built decode fusions
/// (GPU kernels); inputs at any dtype (host-filled: I32 lives in f32 bit patterns).
pub fn cpu_supports_op(op: &Op, dtype: DType) -> bool {
    match op {
        Op::Input => true,
        _ => dtype == DType::F32 && op.kind() != OpKind::DecodeFused,
    }
}

/// The CPU runs SwiGLU as one pass.
pub fn cpu_supports_fused(fused: FusedOp) -> bool {
    match fused {
        FusedOp::SwiGLU => true,
    }
}

/// What the registry advertises for the CPU (the trait methods forward to the same functions).
pub const CAPABILITIES: Capabilities = Capabilities {
    supports_op: cpu_supports_op,
    supports_fused: cpu_supports_fused,
};

/// The CPU pool: plain `Vec<f32>` buffers and an exact-length free list, plus what the kernels
/// need: the model's weights (by name) and the worker threads.
#[derive(Default)]
pub struct CpuBackend {
    buffers: Vec<Vec<f32>>,
    free: Vec<usize>,
    weights: Option<Arc<WeightStore>>,
    pool: Option<Arc<Pool>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("buffers", &self.buffers.len())
            .field("free", &self.free.len())
            .field("weights", &self.weights.is_some())
            .field("threads", &self.pool.as_ref().map(|p| p.n_threads()))
            .finish()
    }
}

impl CpuBackend {
    /// A pool without weights (graph tests).
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    /// The backend of a model: its weights and `pool`'s worker threads.
    pub fn with_model(weights: Arc<WeightStore>, pool: Arc<Pool>) -> CpuBackend {
        CpuBackend { weights: Some(weights), pool: Some(pool), ..CpuBackend::default() }
    }

    /// Ids on the free list (diagnostics and tests).
    pub fn free_len(&self) -> usize {
        self.free.len()
    }

    fn check_cpu(&self, node: &CNode, buf: BufRef) -> Result<usize, GraphError> {
        if buf.backend != Backend::CPU {
            return Err(GraphError::BackendMismatch {
                node: node.name.clone(),
                split: Backend::CPU,
                buffer: buf.backend,
            });
        }
        if buf.id >= self.buffers.len() {
            return Err(GraphError::BadBufferId {
                backend: Backend::CPU,
                id: buf.id,
            });
        }
        Ok(buf.id)
    }

    fn buf_id(&self, node: &CNode, b: BufRef) -> Result<usize, GraphError> {
        self.check_cpu(node, b)
    }

    /// Runs a node whose output buffer is `out` and whose operands are `ins`: the output is
    /// taken out of the pool while the kernel runs, an operand aliased to it is passed as
    /// [`Operand::Aliased`].
    fn run_simple(&mut self, node: &CNode, ins: &[BufRef], out: BufRef) -> Result<(), GraphError> {
        let out_id = self.buf_id(node, out)?;
        let ids = ins.iter().map(|&b| self.buf_id(node, b)).collect::<Result<Vec<_>, _>>()?;
        let mut dst = std::mem::take(&mut self.buffers[out_id]);
        let cx = KernelCtx { weights: self.weights.as_deref(), pool: self.pool.as_deref() };
        let operands: Vec<Operand> = ids
            .iter()
            .map(|&id| if id == out_id { Operand::Aliased } else { Operand::Buf(&self.buffers[id]) })
            .collect();
        let r = cpu_kernels::run(node, &cx, &operands, &mut dst);
        self.buffers[out_id] = dst;
        r
    }

    /// KvcacheStore: src = [k, v, pos]; the node's buffer is the layer's K region.
    fn run_kv_store(&mut self, node: &CNode, ins: &[BufRef], kv: Option<KvPair>) -> Result<(), GraphError> {
        let pair = cpu_kernels::require_kv(node, kv)?;
        let (k_id, v_id) = (self.buf_id(node, pair.k)?, self.buf_id(node, pair.v)?);
        let [k, v, pos] = self.three(node, ins)?;
        if [k, v, pos].iter().any(|&i| i == k_id || i == v_id) || k_id == v_id {
            return Err(GraphError::KvAliased { node: node.name.clone() });
        }
        let n_ctx = match &node.meta {
            NodeMeta::Kvcache(m) => m.n_ctx,
            _ => node.out_shape[1],
        };
        let mut kc = std::mem::take(&mut self.buffers[k_id]);
        let mut vc = std::mem::take(&mut self.buffers[v_id]);
        let r = cpu_kernels::kv_store(node, &self.buffers[k], &self.buffers[v], &self.buffers[pos], (&mut kc, &mut vc), n_ctx);
        self.buffers[k_id] = kc;
        self.buffers[v_id] = vc;
        r
    }

    /// Attn: src = [q, kv_load, pos]; K and V from the layer's pair.
    fn run_attention(&mut self, node: &CNode, ins: &[BufRef], out: BufRef, kv: Option<KvPair>) -> Result<(), GraphError> {
        let pair = cpu_kernels::require_kv(node, kv)?;
        let (k_id, v_id) = (self.buf_id(node, pair.k)?, self.buf_id(node, pair.v)?);
        let [q, _kv_view, pos] = self.three(node, ins)?;
        let out_id = self.buf_id(node, out)?;
        let mut dst = std::mem::take(&mut self.buffers[out_id]);
        let cx = KernelCtx { weights: self.weights.as_deref(), pool: self.pool.as_deref() };
        let b = &self.buffers;
        let r = cpu_kernels::attention(node, &cx, &b[q], &b[pos], &b[k_id], &b[v_id], &mut dst);
        self.buffers[out_id] = dst;
        r
    }

    fn three(&self, node: &CNode, ins: &[BufRef]) -> Result<[usize; 3], GraphError> {
        match ins {
            [a, b, c] => Ok([self.buf_id(node, *a)?, self.buf_id(node, *b)?, self.buf_id(node, *c)?]),
            _ => Err(GraphError::OperandCount { node: node.name.clone(), expected: 3, got: ins.len() }),
        }
    }
}

impl BackendImpl for CpuBackend {
    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        cpu_supports_op(op, dtype)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        cpu_supports_fused(fused)
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
        if id < self.buffers.len() && !self.free.contains(&id) {
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
        kv: Option<KvPair>,
    ) -> Result<(), GraphError> {
        match &node.op {
            // Host-filled before execution; the scheduler never dispatches inputs.
            Op::Input => Ok(()),
            // A view: the node's buffer *is* the layer's K region; attention reads both halves
            // through `kv`. Nothing to compute.
            Op::KvcacheLoad { .. } => Ok(()),
            Op::KvcacheStore { .. } => self.run_kv_store(node, in_bufs, kv),
            Op::Attn { .. } => self.run_attention(node, in_bufs, out_buf, kv),
            Op::Add
            | Op::Mul
            | Op::Silu
            | Op::SwiGLU
            | Op::RmsNorm { .. }
            | Op::QkNorm { .. }
            | Op::MatMul { .. }
            | Op::GetRows
            | Op::RoPE { .. } => self.run_simple(node, in_bufs, out_buf),
            // Vocabulary no supported architecture emits, and the GPU decode fusions (the CPU
            // never claims them): an error naming the node, never a silent no-op.
            Op::Scale(_)
            | Op::Softmax { .. }
            | Op::View { .. }
            | Op::Reshape { .. }
            | Op::Permute { .. }
            | Op::BatchMatMul
            | Op::FusedQKV { .. }
            | Op::QkvBiasRopeStore { .. }
            | Op::FusedFFN
            | Op::FusedQkvNorm { .. } => Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() }),
        }
    }

    fn read_host(&self, id: usize) -> Option<&[f32]> {
        self.buffers.get(id).map(Vec::as_slice)
    }

    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), GraphError> {
        let buf = self.buffers.get_mut(id).ok_or(GraphError::BadBufferId {
            backend: Backend::CPU,
            id,
        })?;
        if buf.len() != data.len() {
            return Err(GraphError::HostLength {
                backend: Backend::CPU,
                id,
                expected: buf.len(),
                got: data.len(),
            });
        }
        buf.copy_from_slice(data);
        Ok(())
    }
}
