//! The memory planner: where in its backend's compute arena every node's output lives.
//!
//! Pure arithmetic over one graph — it allocates nothing. [`plan_layout`] walks the nodes in
//! **build order** (the order the scheduler executes) and places each live value at a byte
//! offset of its backend's arena with a best-fit free list ([`OffsetPlanner`], after ggml's
//! `ggml_dyn_tallocr`). The rules, each one a past bug or a contract:
//!
//! 1. Liveness is computed in build order, never in the Kahn order of `topo_order()`, which can
//!    move a source-less node ahead and let a later node reuse an input the scheduler has not
//!    read yet (the G3 regression).
//! 2. Pinned values are never freed: host-filled inputs (a later fill, or an earlier-dead node,
//!    would clobber a shared region) and read-back outputs.
//! 3. A value's region is returned to the free list before the node *after* its last reader is
//!    placed, so a node never writes over a value it still reads.
//! 4. In place: an op whose table row says `in_place_safe` (Silu, RoPE) writes over its
//!    `src[0]` when it is that value's sole live consumer on the same backend, with the same
//!    size, and the value is neither pinned nor a KV view.
//! 5. KV-bound nodes (`kv_store`, `kv_load`, `kv_shift`) take no arena space: their buffer is
//!    the layer's persistent K region, owned by the allocator.
//! 6. Dead nodes (orphaned by fusion) get no region and are never executed.
//! 7. A value read by a split on another backend gets a staging region in that backend's arena,
//!    placed when the reading split starts and pinned for the rest of the graph.
//!
//! Offsets are multiples of the backend's alignment; the planner's high-water mark per backend
//! is the arena size the graph needs ([`Layout::arena_bytes`]). Reserving an arena for the
//! worst-case graph (most tokens) once makes every smaller graph fit inside it.

use std::collections::BTreeMap;

use super::error::GraphError;
use super::registry::Backend;
use super::scheduler::{Split, split_live_graph};
use super::{ComputeGraph, NodeId};

/// A best-fit allocator of byte offsets inside one growing arena.
#[derive(Debug, Clone)]
pub struct OffsetPlanner {
    align: usize,
    /// Free blocks `(offset, size)`, sorted by offset, never adjacent (merged on free).
    free: Vec<(usize, usize)>,
    /// The high-water mark: the arena size needed so far.
    high: usize,
}

impl OffsetPlanner {
    /// `align` must be a power of two.
    pub fn new(align: usize) -> OffsetPlanner {
        OffsetPlanner { align: align.max(1).next_power_of_two(), free: Vec::new(), high: 0 }
    }

    fn round(&self, bytes: usize) -> usize {
        bytes.max(1).div_ceil(self.align) * self.align
    }

    /// An offset for `bytes` bytes: the smallest free block that holds them (lowest offset on a
    /// tie), else the end of the arena (extending a free block that ends there).
    pub fn alloc(&mut self, bytes: usize) -> usize {
        let size = self.round(bytes);
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s >= size)
            .min_by_key(|(_, (off, s))| (*s, *off))
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return off;
        }
        match self.free.last() {
            Some(&(off, s)) if off + s == self.high => {
                self.free.pop();
                self.high = off + size;
                off
            }
            _ => {
                let off = self.high;
                self.high += size;
                off
            }
        }
    }

    /// Returns the block at `offset` of `bytes` bytes (as given to [`alloc`](Self::alloc)).
    pub fn free(&mut self, offset: usize, bytes: usize) {
        let size = self.round(bytes);
        let at = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(at, (offset, size));
        // Merge with the next block, then with the previous one.
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
    }

    /// The arena size the allocations so far need.
    pub fn high_water(&self) -> usize {
        self.high
    }
}

/// Where a node's value lives in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Bytes `offset..offset + bytes` of its backend's arena.
    Arena { backend: Backend, offset: usize, bytes: usize },
    /// The layer's persistent K region.
    Kv { layer: usize },
}

/// The planned layout of one graph.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Per node: its slot (every live node has one, inputs included; `None`: dead).
    pub slots: Vec<Option<Slot>>,
    /// Staging regions: a node's value copied onto another backend, `(node, backend) → slot`.
    pub staging: BTreeMap<(NodeId, Backend), Slot>,
    /// The arena bytes each backend needs.
    pub arena_bytes: BTreeMap<Backend, usize>,
    /// The graph's splits (maximal runs of nodes on one backend).
    pub splits: Vec<Split>,
    /// [`ComputeGraph::live_mask`] of the graph, computed once for the whole plan.
    pub live: Vec<bool>,
}

