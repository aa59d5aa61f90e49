//! The backend contract: what the scheduler and the allocator may ask of an execution engine
//! (after ggml's `ggml-backend-impl.h`).
//!
//! A backend owns **typed byte buffers** it allocates on request ([`BackendImpl::alloc_buffer`],
//! fallible: [`OutOfMemory`] names the backend and the bytes asked). It never decides what lives
//! where: the [`GraphAllocator`](super::GraphAllocator) reserves one compute arena per backend
//! plus the persistent KV regions, and places every node at an offset inside them
//! ([`TensorRef`]). The host reaches a backend's memory only through [`set_tensor`] /
//! [`get_tensor`] (a device backend may queue them until [`synchronize`]); nothing here hands
//! out a borrowed view, so a backend without host-visible memory is a first-class citizen.
//!
//! Work arrives a **split** at a time ([`BackendImpl::compute`]): a run of consecutive nodes,
//! each with its resolved output, operands and KV pair, so a GPU backend can encode one command
//! buffer or replay one captured graph per split. A backend that cannot execute a node returns
//! `Err` — it never falls back to another backend.
//!
//! Required: the capability queries, memory (`alloc_buffer`, `free_buffer`, `buffer_size`,
//! `memory`), transfers (`set_tensor`, `get_tensor`, `copy_tensor`), `load_weights`, `compute`.
//! Optional (default methods): `alignment` (64 bytes), `copy_from` (a direct device-to-device
//! path; the default says there is none and the scheduler stages through the host),
//! `prepare_decode_matrices` (a second layout of the matrices decode multiplies; none by
//! default) and `synchronize` (nothing queued).
//!
//! [`set_tensor`]: BackendImpl::set_tensor
//! [`get_tensor`]: BackendImpl::get_tensor
//! [`synchronize`]: BackendImpl::synchronize

use std::ops::Range;
use std::sync::Arc;

use super::error::GraphError;
use super::ops::FusedOp;
use super::registry::Backend;
use super::weights::{WeightId, WeightStore};
use super::{CNode, ComputeGraph, DType, NodeId};

/// A buffer's handle inside its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl BufferId {
    /// Puts `value` into the first free slot of a backend's buffer table (or a new one at the
    /// end) and returns its id.
    pub fn insert<T>(slots: &mut Vec<Option<T>>, value: T) -> BufferId {
        let i = match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(value);
                i
            }
            None => {
                slots.push(Some(value));
                slots.len() - 1
            }
        };
        BufferId(i as u32)
    }
}

/// A buffer: a handle inside one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufRef {
    pub backend: Backend,
    pub id: BufferId,
}

/// A typed region of a buffer: `bytes` bytes from byte `offset`, holding `dtype` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorRef {
    pub buf: BufRef,
    pub offset: usize,
    pub bytes: usize,
    pub dtype: DType,
}

impl TensorRef {
    /// The byte range inside the buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.bytes
    }

    pub fn backend(&self) -> Backend {
        self.buf.backend
    }

    /// Do the two regions share a byte?
    pub fn overlaps(&self, other: &TensorRef) -> bool {
        self.buf == other.buf && self.offset < other.offset + other.bytes && other.offset < self.offset + self.bytes
    }

    /// The sub-region `offset..offset + bytes` of this one (same dtype).
    pub fn slice(&self, offset: usize, bytes: usize) -> Option<TensorRef> {
        (offset.checked_add(bytes)? <= self.bytes).then_some(TensorRef { offset: self.offset + offset, bytes, ..*self })
    }
}

/// What a buffer is for (a backend may place them differently: device memory, host-pinned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferUsage {
    /// The compute arena of the graph's nodes.
    Compute,
    /// A persistent KV region.
    Kv,
    /// A model's weights (a backend that uploads its own copies).
    Weights,
}

impl BufferUsage {
    /// For messages: "the compute arena", "a KV region".
    pub const fn what(self) -> &'static str {
        match self {
            BufferUsage::Compute => "the compute arena",
            BufferUsage::Kv => "a KV region",
            BufferUsage::Weights => "the model's weights",
        }
    }
}

/// A backend could not allocate: which backend, how many bytes were asked, how many it holds
/// and, when it has one, its cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{backend}: out of memory allocating {requested} bytes for {} ({in_use} bytes in use{})", .usage.what(), match .capacity { Some(c) => format!(", cap {c} bytes"), None => String::new() })]
pub struct OutOfMemory {
    pub backend: Backend,
    pub requested: usize,
    pub usage: BufferUsage,
    pub in_use: usize,
    pub capacity: Option<usize>,
}

/// A backend's own allocation counters (tests read them: "nothing allocated after the
/// reserve" is measured here, not derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Buffers allocated since creation.
    pub allocations: u64,
    /// Buffers freed since creation.
    pub frees: u64,
    /// Bytes held now.
    pub bytes_in_use: usize,
    /// The most bytes held at once.
    pub peak_bytes: usize,
    /// The cap, where the backend has one.
    pub capacity: Option<usize>,
    /// Bytes of weight copies the backend holds (not in `bytes_in_use`; 0 for a backend that
    /// reads the model's memory map).
    pub weight_bytes: usize,
}

/// A layer's persistent KV regions: K and V, each `n_ctx` rows of the KV type, on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPair {
    pub k: TensorRef,
    pub v: TensorRef,
}

