//! The backend contract: what the scheduler and the allocator may ask of an execution engine.
//!
//! A backend owns a pool of f32 buffers addressed by id and executes one node at a time. It
//! never allocates on its own behalf: the [`GraphAllocator`](super::GraphAllocator) decides every
//! buffer (liveness, in-place aliasing, KV regions) and the scheduler passes the ids in. A backend
//! that cannot execute a node returns `Err` — it never falls back to another backend.
//!
//! Required: capability queries, the pool (`alloc_buffer`, `free_buffer`, `alloc_fresh`,
//! `pool_len`, `buffer_len`), `execute_node`, `read_host`, `write_host`.
//! Optional (default methods): `copy_to_host` (defaults to cloning `read_host`; a device whose
//! memory cannot be borrowed overrides it) and `synchronize` (defaults to a no-op; a GPU
//! backend submits/waits its queue there, once per split).

use super::error::GraphError;
use super::ops::{FusedOp, Op};
use super::{BufRef, CNode, DType};

/// A layer's persistent KV regions: K and V, each `[n_embd_kv, n_ctx]` f32 token-major, on one
/// backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPair {
    pub k: BufRef,
    pub v: BufRef,
}

/// The only way an executor reaches the persistent KV regions (the V half has no node at all).
pub trait KvProvider {
    fn kv_pair(&self, layer: usize) -> Option<KvPair>;
}

/// One execution engine (CPU, Metal, CUDA, or a test mock). Its identity, name and priority
/// live in the registry under its [`Backend`](super::Backend) handle, not here.
pub trait BackendImpl: Send {
    /// Can this backend execute `op` producing `dtype`? Drives backend assignment.
    fn supports_op(&self, op: &Op, dtype: DType) -> bool;
    /// Does this backend have a kernel for the fused form? Gates the fusion pass.
    fn supports_fused(&self, fused: FusedOp) -> bool;

    /// A zero-filled buffer of `len` f32 values, recycled from the free list when one of exactly
    /// that length is free.
    fn alloc_buffer(&mut self, len: usize) -> usize;
    /// Returns `id` to the free list (the memory stays in the pool).
    fn free_buffer(&mut self, id: usize);
    /// A new buffer that bypasses the free list: for split-boundary staging and persistent
    /// regions, which must not alias anything the current plan still uses.
    fn alloc_fresh(&mut self, len: usize) -> usize;
    /// Buffers ever created (did the pool grow?).
    fn pool_len(&self) -> usize;
    /// Length (f32 values) of buffer `id`.
    fn buffer_len(&self, id: usize) -> Option<usize>;

    /// Runs one node. `in_bufs[i]` holds `node.src[i]` (on this backend: the scheduler staged
    /// cross-backend sources), `out_buf` is the node's output (possibly the same buffer as
    /// `in_bufs[0]` for an in-place op), `kv` is the layer's pair for KV and attention nodes.
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv: Option<KvPair>,
    ) -> Result<(), GraphError>;

    /// A borrowed host view of buffer `id`, where the memory is host-visible.
    fn read_host(&self, id: usize) -> Option<&[f32]>;
    /// Overwrites buffer `id`; `data` must match its length exactly.
    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), GraphError>;

    /// A host copy of buffer `id`. Default: clone of [`read_host`](Self::read_host), `None`
    /// when the buffer does not exist or is not host-visible.
    fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
        self.read_host(id).map(<[f32]>::to_vec)
    }

    /// Waits for queued work. Called at every split boundary. Default: nothing is queued.
    fn synchronize(&mut self) -> Result<(), GraphError> {
        Ok(())
    }
}
