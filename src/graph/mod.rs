//! The compute graph: one forward pass as data.
//!
//! Pipeline: a model builds a [`ComputeGraph`] with [`GraphBuilder`] (pure, never computes) →
//! [`BackendScheduler::assign_backends`] gives every node a backend → [`FusionPass`] folds
//! `Mul(Silu(x), y)` into `SwiGLU` where the backend claims it → [`GraphAllocator::alloc_graph`]
//! places every live node in its backend's arena ([`planner`]: liveness in build order,
//! persistent per-layer KV) → [`BackendScheduler::execute`] hands each backend its splits in
//! build order. [`GraphCache`] keeps the
//! graph and the allocator between calls, so a decode step with equal [`GraphParams`] skips
//! everything but refilling the inputs.
//!
//! Invariants (breaking one is a bug):
//! 1. KV positions are data, not structure (KV ops carry only the layer).
//! 2. Topology is a deterministic function of `GraphParams`.
//! 3. Weights are referenced by handle ([`WeightId`]), not copied.
//! 4. The allocator is the single owner of buffers (arenas reserved once, KV regions); the
//!    scheduler never allocates.
//! 5. Execution follows build order, and so does liveness; [`ComputeGraph::topo_order`] only
//!    validates.
//! 6. Fusion never invents an op its backend did not claim.
//! 7. Errors are errors: no backend falls back to another mid-run.
//!
//! Shapes follow llama.cpp: activations are `[d, nt, 1, 1]` (feature fastest; memory is
//! token-major rows of `d`), weights carry GGUF `[in, out]` with memory `[out][in]` row-major.

pub mod alloc;
pub mod backend;
pub mod builder;
pub mod cache;
pub mod dot;
pub mod error;
pub mod fusion;
pub mod json;
pub mod ops;
pub mod params;
pub mod planner;
pub mod registry;
pub mod scheduler;
pub mod trace;
pub mod weights;

use std::collections::VecDeque;

pub use alloc::{ArenaNeed, GraphAllocator};
pub use backend::{BackendImpl, BufRef, BufferId, BufferUsage, KvPair, KvProvider, MemoryStats, NodeWork, OutOfMemory, SplitWork, TensorRef, attn_operands, operands};
pub use builder::{GraphBuilder, NodeSpec};
pub use cache::{GraphCache, Prepared};
pub use error::{GraphError, StructuralField};
pub use fusion::{FusionCaps, FusionPass};
pub use ops::{
    AttnMeta, EmbedMeta, FusedOp, KvShiftMeta, KvcacheMeta, MatMulMeta, NodeMeta, NormMeta, Op,
    OpKind, OpTraits, RoPEMeta, RopeStyle,
};
pub use crate::tensor::{DType, KvType, KvTypeError};
pub use params::{CParams, GraphOutput, GraphParams, GraphType};
pub use planner::{Layout, OffsetPlanner, Slot};
pub use registry::{Backend, BackendConfig, BackendEntry, BackendFence, BackendRegistry, Capabilities, DeviceInfo, Unavailable};
pub use scheduler::{BackendScheduler, NodeObserver, Split, split_graph};
pub use trace::{DEFAULT_TRACE_VALUES, NodeStats, NodeTrace, is_traced};
pub use weights::{WeightId, WeightStore, WeightView};

/// Index of a node in [`ComputeGraph::nodes`]; build order is id order.
pub type NodeId = usize;

/// A buffer that outlives graphs (the KV regions), named `kv.{layer}.k` / `kv.{layer}.v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentBuf {
    pub name: String,
    pub buf: BufRef,
    pub bytes: usize,
}

/// One compute node.
#[derive(Debug, Clone, PartialEq)]
pub struct CNode {
    pub id: NodeId,
    /// Readable, with the layer index: `"attn_norm-3"`.
    pub name: String,
    pub op: Op,
    /// Sources (the edges), all built before this node.
    pub src: Vec<NodeId>,
    /// `[d, nt, 1, 1]` for activations.
    pub out_shape: [usize; 4],
    pub out_dtype: DType,
    /// Transformer layer this node belongs to (`None`: embedding, head, inputs).
    pub layer: Option<usize>,
    /// Decided by the scheduler; `None` until then.
    pub backend: Option<Backend>,
    pub meta: NodeMeta,
}

impl CNode {
    /// Values in the output.
    pub fn n_elements(&self) -> usize {
        self.out_shape.iter().product()
    }

    pub fn is_input(&self) -> bool {
        self.op == Op::Input
    }

    /// The weights this node reads (matrix, bias, norm or embedding weight).
    pub fn weights(&self) -> Vec<WeightId> {
        match &self.meta {
            NodeMeta::MatMul(m) => std::iter::once(m.weight).chain(m.bias).collect(),
            NodeMeta::Norm(m) => m.weight.into_iter().collect(),
            NodeMeta::Embed(m) => vec![m.weight],
            _ => Vec::new(),
        }
    }

