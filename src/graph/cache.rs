//! Graph reuse: the cached graph, its allocator and the params that built it.
//!
//! Reuse is decided on [`GraphParams`] alone — never by walking nodes — which is sound because
//! topology is a deterministic function of the params (the builder is pure, and `n_past` is
//! data). The allocator outlives rebuilds, so the persistent KV regions survive the
//! prefill → decode transition. [`GraphCache::verify_structural`] is the tripwire for a builder
//! that stops being deterministic.

use std::sync::atomic::{AtomicU64, Ordering};

use super::alloc::GraphAllocator;
use super::error::{GraphError, StructuralField};
use super::fusion::FusionPass;
use super::params::GraphParams;
use super::scheduler::{BackendScheduler, NodeObserver};
use super::{CNode, ComputeGraph};

/// Process-wide graph id counter: monotonic, from 1. A counter only; no behaviour reads it
/// except as a cache key.
static NEXT_GRAPH_UID: AtomicU64 = AtomicU64::new(1);

/// What [`GraphCache::prepare`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// Params matched: the cached graph and its buffers are used as they are.
    Reused { uid: u64 },
    /// A new graph was built, assigned, fused, planned and installed.
    Built { uid: u64, fused: usize },
}

/// The cached graph, the allocator (and so the KV regions), and the last params.
#[derive(Debug)]
pub struct GraphCache {
    graph: Option<ComputeGraph>,
    alloc: GraphAllocator,
    prev_params: Option<GraphParams>,
}

impl GraphCache {
    pub fn new(alloc: GraphAllocator) -> GraphCache {
        GraphCache {
            graph: None,
            alloc,
            prev_params: None,
        }
    }

    /// Params-only reuse check: `true` when a graph is cached and was built from equal params
    /// (every field, `cparams` in full — the fusion flags and `gpu` included).
    pub fn try_reuse(&mut self, params: &GraphParams) -> bool {
        match (&self.prev_params, &self.graph) {
            (Some(prev), Some(_)) if prev.same_topology(params) => {
                self.prev_params = Some(*params);
                true
            }
            _ => false,
        }
    }

    /// Installs a freshly built (and planned) graph with a new uid. The allocator stays.
    pub fn replace_graph(&mut self, mut graph: ComputeGraph, params: GraphParams) -> u64 {
        let uid = NEXT_GRAPH_UID.fetch_add(1, Ordering::Relaxed);
        graph.uid = uid;
        self.graph = Some(graph);
        self.prev_params = Some(params);
        uid
    }

    /// The whole reuse kernel: reuse on equal params, otherwise build → assign → fuse → plan →
    /// install. In debug builds a reuse also rebuilds and compares structurally, so a builder
    /// that stops being a function of `GraphParams` fails loudly there. A failed plan drops the cached graph too (its buffers were released), so the
    /// next call rebuilds instead of reusing a graph without buffers.
    pub fn prepare<F>(
        &mut self,
        params: &GraphParams,
        sched: &BackendScheduler,
        build: F,
    ) -> Result<Prepared, GraphError>
    where
        F: FnOnce(&GraphParams) -> Result<ComputeGraph, GraphError>,
    {
        if self.try_reuse(params)
            && let Some(cached) = &self.graph
        {
            // Debug builds check the reuse invariant itself: the skipped build must have
            // produced the same graph.
            if cfg!(debug_assertions) {
                let mut fresh = build(params)?;
                sched.assign_backends(&mut fresh, &self.alloc);
                FusionPass::new().run(&mut fresh, &self.alloc);
                structural_diff(cached, &fresh)?;
            }
            return Ok(Prepared::Reused { uid: cached.uid });
        }
        let mut graph = build(params)?;
        sched.assign_backends(&mut graph, &self.alloc);
        let fused = FusionPass::new().run(&mut graph, &self.alloc);
        if let Err(e) = self.alloc.alloc_graph(&graph) {
            self.invalidate();
            return Err(e);
        }
        let uid = self.replace_graph(graph, *params);
        Ok(Prepared::Built { uid, fused })
    }