/// The only way an executor reaches the persistent KV regions (the V half has no node at all).
pub trait KvProvider {
    fn kv_pair(&self, layer: usize) -> Option<KvPair>;
}

/// One node of a split, resolved: where its output goes, where each source is (on this
/// backend: cross-backend sources were staged in), and the layer's KV pair for KV and
/// attention nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWork {
    pub node: NodeId,
    pub out: TensorRef,
    /// `srcs[i]` holds `node.src[i]`.
    pub srcs: Vec<TensorRef>,
    pub kv: Option<KvPair>,
}

/// A node's `N` operands (regions, addresses...) as an array, or the count error naming it.
pub fn operands<const N: usize, T: Copy>(node: &CNode, srcs: &[T]) -> Result<[T; N], GraphError> {
    <[T; N]>::try_from(srcs).map_err(|_| GraphError::OperandCount { node: node.name.clone(), expected: N, got: srcs.len() })
}

/// An attention node's operands: `[q, kv, pos]`, or `[q, kv, pos, cells]` over regions
/// several sequences share.
pub fn attn_operands<T: Copy>(node: &CNode, srcs: &[T]) -> Result<(T, T, T, Option<T>), GraphError> {
    match *srcs {
        [q, kv, pos] => Ok((q, kv, pos, None)),
        [q, kv, pos, cells] => Ok((q, kv, pos, Some(cells))),
        _ => Err(GraphError::OperandCount { node: node.name.clone(), expected: 4, got: srcs.len() }),
    }
}

/// The work of one split: its graph (for the nodes' ops and metadata) and its nodes in build
/// order. Inputs and dead nodes are not listed.
#[derive(Debug, Clone, Copy)]
pub struct SplitWork<'a> {
    pub graph: &'a ComputeGraph,
    pub backend: Backend,
    pub nodes: &'a [NodeWork],
}

impl SplitWork<'_> {
    /// The node a work item runs.
    pub fn node(&self, w: &NodeWork) -> Result<&CNode, GraphError> {
        self.graph.nodes.get(w.node).ok_or(GraphError::NoBuffer { node: w.node })
    }
}

/// One execution engine (CPU, CUDA, Metal, or a test backend). Its identity, name and priority
/// live in the registry under its [`Backend`] handle.
pub trait BackendImpl: Send {
    /// Can this backend execute `node` (its op, output dtype, weight type, KV type, head
    /// size...)? Drives backend assignment: claim only what the kernels do.
    fn supports_node(&self, node: &CNode) -> bool;
    /// Does this backend have a kernel for the fused form? Gates the fusion pass.
    fn supports_fused(&self, fused: FusedOp) -> bool;

    /// Offsets inside a buffer are multiples of this (bytes, a power of two).
    fn alignment(&self) -> usize {
        64
    }
    /// A new zero-filled buffer of `bytes` bytes.
    fn alloc_buffer(&mut self, bytes: usize, usage: BufferUsage) -> Result<BufferId, OutOfMemory>;
    /// Releases buffer `id` (unknown ids are ignored).
    fn free_buffer(&mut self, id: BufferId);
    /// Bytes of buffer `id`, `None` if it does not exist.
    fn buffer_size(&self, id: BufferId) -> Option<usize>;
    /// The allocation counters.
    fn memory(&self) -> MemoryStats;

    /// Writes `data` at byte `offset` of tensor `dst` (within its region).
    fn set_tensor(&mut self, dst: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError>;
    /// Reads `out.len()` bytes from byte `offset` of tensor `src` (within its region).
    fn get_tensor(&mut self, src: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError>;
    /// Copies `src` onto `dst` (equal sizes, both on this backend; they may overlap, as
    /// `memmove`).
    fn copy_tensor(&mut self, src: TensorRef, dst: TensorRef) -> Result<(), GraphError>;
    /// Copies `src` of another backend onto `dst` of this one by a direct path. `Ok(false)`:
    /// no direct path (the default); the scheduler then stages through the host.
    fn copy_from(&mut self, _dst: TensorRef, _src_backend: &mut dyn BackendImpl, _src: TensorRef) -> Result<bool, GraphError> {
        Ok(false)
    }

    /// Offered at load: the weights this backend's nodes use. It may keep the store's mapped
    /// bytes (zero-copy) or upload its own copies; a node naming a weight it was not offered
    /// is an error at execution.
    fn load_weights(&mut self, store: &Arc<WeightStore>, ids: &[WeightId]) -> Result<(), GraphError>;
    /// Optional, offered after [`load_weights`](Self::load_weights): the weights this backend
    /// multiplies one token by (the matrix operand of the decode graph's products). A backend
    /// may keep a second layout of them that its one-token kernels read faster (the CPU's
    /// repacked Q4_K), shared through [`WeightStore::prepared`]; the default keeps none.
    fn prepare_decode_matrices(&mut self, _store: &Arc<WeightStore>, _ids: &[WeightId]) -> Result<(), GraphError> {
        Ok(())
    }

    /// Runs one split's nodes in order.
    fn compute(&mut self, split: &SplitWork) -> Result<(), GraphError>;

    /// Waits for queued work and transfers. Called at every split boundary and before the
    /// host reads results. Default: nothing is queued.
    fn synchronize(&mut self) -> Result<(), GraphError> {
        Ok(())
    }
}