    /// The KV layer this node reads or writes: the op payload, or `AttnMeta.layer`.
    pub fn kv_layer(&self) -> Option<usize> {
        match (&self.op, &self.meta) {
            (Op::Attn { .. }, NodeMeta::Attn(m)) => Some(m.layer),
            (op, _) => op.kv_layer(),
        }
    }
}

/// A forward pass: nodes in build order (which is a topological order) plus the input and
/// output sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputeGraph {
    pub nodes: Vec<CNode>,
    /// Host-filled leaves.
    pub inputs: Vec<NodeId>,
    /// Values read back after execution (logits).
    pub outputs: Vec<NodeId>,
    /// Assigned by [`GraphCache::replace_graph`] (monotonic per process, from 1); a reused graph
    /// keeps it. `0` = never cached.
    pub uid: u64,
}

impl ComputeGraph {
    pub fn node(&self, id: NodeId) -> Option<&CNode> {
        self.nodes.get(id)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The input node called `name`.
    pub fn input_by_name(&self, name: &str) -> Option<&CNode> {
        self.inputs
            .iter()
            .filter_map(|&i| self.nodes.get(i))
            .find(|n| n.name == name)
    }

    /// Kahn sort over the edges. Validates: ids match indices, every source exists, no cycle.
    ///
    /// This is **not** the execution order: it may move source-less nodes (`kv_load`) ahead of
    /// nodes built before them, and liveness computed on that order lets a later node reuse an
    /// input the scheduler has not read yet (the G3 regression). Execution and liveness use
    /// build order; this is a validator.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        let n = self.nodes.len();
        let mut indegree = vec![0usize; n];
        let mut consumers: Vec<Vec<NodeId>> = vec![Vec::new(); n];
        for (index, node) in self.nodes.iter().enumerate() {
            if node.id != index {
                return Err(GraphError::IdMismatch { index, id: node.id });
            }
            for &s in &node.src {
                if s >= n {
                    return Err(GraphError::DanglingSrc {
                        node: node.name.clone(),
                        src: s,
                        n_nodes: n,
                    });
                }
                indegree[index] += 1;
                consumers[s].push(index);
            }
        }
        let mut ready: VecDeque<NodeId> = (0..n).filter(|&i| indegree[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop_front() {
            order.push(i);
            for &c in &consumers[i] {
                indegree[c] -= 1;
                if indegree[c] == 0 {
                    ready.push_back(c);
                }
            }
        }
        if order.len() != n {
            let node = (0..n).find(|&i| indegree[i] > 0).unwrap_or(0);
            let name = self
                .nodes
                .get(node)
                .map(|x| x.name.clone())
                .unwrap_or_default();
            return Err(GraphError::Cycle { node, name });
        }
        Ok(order)
    }

    /// Everything the executor relies on: [`topo_order`](Self::topo_order)'s checks, every source
    /// built before its consumer (execution follows build order), and the input/output lists
    /// naming real nodes.
    pub fn validate(&self) -> Result<(), GraphError> {
        self.topo_order()?;
        for node in &self.nodes {
            if let Some(&src) = node.src.iter().find(|&&s| s >= node.id) {
                return Err(GraphError::ForwardEdge {
                    node: node.name.clone(),
                    id: node.id,
                    src,
                });
            }
        }
        let n_nodes = self.nodes.len();
        match self
            .inputs
            .iter()
            .chain(&self.outputs)
            .find(|&&i| i >= n_nodes)
        {
            Some(&id) => Err(GraphError::DanglingId { id, n_nodes }),
            None => Ok(()),
        }
    }

    /// Which nodes do work: inputs, outputs, side-effect nodes (KV stores) and everything they
    /// read, transitively. A node the fusion pass orphaned (the `Silu` folded into `SwiGLU`) is
    /// dead: it gets no buffer and is never executed. Requires a validated graph.
    pub fn live_mask(&self) -> Vec<bool> {
        let n = self.nodes.len();
        let mut live = vec![false; n];
        for &o in self.outputs.iter().filter(|&&o| o < n) {
            live[o] = true;
        }
        for i in (0..n).rev() {
            let node = &self.nodes[i];
            if node.is_input() || node.op.has_side_effect() {
                live[i] = true;
            }
            if live[i] {
                for &s in node.src.iter().filter(|&&s| s < n) {
                    live[s] = true;
                }
            }
        }
        live
    }

    /// How many live nodes read each node (a source listed twice counts twice).
    pub fn consumer_counts(&self, live: &[bool]) -> Vec<usize> {
        let mut counts = vec![0usize; self.nodes.len()];
        for node in self
            .nodes
            .iter()
            .filter(|n| live.get(n.id).copied().unwrap_or(false))
        {
            for &s in &node.src {
                if let Some(c) = counts.get_mut(s) {
                    *c += 1;
                }
            }
        }
        counts
    }
}
