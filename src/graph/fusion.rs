//! The peephole fusion pass: local, capability-gated rewrites of an assigned graph.
//!
//! One rule: `Mul(Silu(x), y)` → `SwiGLU(x, y)`, with the `Silu` on either side, applied only
//! when the `Mul` node's backend claims [`FusedOp::SwiGLU`]. The rewrite keeps the `Mul`'s id,
//! name, shape and backend (its consumers need no edit) and re-points its sources; the orphaned
//! `Silu` stays in the node list as a dead node, which the allocator gives no buffer and the
//! scheduler skips. Removing it would renumber ids.
//!
//! The pass runs after assignment (gating needs "fused for whom?"), matches only decomposed ops
//! (so it is idempotent), and never changes shapes or the node count. Build-time decode fusions
//! (`FusedQKV`, `FusedFFN`) are the builder's business, not this pass's.

use super::alloc::GraphAllocator;
use super::ops::{FusedOp, Op};
use super::registry::Backend;
use super::{ComputeGraph, NodeId};

/// Answers "does this backend have this fused kernel?" for the pass.
pub trait FusionCaps {
    fn supports_fused(&self, backend: Backend, fused: FusedOp) -> bool;
}

impl FusionCaps for GraphAllocator {
    fn supports_fused(&self, backend: Backend, fused: FusedOp) -> bool {
        GraphAllocator::supports_fused(self, backend, fused)
    }
}

impl<F: Fn(Backend, FusedOp) -> bool> FusionCaps for F {
    fn supports_fused(&self, backend: Backend, fused: FusedOp) -> bool {
        self(backend, fused)
    }
}

/// The fusion pass (stateless).
#[derive(Debug, Clone, Copy, Default)]
pub struct FusionPass;

impl FusionPass {
    pub fn new() -> FusionPass {
        FusionPass
    }

    /// Runs every rule; returns the number of nodes rewritten.
    pub fn run(&self, graph: &mut ComputeGraph, caps: &impl FusionCaps) -> usize {
        self.fuse_swiglu(graph, caps)
    }

    /// `Mul(Silu(x), y)` / `Mul(y, Silu(x))` → `SwiGLU(x, y)`, gated on the Mul's backend.
    /// Matches are collected on the unmodified graph, then applied.
    fn fuse_swiglu(&self, graph: &mut ComputeGraph, caps: &impl FusionCaps) -> usize {
        let silu_input = |id: NodeId| -> Option<NodeId> {
            let node = graph.nodes.get(id)?;
            match (&node.op, node.src.as_slice()) {
                (Op::Silu, [x]) => Some(*x),
                _ => None,
            }
        };
        let rewrites: Vec<(NodeId, [NodeId; 2])> = graph
            .nodes
            .iter()
            .filter_map(|mul| {
                let (Op::Mul, &[a, b]) = (&mul.op, mul.src.as_slice()) else {
                    return None;
                };
                let claimed = mul
                    .backend
                    .is_some_and(|be| caps.supports_fused(be, FusedOp::SwiGLU));
                if !claimed {
                    return None; // unassigned, or the backend has no fused kernel
                }
                match (silu_input(a), silu_input(b)) {
                    (Some(gate), _) => Some((mul.id, [gate, b])),
                    (None, Some(gate)) => Some((mul.id, [gate, a])),
                    (None, None) => None,
                }
            })
            .collect();
        for &(id, [gate, up]) in &rewrites {
            let node = &mut graph.nodes[id];
            node.op = Op::SwiGLU;
            node.src = vec![gate, up];
        }
        rewrites.len()
    }
}