    /// Runs `graph` once outside the cache (the K-shift graph): the cached graph is forgotten
    /// (the next `prepare` rebuilds it into the same arenas), `graph` is assigned, planned,
    /// filled by `fill` and executed, and its plan released.
    pub fn run_once(
        &mut self,
        mut graph: ComputeGraph,
        sched: &BackendScheduler,
        fill: impl FnOnce(&ComputeGraph, &mut GraphAllocator) -> Result<(), GraphError>,
    ) -> Result<(), GraphError> {
        self.invalidate();
        sched.assign_backends(&mut graph, &self.alloc);
        self.alloc.alloc_graph(&graph)?;
        let r = fill(&graph, &mut self.alloc).and_then(|()| sched.execute(&graph, &mut self.alloc));
        self.alloc.release();
        r
    }

    /// Forgets the cached graph and params (the allocator and its KV regions stay), so the next
    /// `prepare` rebuilds.
    pub fn invalidate(&mut self) {
        self.graph = None;
        self.prev_params = None;
        self.alloc.release();
    }

    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.graph.as_ref()
    }

    pub fn params(&self) -> Option<&GraphParams> {
        self.prev_params.as_ref()
    }

    pub fn alloc(&self) -> &GraphAllocator {
        &self.alloc
    }

    pub fn alloc_mut(&mut self) -> &mut GraphAllocator {
        &mut self.alloc
    }

    /// The cached graph with its allocator, borrowed together for execution.
    pub fn current(&mut self) -> Option<(&ComputeGraph, &mut GraphAllocator)> {
        self.graph.as_ref().map(|g| (g, &mut self.alloc))
    }

    /// Runs the cached graph (inputs filled beforehand).
    pub fn execute(&mut self, sched: &BackendScheduler) -> Result<(), GraphError> {
        match self.current() {
            Some((graph, alloc)) => sched.execute(graph, alloc),
            None => Ok(()),
        }
    }

    /// [`execute`](Self::execute) with an observer of every node's output
    /// ([`BackendScheduler::execute_observed`]).
    pub fn execute_observed(
        &mut self,
        sched: &BackendScheduler,
        observe: &mut NodeObserver,
    ) -> Result<(), GraphError> {
        match self.current() {
            Some((graph, alloc)) => sched.execute_observed(graph, alloc, observe),
            None => Ok(()),
        }
    }

    /// Compares `graph` with the cached one node by node — op with payload, sources, shape,
    /// dtype, layer and metadata — plus the input and output lists. Backends and uid are not
    /// compared (they are assigned after building). Build both sides from equal params: a
    /// difference means the builder is not a function of `GraphParams`, and reuse is unsound.
    pub fn verify_structural(&self, graph: &ComputeGraph) -> Result<(), GraphError> {
        let cached = self.graph.as_ref().ok_or(GraphError::StructuralMismatch {
            node: 0,
            field: StructuralField::NodeCount,
        })?;
        structural_diff(cached, graph)
    }
}

/// "Do two nodes agree on this field?"
type SameFn = fn(&CNode, &CNode) -> bool;

/// The first structural difference between two graphs (see
/// [`GraphCache::verify_structural`]).
pub fn structural_diff(a: &ComputeGraph, b: &ComputeGraph) -> Result<(), GraphError> {
    let mismatch = |node, field| Err(GraphError::StructuralMismatch { node, field });
    if a.nodes.len() != b.nodes.len() {
        return mismatch(a.nodes.len().min(b.nodes.len()), StructuralField::NodeCount);
    }
    let checks: [(StructuralField, SameFn); 6] = [
        (StructuralField::Op, |x, y| x.op == y.op),
        (StructuralField::Src, |x, y| x.src == y.src),
        (StructuralField::Shape, |x, y| x.out_shape == y.out_shape),
        (StructuralField::DType, |x, y| x.out_dtype == y.out_dtype),
        (StructuralField::Layer, |x, y| x.layer == y.layer),
        (StructuralField::Meta, |x, y| x.meta == y.meta),
    ];
    for (x, y) in a.nodes.iter().zip(&b.nodes) {
        if let Some((field, _)) = checks.iter().find(|(_, same)| !same(x, y)) {
            return mismatch(x.id, *field);
        }
    }
    if a.inputs != b.inputs {
        return mismatch(0, StructuralField::Inputs);
    }
    if a.outputs != b.outputs {
        return mismatch(0, StructuralField::Outputs);
    }
    Ok(())
}
