//! The CPU backend: its buffer pool, its capability matrix and its node dispatch.
//!
//! This first version carries the pool and scalar reference loops for the element-wise ops the
//! graph tests need (Add, Mul, Silu, SwiGLU). The real kernels (quantized matmul, norms, RoPE,
//! attention, KV store, row gathers) live in `crate::vec_ops` and are wired into
//! [`CpuBackend::execute_node`] later: every op has its own arm there, and the ones without a
//! kernel yet return [`GraphError::NoKernel`] — never a silent no-op.

use std::sync::Arc;

use super::backend::{BackendImpl, KvPair};
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

/// `x * sigmoid(x)`. One definition, used by both `Silu` and `SwiGLU`, so the fused op is
/// bit-identical to `Silu` followed by `Mul`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The scalar element-wise kernels of this first version.
#[derive(Debug, Clone, Copy)]
enum Elementwise {
    Add,
    Mul,
    Silu,
    SwiGLU,
}

impl Elementwise {
    const fn arity(self) -> usize {
        match self {
            Elementwise::Silu => 1,
            Elementwise::Add | Elementwise::Mul | Elementwise::SwiGLU => 2,
        }
    }

    /// `dst[i] = f(a[i], b[i])`; `b` is ignored for unary kernels.
    fn run(self, dst: &mut [f32], a: &[f32], b: &[f32]) {
        match self {
            Elementwise::Add => dst
                .iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(d, (x, y))| *d = x + y),
            Elementwise::Mul => dst
                .iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(d, (x, y))| *d = x * y),
            Elementwise::Silu => dst.iter_mut().zip(a).for_each(|(d, x)| *d = silu(*x)),
            Elementwise::SwiGLU => dst
                .iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(d, (g, u))| *d = silu(*g) * u),
        }
    }

    /// In place over `dst` (unary kernels whose input the allocator aliased to the output).
    fn run_in_place(self, dst: &mut [f32]) {
        if let Elementwise::Silu = self {
            dst.iter_mut().for_each(|d| *d = silu(*d));
        }
    }
}

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

    /// Runs a scalar element-wise kernel. Operands must have the output's length. An operand
    /// aliased to the output (an in-place `Silu`) runs in place; an aliased binary operand is
    /// snapshotted first, since the kernels are written over slices.
    fn elementwise(
        &mut self,
        node: &CNode,
        kernel: Elementwise,
        ins: &[BufRef],
        out: BufRef,
    ) -> Result<(), GraphError> {
        let out_id = self.check_cpu(node, out)?;
        let arity = kernel.arity();
        if ins.len() < arity {
            return Err(GraphError::OperandCount {
                node: node.name.clone(),
                expected: arity,
                got: ins.len(),
            });
        }
        let mut ids = [0usize; 2];
        for (slot, &b) in ids.iter_mut().zip(&ins[..arity]) {
            *slot = self.check_cpu(node, b)?;
        }
        let len = self.buffers[out_id].len();
        for (operand, &id) in ids[..arity].iter().enumerate() {
            let got = self.buffers[id].len();
            if got != len {
                return Err(GraphError::OperandLength {
                    node: node.name.clone(),
                    operand,
                    expected: len,
                    got,
                });
            }
        }
        // dst: [len] f32, taken out of the pool while the kernel runs.
        let mut dst = std::mem::take(&mut self.buffers[out_id]);
        if arity == 1 && ids[0] == out_id {
            kernel.run_in_place(&mut dst);
        } else {
            let snapshot = ids[..arity].contains(&out_id).then(|| dst.clone());
            let operand = |id: usize| -> &[f32] {
                if id == out_id {
                    snapshot.as_deref().unwrap_or(&[])
                } else {
                    &self.buffers[id]
                }
            };
            let a = operand(ids[0]);
            let b = if arity == 2 { operand(ids[1]) } else { a };
            kernel.run(&mut dst, a, b);
        }
        self.buffers[out_id] = dst;
        Ok(())
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
        let no_kernel = || {
            Err(GraphError::NoKernel {
                node: node.name.clone(),
                op: node.op.clone(),
            })
        };
        let _ = kv; // consumed by the KV and attention kernels once they are wired in
        match &node.op {
            // Host-filled before execution; the scheduler never dispatches inputs.
            Op::Input => Ok(()),
            Op::Add => self.elementwise(node, Elementwise::Add, in_bufs, out_buf),
            Op::Mul => self.elementwise(node, Elementwise::Mul, in_bufs, out_buf),
            Op::Silu => self.elementwise(node, Elementwise::Silu, in_bufs, out_buf),
            Op::SwiGLU => self.elementwise(node, Elementwise::SwiGLU, in_bufs, out_buf),
            // A view: the node's buffer *is* the layer's K region; the attention kernel reads
            // both halves through `kv`. Nothing to compute.
            Op::KvcacheLoad { .. } => Ok(()),

            // ---- kernels wired in later (crate::vec_ops) ----
            // Scale: dst = s * src[0].
            Op::Scale(_) => no_kernel(),
            // Softmax over `dim` (vocabulary only).
            Op::Softmax { .. } => no_kernel(),
            // RmsNorm: per token row of d = out_shape[0]; weight = NormMeta.weight_name.
            Op::RmsNorm { .. } => no_kernel(),
            // QkNorm: RmsNorm over the [nt*nh, hd] view, weight of length hd.
            Op::QkNorm { .. } => no_kernel(),
            // MatMul: weight MatMulMeta.weight_name ([out][in], weight_type), Q8_0 activations,
            // bias added inline; output token-major [nt][out_dim].
            Op::MatMul { .. } => no_kernel(),
            // GetRows: rows of src[0] (or EmbedMeta's weight, dequantized) at i32 ids src[1].
            Op::GetRows => no_kernel(),
            // RoPE: src = [x, pos]; RoPEMeta; style; may run in place (out == in_bufs[0]).
            Op::RoPE { .. } => no_kernel(),
            // Attn: src = [q, kv_load, pos]; reads kv.k/kv.v rows 0..=pos[t]; AttnMeta.
            Op::Attn { .. } => no_kernel(),
            // KvcacheStore: src = [k, v, pos]; writes row pos[t] of kv.k and kv.v.
            Op::KvcacheStore { .. } => no_kernel(),
            Op::View { .. } | Op::Reshape { .. } | Op::Permute { .. } => no_kernel(),
            // Decode fusions are GPU kernels; the CPU never claims them (gating bug if reached).
            Op::BatchMatMul
            | Op::FusedQKV { .. }
            | Op::QkvBiasRopeStore { .. }
            | Op::FusedFFN
            | Op::FusedQkvNorm { .. } => no_kernel(),
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
