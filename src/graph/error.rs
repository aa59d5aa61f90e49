//! The graph layer's one error type.
//!
//! Every variant is structured: it names the node, the op, the backends or the sizes involved, so
//! a failure can be matched on in tests and read by a person without a debugger. There is no
//! `String`-payload catch-all on purpose: a new failure mode gets a new variant.

use super::backend::{BufferId, OutOfMemory};
use super::ops::Op;
use super::registry::Backend;
use super::{DType, NodeId};
use crate::quants::QuantError;

/// Which part of two graphs differed in a structural comparison
/// ([`GraphCache::verify_structural`](super::cache::GraphCache::verify_structural)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StructuralField {
    NodeCount,
    Op,
    Src,
    Shape,
    DType,
    Meta,
    Layer,
    Inputs,
    Outputs,
}

/// Errors of graph construction, validation, backend selection, allocation and execution.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    // ---- validation -------------------------------------------------------------------------
    /// `topo_order` found nodes that can never become ready.
    #[error("graph has a cycle through node {node} '{name}'")]
    Cycle { node: NodeId, name: String },
    /// A node names a source id that is not in the graph.
    #[error("node '{node}' reads source id {src}, but the graph has only {n_nodes} nodes")]
    DanglingSrc {
        node: String,
        src: NodeId,
        n_nodes: usize,
    },
    /// An id passed to the builder, or listed as an input/output, that is not in the graph.
    #[error("node id {id} does not exist (the graph has {n_nodes} nodes)")]
    DanglingId { id: NodeId, n_nodes: usize },
    /// `nodes[i].id != i`.
    #[error("node at index {index} carries id {id}")]
    IdMismatch { index: usize, id: NodeId },
    /// A source that comes after its consumer in build order: execution follows build order, so
    /// the consumer would read a value that has not been computed yet.
    #[error("node '{node}' (id {id}) reads node {src}, which is built after it")]
    ForwardEdge {
        node: String,
        id: NodeId,
        src: NodeId,
    },
    /// Two graphs from equal params differ (the reuse tripwire).
    #[error("graphs differ structurally at node {node}: {field:?}")]
    StructuralMismatch {
        node: NodeId,
        field: StructuralField,
    },

    // ---- building ---------------------------------------------------------------------------
    /// A dimension that does not fit the operation (weight in-dim vs input features, ...).
    #[error("node '{node}': {what}: expected {expected}, got {got}")]
    DimMismatch {
        node: String,
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// Two operands of an element-wise op with different shapes.
    #[error("node '{node}': operand shapes differ: {left:?} vs {right:?}")]
    ShapeMismatch {
        node: String,
        left: [usize; 4],
        right: [usize; 4],
    },
    /// A weight the graph names is not in the model file (or has the wrong rank).
    #[error("weight '{name}' is missing: expected {what}")]
    MissingWeight { name: String, what: &'static str },
    /// A weight whose type cannot be computed with.
    #[error("weight '{name}': {source}")]
    Weight { name: String, source: QuantError },
    /// A weight whose bytes cannot be read from the file.
    #[error("weight '{name}' cannot be read: {reason}")]
    WeightFile { name: String, reason: String },
    /// A weight stored in a type minfer cannot compute with.
    #[error("node '{node}': {source}")]
    UnsupportedWeight {
        node: String,
        #[source]
        source: QuantError,
    },
    /// A weight whose rank does not fit its use (a matmul weight needs `[in, out]`).
    #[error("tensor '{tensor}' has dims {dims:?}; {what}")]
    WeightRank {
        tensor: String,
        dims: Vec<u64>,
        what: &'static str,
    },
    /// An attention node whose `kv` source is not the layer's `KvcacheLoad`.
    #[error("node '{node}': kv source '{kv}' is not a kv_load of layer {layer}")]
    AttnKvSource {
        node: String,
        kv: String,
        layer: usize,
    },
    /// A node that needs metadata of a kind it does not carry.
    #[error("node '{node}' ({op:?}) lacks its {expected} metadata")]
    MissingMeta {
        node: String,
        op: Op,
        expected: &'static str,
    },

    // ---- backend registry and fence ---------------------------------------------------------
    /// A name in `--backend` / `MINFER_BACKENDS` that no backend answers to.
    #[error("unknown backend '{name}' (known: {known})")]
    UnknownBackend { name: String, known: String },
    /// A known backend this binary was built without.
    #[error("backend '{name}' is not compiled into this build")]
    BackendNotCompiled { name: String },
    /// A compiled-in backend that cannot run on this machine (no device, disabled driver, ...).
    #[error("backend '{name}' is not usable on this machine: {reason}")]
    BackendUnusable { name: String, reason: String },
    /// A fence spec that names no backend at all.
    #[error("backend list '{spec}' names no backend")]
    EmptyFence { spec: String },
    /// A handle the registry does not know.
    #[error("backend {backend} is not in the registry")]
    UnregisteredBackend { backend: Backend },
    /// The allocator has no pool for a backend a node was assigned to.
    #[error("the allocator has no buffer pool for backend {backend}")]
    NoPool { backend: Backend },
    /// Replacing a pool that still holds graph buffers or KV regions.
    #[error("backend {backend}'s pool is in use and cannot be replaced")]
    PoolInUse { backend: Backend },

    // ---- allocation and host I/O ------------------------------------------------------------
    /// A live node without a backend: assignment must run before allocation.
    #[error("node '{node}' has no backend assigned")]
    Unassigned { node: String },
    /// `fill_input*` with a name that is not an input of the graph.
    #[error("graph has no input named '{name}'")]
    NoSuchInput { name: String },
    /// `fill_input*` with the wrong number of values.
    #[error("input '{name}' holds {expected} values, got {got}")]
    InputLength {
        name: String,
        expected: usize,
        got: usize,
    },
    /// `fill_input` on an I32 input or `fill_input_i32` on an F32 one.
    #[error("input '{name}' has dtype {actual:?}, not {requested:?}")]
    InputDType {
        name: String,
        actual: DType,
        requested: DType,
    },
    /// A node that has no buffer (dead, or not allocated yet).
    #[error("node {node} has no buffer")]
    NoBuffer { node: NodeId },
    /// A buffer id that is not in the backend's pool.
    #[error("backend {backend} has no buffer {}", .id.0)]
    BadBufferId { backend: Backend, id: BufferId },
    /// A read, write or copy outside the region (or buffer) it names.
    #[error("backend {backend}: bytes {offset}..+{bytes} are outside a region of {size} bytes")]
    TensorRange {
        backend: Backend,
        offset: usize,
        bytes: usize,
        size: usize,
    },
    /// A region of another element type than the call needs.
    #[error("{what} needs an f32 region, this one holds {}", .dtype.name())]
    TensorDType { what: &'static str, dtype: DType },
    /// A backend could not allocate.
    #[error(transparent)]
    OutOfMemory(#[from] OutOfMemory),
    /// A KV region that exists with a different size than the graph now asks for.
    #[error("layer {layer} KV region holds {have} bytes, the graph asks for {want}")]
    KvRegionSize {
        layer: usize,
        have: usize,
        want: usize,
    },
    /// A KV region used from a backend other than the one that holds it.
    #[error("node '{node}' runs on {node_backend} but layer {layer}'s KV lives on {kv_backend}")]
    KvBackendMismatch {
        node: String,
        layer: usize,
        node_backend: Backend,
        kv_backend: Backend,
    },
    /// A node that needs its layer's KV pair before any store created it.
    #[error("node '{node}' needs layer {layer}'s KV regions, which do not exist")]
    KvMissing { node: String, layer: usize },

    /// Executing a graph the allocator has no plan for (never planned, or a failed plan).
    #[error("graph of {nodes} nodes executed against an allocator plan of {planned} nodes")]
    NotPlanned { nodes: usize, planned: usize },
    /// Execution asked for before any graph was prepared.
    #[error("no graph has been prepared")]
    NoGraph,

    // ---- execution --------------------------------------------------------------------------
    /// The backend has no kernel for this op (yet). Never a fallback: the run aborts.
    #[error("node '{node}': no kernel for {op:?}")]
    NoKernel { node: String, op: Op },
    /// A kernel refused its operands (shapes, ids, positions out of range, a weight type).
    #[error("node '{node}': {source}")]
    Kernel {
        node: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A node naming a weight its backend was not offered at load.
    #[error("node '{node}' uses weight '{weight}', which backend {backend} was not given")]
    WeightNotLoaded { node: String, weight: String, backend: Backend },
    /// A node needs metadata of another kind (a builder bug, reported rather than guessed).
    #[error("node '{node}' carries {found} metadata, expected {expected}")]
    WrongMeta { node: String, expected: &'static str, found: &'static str },
    /// A KV store whose operands share a buffer with the KV regions it writes.
    #[error("node '{node}': an operand aliases the layer's KV region")]
    KvAliased { node: String },
    /// A kernel that needs the model's weights or workers ran on a bare pool.
    #[error("node '{node}' needs {what}, which this CPU pool was not given")]
    NoModel { node: String, what: &'static str },
    /// A node whose buffer lives on another backend than the split executing it.
    #[error("node '{node}' runs in a {split} split but its buffer lives on {buffer}")]
    BackendMismatch {
        node: String,
        split: Backend,
        buffer: Backend,
    },
    /// A node dispatched with the wrong number of operands.
    #[error("node '{node}': {got} operands, the kernel takes {expected}")]
    OperandCount {
        node: String,
        expected: usize,
        got: usize,
    },
    /// A kernel operand whose length does not match the node's output.
    #[error("node '{node}': operand {operand} has {got} values, expected {expected}")]
    OperandLength {
        node: String,
        operand: usize,
        expected: usize,
        got: usize,
    },
}
