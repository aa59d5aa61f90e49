//! The scheduler: backend assignment, splits, and execution in build order.
//!
//! It is a pure orchestrator: it reads capabilities from the allocator, cuts the graph into
//! splits (maximal runs of consecutive nodes on one backend), stages cross-backend sources at
//! split boundaries through the backends' copy calls, and hands each backend a whole split
//! ([`BackendImpl::compute`](super::BackendImpl::compute)). It never allocates and never falls
//! back: a node whose buffer is on another backend than its split is an error naming the node
//! and both backends (raised when the plan is made).
//!
//! An observer (the trace recorder, node dumps) sees every executed node's output right after
//! it ran: the split then runs one node at a time, each read back through the backend's
//! `get_tensor` after a `synchronize` — slower, and the same on every backend.
//!
//! `MINFER_GRAPH_TRACE=1` prints the splits and a per-op / per-backend census to stderr.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::alloc::GraphAllocator;
use super::backend::KvProvider;
use super::error::GraphError;
use super::registry::Backend;
use super::{CNode, ComputeGraph, NodeId};

/// Sees each executed node's output as 4-byte words ([`GraphAllocator::node_words`]):
/// [`BackendScheduler::execute_observed`].
pub type NodeObserver<'a> = dyn FnMut(&CNode, &[f32]) + 'a;

/// Environment variable that turns the execution trace on (`1`).
pub const TRACE_ENV: &str = "MINFER_GRAPH_TRACE";

/// A maximal run of consecutive nodes on one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub backend: Backend,
    /// `[start, end)` in `graph.nodes`.
    pub node_range: (usize, usize),
    /// Sources produced on another backend, staged in at the split's start (first-use order).
    pub inputs: Vec<NodeId>,
    /// Nodes of this split read by a node on another backend.
    pub outputs: Vec<NodeId>,
}

/// Assigns, splits and executes graphs.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendScheduler {
    trace: bool,
}

impl BackendScheduler {
    /// Tracing follows `MINFER_GRAPH_TRACE=1`.
    pub fn new() -> BackendScheduler {
        BackendScheduler {
            trace: std::env::var(TRACE_ENV).is_ok_and(|v| v == "1"),
        }
    }

    pub fn with_trace(trace: bool) -> BackendScheduler {
        BackendScheduler { trace }
    }

    /// Gives every unassigned node the highest-priority fenced backend with a pool that claims
    /// it (the whole node: op, dtype, weight type, KV type, head size), the CPU last.
    /// Assignment is total: a node nobody claims lands on the CPU, whose `compute` then refuses
    /// it by name — never a silent fallback at run time. Explicit assignments are kept. Each
    /// node is decided on its own, in priority order from the registry.
    ///
    /// A layer's KV regions and everything that reads or writes them share a backend (the
    /// design's scheduler policy 1): a node with a KV layer (store, load, shift, attention)
    /// goes where that layer's regions live, or, before they exist, where the layer's first
    /// KV node of this graph went.
    pub fn assign_backends(&self, graph: &mut ComputeGraph, alloc: &GraphAllocator) {
        let mut kv_home: BTreeMap<usize, Backend> = BTreeMap::new();
        for node in graph.nodes.iter_mut() {
            let layer = node.kv_layer();
            if node.backend.is_none() {
                let home = layer.and_then(|l| alloc.kv_pair(l).map(|p| p.k.backend()).or_else(|| kv_home.get(&l).copied()));
                node.backend = Some(home.or_else(|| alloc.supports_for(node)).unwrap_or(Backend::CPU));
            }
            if let (Some(l), Some(b)) = (layer, node.backend) {
                kv_home.entry(l).or_insert(b);
            }
        }
    }

    /// Cuts the graph into splits wherever the assigned backend changes ([`split_graph`]).
    pub fn split_graph(&self, graph: &ComputeGraph) -> Result<Vec<Split>, GraphError> {
        split_graph(graph)
    }

    /// Executes the planned graph split by split in build order: stage the split's
    /// cross-backend inputs, hand the backend the split, synchronize.
    pub fn execute(&self, graph: &ComputeGraph, alloc: &mut GraphAllocator) -> Result<(), GraphError> {
        self.run(graph, alloc, None)
    }

    /// [`execute`](Self::execute), handing each executed node's output to `observe` right
    /// after the node ran (before a later node can reuse its region).
    pub fn execute_observed(
        &self,
        graph: &ComputeGraph,
        alloc: &mut GraphAllocator,
        observe: &mut NodeObserver,
    ) -> Result<(), GraphError> {
        self.run(graph, alloc, Some(observe))
    }