/// Plans `graph` (see the module docs). `align(backend)` is each backend's offset alignment.
pub fn plan_layout(graph: &ComputeGraph, align: impl Fn(Backend) -> usize) -> Result<Layout, GraphError> {
    graph.validate()?;
    let live = Liveness::analyse(graph, graph.live_mask())?;
    let splits = split_live_graph(graph, &live.live)?;
    let n = graph.nodes.len();
    let mut planners: BTreeMap<Backend, OffsetPlanner> = BTreeMap::new();
    let mut slots: Vec<Option<Slot>> = vec![None; n];
    let mut staging = BTreeMap::new();
    // expiring[i]: arena blocks whose last reader runs before node i.
    let mut expiring: Vec<Vec<(Backend, usize, usize)>> = vec![Vec::new(); n];
    let mut split_at = splits.iter().peekable();
    for node in &graph.nodes {
        let i = node.id;
        for (backend, offset, bytes) in std::mem::take(&mut expiring[i]) {
            if let Some(p) = planners.get_mut(&backend) {
                p.free(offset, bytes);
            }
        }
        // Rule 7: a split's cross-backend sources get their staging regions as it starts.
        if let Some(split) = split_at.next_if(|s| s.node_range.0 == i) {
            for &src in &split.inputs {
                let producer = &graph.nodes[src];
                if !live.live[src] || staging.contains_key(&(src, split.backend)) {
                    continue;
                }
                let bytes = producer.out_dtype.bytes_for(producer.n_elements());
                let planner = planners.entry(split.backend).or_insert_with(|| OffsetPlanner::new(align(split.backend)));
                let offset = planner.alloc(bytes);
                staging.insert((src, split.backend), Slot::Arena { backend: split.backend, offset, bytes });
            }
        }
        let (true, Some(backend)) = (live.live[i], node.backend) else {
            continue; // dead: no region, never executed
        };
        if node.op.binds_kv_region() {
            let layer = node.kv_layer().ok_or_else(|| GraphError::MissingMeta {
                node: node.name.clone(),
                op: node.op.clone(),
                expected: "a KV layer",
            })?;
            slots[i] = Some(Slot::Kv { layer });
            continue;
        }
        let root = live.root[i];
        if root != i {
            slots[i] = slots[root]; // in place over its source
            continue;
        }
        let bytes = node.out_dtype.bytes_for(node.n_elements());
        let planner = planners.entry(backend).or_insert_with(|| OffsetPlanner::new(align(backend)));
        let offset = planner.alloc(bytes);
        slots[i] = Some(Slot::Arena { backend, offset, bytes });
        if let Some(at) = live.expiry[i].checked_add(1).filter(|&at| at < n) {
            expiring[at].push((backend, offset, bytes));
        }
    }
    let arena_bytes = planners.iter().map(|(&b, p)| (b, p.high_water())).collect();
    Ok(Layout { slots, staging, arena_bytes, splits, live: live.live })
}

/// The liveness plan of one graph, in build order.
struct Liveness {
    /// Does the node do work (see [`ComputeGraph::live_mask`])?
    live: Vec<bool>,
    /// The node whose region this node writes: itself, or the start of an in-place chain.
    root: Vec<NodeId>,
    /// For a root: the last build-order index at which its region is read (`usize::MAX`: never
    /// freed — inputs and outputs).
    expiry: Vec<usize>,
}

impl Liveness {
    fn analyse(graph: &ComputeGraph, live: Vec<bool>) -> Result<Liveness, GraphError> {
        let nodes = &graph.nodes;
        let n = nodes.len();
        if let Some(node) = nodes.iter().find(|x| live[x.id] && x.backend.is_none()) {
            return Err(GraphError::Unassigned { node: node.name.clone() });
        }
        let mut pinned: Vec<bool> = nodes.iter().map(|x| x.is_input()).collect();
        for &o in &graph.outputs {
            pinned[o] = true;
        }
        let mut last_use: Vec<usize> = (0..n).collect();
        for node in nodes.iter().filter(|x| live[x.id]) {
            for &s in &node.src {
                last_use[s] = last_use[s].max(node.id);
            }
        }
        let consumers = graph.consumer_counts(&live);
        let mut root: Vec<NodeId> = (0..n).collect();
        for node in nodes.iter().filter(|x| live[x.id] && x.op.in_place_safe()) {
            if let Some(&s) = node.src.first()
                && consumers[s] == 1
                && !pinned[s]
                && !nodes[s].op.binds_kv_region()
                && nodes[s].backend == node.backend
                && nodes[s].n_elements() == node.n_elements()
                && nodes[s].out_dtype == node.out_dtype
            {
                root[node.id] = root[s];
            }
        }
        // A region lives until the last read of every node that writes it.
        let mut expiry = vec![0usize; n];
        for node in nodes.iter().filter(|x| live[x.id]) {
            let e = if pinned[node.id] { usize::MAX } else { last_use[node.id] };
            let r = root[node.id];
            expiry[r] = expiry[r].max(e);
        }
        Ok(Liveness { live, root, expiry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_reuses_and_merges() {
        let mut p = OffsetPlanner::new(64);
        let a = p.alloc(100); // 128
        let b = p.alloc(64);
        let c = p.alloc(256);
        assert_eq!((a, b, c), (0, 128, 192));
        assert_eq!(p.high_water(), 448);
        p.free(a, 100);
        p.free(b, 64);
        // the merged 192-byte hole takes a 150-byte request, the arena does not grow
        assert_eq!(p.alloc(150), 0);
        assert_eq!(p.high_water(), 448);
        p.free(c, 256);
        // a free block at the end is extended rather than leaving a hole
        assert_eq!(p.alloc(512), 192);
        assert_eq!(p.high_water(), 704);
    }
}
