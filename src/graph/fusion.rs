//! The peephole fusion pass: local, capability-gated rewrites of an assigned graph.
//!
//! The rules are gated linear units: `Mul(Silu(x), y)` → `SwiGLU(x, y)` and `Mul(Gelu(x), y)` →
//! `GeGLU(x, y)`, with the activation on either side, applied only when the `Mul` node's
//! backend claims the [`FusedOp`]. The rewrite keeps the `Mul`'s id, name, shape and backend
//! (its consumers need no edit) and re-points its sources; the orphaned activation stays in the
//! node list as a dead node, which the allocator gives no buffer and the scheduler skips.
//! Removing it would renumber ids.
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
        GLU_RULES.iter().map(|rule| self.fuse_glu(graph, caps, rule)).sum()
    }

    /// `Mul(Act(x), y)` / `Mul(y, Act(x))` → `Fused(x, y)`, gated on the Mul's backend.
    /// Matches are collected on the unmodified graph, then applied.
    fn fuse_glu(&self, graph: &mut ComputeGraph, caps: &impl FusionCaps, rule: &GluRule) -> usize {
        let act_input = |id: NodeId| -> Option<NodeId> {
            let node = graph.nodes.get(id)?;
            match node.src.as_slice() {
                [x] if node.op == rule.act => Some(*x),
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
                    .is_some_and(|be| caps.supports_fused(be, rule.claim));
                if !claimed {
                    return None; // unassigned, or the backend has no fused kernel
                }
                match (act_input(a), act_input(b)) {
                    (Some(gate), _) => Some((mul.id, [gate, b])),
                    (None, Some(gate)) => Some((mul.id, [gate, a])),
                    (None, None) => None,
                }
            })
            .collect();
        for &(id, [gate, up]) in &rewrites {
            let node = &mut graph.nodes[id];
            node.op = rule.fused.clone();
            node.src = vec![gate, up];
        }
        rewrites.len()
    }
}

/// One gated-unit rewrite: `Mul(act(x), y)` → `fused(x, y)` where the backend claims `claim`.
struct GluRule {
    act: Op,
    fused: Op,
    claim: FusedOp,
}

/// The rules, applied in this order.
const GLU_RULES: [GluRule; 2] = [
    GluRule { act: Op::Silu, fused: Op::SwiGLU, claim: FusedOp::SwiGLU },
    GluRule { act: Op::Gelu, fused: Op::GeGLU, claim: FusedOp::GeGLU },
];