    fn run(&self, graph: &ComputeGraph, alloc: &mut GraphAllocator, mut observe: Option<&mut NodeObserver>) -> Result<(), GraphError> {
        alloc.check_plan(graph)?;
        if self.trace {
            eprint!("{}", trace_report(graph, alloc.splits(), alloc));
        }
        for index in 0..alloc.splits().len() {
            let split = alloc.splits()[index].clone();
            for &src in &split.inputs {
                if alloc.node_tensor(src).is_some() {
                    alloc.copy_across(src, split.backend)?;
                }
            }
            match observe.as_mut() {
                None => alloc.compute_split(graph, index, None)?,
                Some(f) => {
                    for item in 0..alloc.split_len(index) {
                        alloc.compute_split(graph, index, Some(item..item + 1))?;
                        let Some(id) = alloc.split_node(index, item) else { continue };
                        let words = alloc.node_words(id)?;
                        f(&graph.nodes[id], &words);
                    }
                }
            }
            alloc.synchronize(split.backend)?;
        }
        Ok(())
    }
}

/// Cuts the graph into splits wherever the backend of a live node changes, and derives the
/// cross-backend edges between live nodes. A dead node (orphaned by fusion: it gets no buffer
/// and never runs) joins the split it stands in, so it neither cuts a split nor asks for a copy.
pub fn split_graph(graph: &ComputeGraph) -> Result<Vec<Split>, GraphError> {
    split_live_graph(graph, &graph.live_mask())
}

/// [`split_graph`] with the graph's live mask already at hand (the planner's).
pub(super) fn split_live_graph(graph: &ComputeGraph, live: &[bool]) -> Result<Vec<Split>, GraphError> {
    let backend_of = |node: &CNode| node.backend.ok_or_else(|| GraphError::Unassigned { node: node.name.clone() });
    let mut splits: Vec<Split> = Vec::new();
    let mut split_of = vec![0usize; graph.nodes.len()];
    for node in &graph.nodes {
        if !live[node.id]
            && let Some(s) = splits.last_mut()
        {
            s.node_range.1 = node.id + 1;
            split_of[node.id] = splits.len() - 1;
            continue;
        }
        let backend = backend_of(node)?;
        match splits.last_mut() {
            Some(s) if s.backend == backend => s.node_range.1 = node.id + 1,
            _ => splits.push(Split { backend, node_range: (node.id, node.id + 1), inputs: Vec::new(), outputs: Vec::new() }),
        }
        split_of[node.id] = splits.len() - 1;
    }
    for node in graph.nodes.iter().filter(|n| live[n.id]) {
        let here = split_of[node.id];
        for &src in &node.src {
            let producer = graph.nodes.get(src).ok_or_else(|| GraphError::DanglingSrc {
                node: node.name.clone(),
                src,
                n_nodes: graph.nodes.len(),
            })?;
            if backend_of(producer)? == splits[here].backend {
                continue;
            }
            if !splits[here].inputs.contains(&src) {
                splits[here].inputs.push(src);
            }
            let there = &mut splits[split_of[src]];
            if !there.outputs.contains(&src) {
                there.outputs.push(src);
            }
        }
    }
    Ok(splits)
}

/// The trace text: one line per split, then the census of live nodes per (op, backend) and the
/// number of dead nodes.
pub fn trace_report(graph: &ComputeGraph, splits: &[Split], alloc: &GraphAllocator) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "graph uid={}: {} nodes, {} splits",
        graph.uid,
        graph.nodes.len(),
        splits.len()
    );
    for (i, s) in splits.iter().enumerate() {
        let _ = writeln!(
            out,
            "  split {i}: {} nodes [{}, {}) inputs {:?} outputs {:?}",
            s.backend, s.node_range.0, s.node_range.1, s.inputs, s.outputs
        );
    }
    let mut census: BTreeMap<(&'static str, Backend), usize> = BTreeMap::new();
    let mut dead = 0usize;
    for node in &graph.nodes {
        match (
            node.is_input() || alloc.node_tensor(node.id).is_some(),
            node.backend,
        ) {
            (true, Some(b)) => *census.entry((node.op.name(), b)).or_default() += 1,
            _ => dead += 1,
        }
    }
    for b in alloc.backends() {
        let _ = writeln!(out, "  arena {b}: {} bytes used of {} reserved", alloc.arena_used(b), alloc.arena_bytes(b));
    }
    let _ = writeln!(out, "  census:");
    for ((op, backend), count) in &census {
        let _ = writeln!(out, "    op {op:<20} backend {backend:<6} x{count}");
    }
    let _ = writeln!(out, "    dead (skipped) x{dead}");
    out
}
