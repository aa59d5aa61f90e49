//! The graph allocator: the single owner of every buffer.
//!
//! Per backend it holds one **compute arena** (a single buffer the backend allocated) and the
//! persistent per-layer **KV regions** (one buffer per K and per V half, created on first use,
//! kept across graph rebuilds: a `GraphCache` keeps the allocator across `replace_graph`). The
//! [`planner`](super::planner) places every node at an offset inside its backend's arena; the
//! allocator turns that layout into [`TensorRef`]s and per-split [`NodeWork`] lists. The
//! scheduler never allocates.
//!
//! Reserve once: [`GraphAllocator::reserve`] plans the worst-case graph (the most tokens per
//! step, full context) and sizes each arena for it; every later graph is planned into the
//! arena it already has. A graph that needs more than the reserve grows the arena (a new
//! buffer, counted by the backend) — which the engine avoids by splitting prompts into
//! micro-batches no larger than the reserve.
//!
//! Allocation is fallible: a backend that cannot hold a region answers
//! [`OutOfMemory`](super::backend::OutOfMemory), surfaced as [`GraphError::OutOfMemory`] with
//! the backend and the bytes asked.

use std::collections::BTreeMap;

use super::backend::{BackendImpl, BufRef, BufferId, BufferUsage, KvPair, KvProvider, MemoryStats, NodeWork, SplitWork, TensorRef};
use super::error::GraphError;
use super::ops::{FusedOp, NodeMeta};
use super::planner::{Layout, Slot, plan_layout};
use super::registry::{Backend, BackendFence, BackendRegistry};
use super::scheduler::Split;
use super::{CNode, ComputeGraph, DType, NodeId, PersistentBuf};

/// One backend's implementation under its registry handle, with its arena.
struct Pool {
    backend: Backend,
    imp: Box<dyn BackendImpl>,
    /// The compute arena: buffer and size (bytes).
    arena: Option<(BufferId, usize)>,
}

/// A layer's two persistent regions.
#[derive(Debug, Clone, Copy)]
struct KvRegion {
    pair: KvPair,
}

/// The installed plan of the current graph.
#[derive(Debug, Default)]
struct Plan {
    nodes: usize,
    tensors: Vec<Option<TensorRef>>,
    cross: BTreeMap<(NodeId, Backend), TensorRef>,
    splits: Vec<Split>,
    work: Vec<Vec<NodeWork>>,
    /// Arena bytes this graph uses per backend (its high-water mark).
    arena_used: BTreeMap<Backend, usize>,
}

/// The arena bytes per backend a reserve has recorded so far.
#[derive(Debug, Clone, Default)]
pub struct ArenaNeed(pub BTreeMap<Backend, usize>);

/// Owner of the arenas, the KV regions and the current plan; holds one pool per enabled
/// backend, in identity order.
pub struct GraphAllocator {
    registry: BackendRegistry,
    /// The registry's priority order, devices only (the CPU is the terminal, asked last).
    device_priority: Vec<Backend>,
    fence: BackendFence,
    pools: Vec<Pool>,
    plan: Option<Plan>,
    kv: BTreeMap<usize, KvRegion>,
    persistent: Vec<PersistentBuf>,
    /// Host staging for copies between backends without a direct path (reused).
    staging: Vec<u8>,
}

impl std::fmt::Debug for GraphAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphAllocator")
            .field("backends", &self.backends())
            .field("fence", &self.fence)
            .field("planned_nodes", &self.plan.as_ref().map(|p| p.nodes))
            .field("kv_layers", &self.kv.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl GraphAllocator {
    /// An allocator without pools; backends join through [`enable_backend`](Self::enable_backend)
    /// (the CPU must, before anything is planned: it is the terminal of the assignment walk).
    pub fn new(registry: BackendRegistry, fence: BackendFence) -> GraphAllocator {
        let device_priority = registry
            .by_priority()
            .into_iter()
            .map(|e| e.handle)
            .filter(|&b| b != Backend::CPU)
            .collect();
        GraphAllocator {
            registry,
            device_priority,
            fence,
            pools: Vec::new(),
            plan: None,
            kv: BTreeMap::new(),
            persistent: Vec::new(),
            staging: Vec::new(),
        }
    }

    /// Installs `imp` as `backend`'s implementation (replacing one that holds no buffers). The
    /// handle must be in the registry.
    pub fn enable_backend(&mut self, backend: Backend, imp: Box<dyn BackendImpl>) -> Result<(), GraphError> {
        if self.registry.entry(backend).is_none() {
            return Err(GraphError::UnregisteredBackend { backend });
        }
        match self.pools.iter_mut().find(|p| p.backend == backend) {
            Some(p) if p.imp.memory().bytes_in_use > 0 || p.arena.is_some() => return Err(GraphError::PoolInUse { backend }),
            Some(p) => p.imp = imp,
            None => {
                self.pools.push(Pool { backend, imp, arena: None });
                self.pools.sort_by_key(|p| p.backend);
            }
        }
        Ok(())
    }

    pub fn registry(&self) -> &BackendRegistry {
        &self.registry
    }

    pub fn fence(&self) -> &BackendFence {
        &self.fence
    }

    /// Backends with a pool, in identity order.
    pub fn backends(&self) -> Vec<Backend> {
        self.pools.iter().map(|p| p.backend).collect()
    }

    pub fn pool(&self, backend: Backend) -> Option<&dyn BackendImpl> {
        self.pools.iter().find(|p| p.backend == backend).map(|p| p.imp.as_ref())
    }

    pub fn pool_mut(&mut self, backend: Backend) -> Result<&mut dyn BackendImpl, GraphError> {
        match self.pools.iter_mut().find(|p| p.backend == backend) {
            Some(p) => Ok(p.imp.as_mut()),
            None => Err(GraphError::NoPool { backend }),
        }
    }

    fn pool_entry(&mut self, backend: Backend) -> Result<&mut Pool, GraphError> {
        self.pools.iter_mut().find(|p| p.backend == backend).ok_or(GraphError::NoPool { backend })
    }

    /// `backend`'s allocation counters.
    pub fn memory(&self, backend: Backend) -> Option<MemoryStats> {
        self.pool(backend).map(|p| p.memory())
    }

    /// The size of `backend`'s compute arena (0 before the first plan).
    pub fn arena_bytes(&self, backend: Backend) -> usize {
        self.pools.iter().find(|p| p.backend == backend).and_then(|p| p.arena).map_or(0, |(_, s)| s)
    }

    /// The backend that takes `node`: the registry's priority walk over the fenced backends
    /// that have a pool, CPU last. `None` if not even the CPU claims it.
    pub fn supports_for(&self, node: &CNode) -> Option<Backend> {
        let claims = |b: Backend| self.pool(b).is_some_and(|p| p.supports_node(node));
        let device = self.device_priority.iter().copied().find(|&b| self.fence.allows(b) && claims(b));
        device.or_else(|| claims(Backend::CPU).then_some(Backend::CPU))
    }

    /// Does `backend`'s pool claim the fused kernel?
    pub fn supports_fused(&self, backend: Backend, fused: FusedOp) -> bool {
        self.pool(backend).is_some_and(|p| p.supports_fused(fused))
    }

    /// Forgets the current plan. The arenas and the KV regions stay.
    pub fn release(&mut self) {
        self.plan = None;
    }

    /// Sizes the arenas (and creates the KV regions) for `graphs` without installing a plan:
    /// the reserve of the worst-case graphs. Each arena gets the largest size any of them
    /// needs, in one allocation. Arenas only grow.
    pub fn reserve(&mut self, graphs: &[&ComputeGraph]) -> Result<(), GraphError> {
        let mut need = ArenaNeed::default();
        for graph in graphs {
            self.reserve_graph(graph, &mut need)?;
        }
        self.reserve_arenas(&need)
    }

    /// One graph of a reserve: creates its KV regions and records the arena bytes it needs
    /// (a caller may build each graph on demand and drop it once recorded).
    pub fn reserve_graph(&mut self, graph: &ComputeGraph, need: &mut ArenaNeed) -> Result<(), GraphError> {
        let layout = self.layout(graph)?;
        self.ensure_kv_of(graph, &layout)?;
        for (&b, &bytes) in &layout.arena_bytes {
            let e = need.0.entry(b).or_default();
            *e = (*e).max(bytes);
        }
        Ok(())
    }

    /// Ends a reserve: each arena grows (once) to what the recorded graphs need.
    pub fn reserve_arenas(&mut self, need: &ArenaNeed) -> Result<(), GraphError> {
        self.ensure_arenas(&Layout { arena_bytes: need.0.clone(), ..Layout::default() })
    }

    /// Plans `graph` into the arenas and installs the plan. Every live node must have a
    /// backend with a pool. On error no plan is installed.
    pub fn alloc_graph(&mut self, graph: &ComputeGraph) -> Result<(), GraphError> {
        self.release();
        let layout = self.layout(graph)?;
        self.ensure_kv_of(graph, &layout)?;
        self.ensure_arenas(&layout)?;
        let plan = self.materialize(graph, layout)?;
        self.plan = Some(plan);
        Ok(())
    }

    fn layout(&self, graph: &ComputeGraph) -> Result<Layout, GraphError> {
        let layout = plan_layout(graph, |b| self.pool(b).map_or(64, |p| p.alignment()))?;
        for node in graph.nodes.iter().filter(|x| layout.live[x.id]) {
            if let Some(b) = node.backend
                && self.pool(b).is_none()
            {
                return Err(GraphError::NoPool { backend: b });
            }
        }
        Ok(layout)
    }

    /// Creates the KV regions the graph's KV-bound nodes name, on their backends, and checks
    /// that every node reading a layer's regions (attention too) runs where they live — at
    /// plan time, not at the first evaluation.
    fn ensure_kv_of(&mut self, graph: &ComputeGraph, layout: &Layout) -> Result<(), GraphError> {
        self.ensure_kv_regions(graph, layout)?;
        for node in graph.nodes.iter().filter(|n| layout.live[n.id]) {
            let (Some(layer), Some(backend)) = (node.kv_layer(), node.backend) else { continue };
            if let Some(pair) = self.kv_pair(layer)
                && pair.k.backend() != backend
            {
                return Err(GraphError::KvBackendMismatch { node: node.name.clone(), layer, node_backend: backend, kv_backend: pair.k.backend() });
            }
        }
        Ok(())
    }

    fn ensure_kv_regions(&mut self, graph: &ComputeGraph, layout: &Layout) -> Result<(), GraphError> {
        for (node, slot) in graph.nodes.iter().zip(&layout.slots) {
            let (Some(Slot::Kv { layer }), Some(backend)) = (slot, node.backend) else { continue };
            let meta = match &node.meta {
                NodeMeta::Kvcache(m) => m,
                NodeMeta::KvShift(m) => &m.kv,
                _ => {
                    return Err(GraphError::MissingMeta { node: node.name.clone(), op: node.op.clone(), expected: "kvcache" });
                }
            };
            self.ensure_kv(*layer, backend, meta.region_bytes(), meta.kv_type.dtype())?;
        }
        Ok(())
    }

    /// Grows each arena the layout needs more of (a new buffer; the old one is freed first).
    fn ensure_arenas(&mut self, layout: &Layout) -> Result<(), GraphError> {
        for (&backend, &bytes) in &layout.arena_bytes {
            let pool = self.pool_entry(backend)?;
            if let Some((_, have)) = pool.arena
                && have >= bytes
            {
                continue;
            }
            if let Some((old, _)) = pool.arena.take() {
                pool.imp.free_buffer(old);
            }
            let id = pool.imp.alloc_buffer(bytes, BufferUsage::Compute)?;
            pool.arena = Some((id, bytes));
        }
        Ok(())
    }

    fn slot_tensor(&self, slot: Slot, dtype: DType) -> Result<TensorRef, GraphError> {
        match slot {
            Slot::Arena { backend, offset, bytes } => {
                let (id, _) = self.pools.iter().find(|p| p.backend == backend).and_then(|p| p.arena).ok_or(GraphError::NoPool { backend })?;
                Ok(TensorRef { buf: BufRef { backend, id }, offset, bytes, dtype })
            }
            Slot::Kv { layer } => {
                let pair = self.kv_pair(layer).ok_or_else(|| GraphError::KvMissing { node: format!("kv.{layer}"), layer })?;
                Ok(pair.k)
            }
        }
    }

    /// The layout as tensors, and each split's node work.
    fn materialize(&self, graph: &ComputeGraph, layout: Layout) -> Result<Plan, GraphError> {
        let mut tensors = Vec::with_capacity(graph.nodes.len());
        for (node, slot) in graph.nodes.iter().zip(&layout.slots) {
            tensors.push(slot.map(|s| self.slot_tensor(s, node.out_dtype)).transpose()?);
        }
        let mut cross = BTreeMap::new();
        for (&(node, backend), &slot) in &layout.staging {
            cross.insert((node, backend), self.slot_tensor(slot, graph.nodes[node].out_dtype)?);
        }
        let mut work = Vec::with_capacity(layout.splits.len());
        for split in &layout.splits {
            let mut items = Vec::new();
            for node in &graph.nodes[split.node_range.0..split.node_range.1] {
                let Some(out) = tensors[node.id] else { continue }; // dead
                if node.is_input() {
                    continue; // host-filled
                }
                let mismatch = |buffer: Backend| GraphError::BackendMismatch { node: node.name.clone(), split: split.backend, buffer };
                if out.backend() != split.backend {
                    return Err(mismatch(out.backend()));
                }
                let srcs = node
                    .src
                    .iter()
                    .map(|&s| {
                        let canon = tensors.get(s).copied().flatten().ok_or(GraphError::NoBuffer { node: s })?;
                        match canon.backend() == split.backend {
                            true => Ok(canon),
                            false => cross.get(&(s, split.backend)).copied().ok_or_else(|| mismatch(canon.backend())),
                        }
                    })
                    .collect::<Result<Vec<_>, GraphError>>()?;
                // `ensure_kv_of` already checked that the pair lives on this node's backend.
                let kv = match node.kv_layer() {
                    Some(layer) => Some(self.kv_pair(layer).ok_or_else(|| GraphError::KvMissing { node: node.name.clone(), layer })?),
                    None => None,
                };
                items.push(NodeWork { node: node.id, out, srcs, kv });
            }
            work.push(items);
        }
        Ok(Plan { nodes: graph.nodes.len(), tensors, cross, splits: layout.splits, work, arena_used: layout.arena_bytes })
    }

    /// The layer's K and V regions (`bytes` each, cells of `dtype`), created zero-filled on
    /// `backend` on first use and kept across rebuilds.
    pub fn ensure_kv(&mut self, layer: usize, backend: Backend, bytes: usize, dtype: DType) -> Result<KvPair, GraphError> {
        if let Some(region) = self.kv.get(&layer) {
            if region.pair.k.bytes != bytes || region.pair.k.dtype != dtype {
                return Err(GraphError::KvRegionSize { layer, have: region.pair.k.bytes, want: bytes });
            }
            return Ok(region.pair);
        }
        let pool = self.pool_mut(backend)?;
        let k = pool.alloc_buffer(bytes, BufferUsage::Kv)?;
        let v = match pool.alloc_buffer(bytes, BufferUsage::Kv) {
            Ok(v) => v,
            Err(e) => {
                pool.free_buffer(k);
                return Err(e.into());
            }
        };
        let tensor = |id| TensorRef { buf: BufRef { backend, id }, offset: 0, bytes, dtype };
        let pair = KvPair { k: tensor(k), v: tensor(v) };
        self.kv.insert(layer, KvRegion { pair });
        for (half, t) in [("k", pair.k), ("v", pair.v)] {
            self.persistent.push(PersistentBuf { name: format!("kv.{layer}.{half}"), buf: t.buf, bytes });
        }
        Ok(pair)
    }

    /// The persistent buffers (KV regions) in creation order.
    pub fn persistent(&self) -> &[PersistentBuf] {
        &self.persistent
    }

    /// Errors unless the current plan was made for `graph`: its size, and every node still on
    /// the backend its region was planned on (a node moved after planning would run on one
    /// backend against another's memory).
    pub fn check_plan(&self, graph: &ComputeGraph) -> Result<(), GraphError> {
        let plan = match &self.plan {
            Some(p) if p.nodes == graph.nodes.len() => p,
            p => return Err(GraphError::NotPlanned { nodes: graph.nodes.len(), planned: p.as_ref().map_or(0, |p| p.nodes) }),
        };
        for (node, t) in graph.nodes.iter().zip(&plan.tensors) {
            if let (Some(t), Some(b)) = (t, node.backend)
                && t.backend() != b
            {
                return Err(GraphError::BackendMismatch { node: node.name.clone(), split: b, buffer: t.backend() });
            }
        }
        Ok(())
    }

    /// Node `id`'s tensor in the current plan (`None`: dead or unplanned).
    pub fn node_tensor(&self, id: NodeId) -> Option<TensorRef> {
        self.plan.as_ref()?.tensors.get(id).copied().flatten()
    }

    /// The staging copy of node `id` on `backend`, if the plan has one.
    pub fn cross_tensor(&self, id: NodeId, backend: Backend) -> Option<TensorRef> {
        self.plan.as_ref()?.cross.get(&(id, backend)).copied()
    }

    /// The arena bytes the current plan uses on `backend` (of [`arena_bytes`](Self::arena_bytes)
    /// reserved).
    pub fn arena_used(&self, backend: Backend) -> usize {
        self.plan.as_ref().and_then(|p| p.arena_used.get(&backend)).copied().unwrap_or(0)
    }

    /// The current plan's splits.
    pub fn splits(&self) -> &[Split] {
        self.plan.as_ref().map_or(&[], |p| &p.splits)
    }

    /// Copies node `id`'s value into its staging region on `dst`: the destination's direct
    /// path when it has one, else through a host buffer (device → host → device).
    pub fn copy_across(&mut self, id: NodeId, dst: Backend) -> Result<(), GraphError> {
        let src = self.node_tensor(id).ok_or(GraphError::NoBuffer { node: id })?;
        if src.backend() == dst {
            return Ok(());
        }
        let staged = self.cross_tensor(id, dst).ok_or(GraphError::NoBuffer { node: id })?;
        let (si, di) = (self.pool_index(src.backend())?, self.pool_index(dst)?);
        let (src_pool, dst_pool) = two_mut(&mut self.pools, si, di);
        if dst_pool.imp.copy_from(staged, src_pool.imp.as_mut(), src)? {
            return Ok(());
        }
        src_pool.imp.synchronize()?;
        self.staging.resize(src.bytes, 0);
        src_pool.imp.get_tensor(src, 0, &mut self.staging)?;
        dst_pool.imp.set_tensor(staged, 0, &self.staging)
    }

    fn pool_index(&self, backend: Backend) -> Result<usize, GraphError> {
        self.pools.iter().position(|p| p.backend == backend).ok_or(GraphError::NoPool { backend })
    }

    /// Runs split `index` of the current plan on its backend; `nodes`, when given, limits it
    /// to that range of its work items (the trace recorder runs one node at a time).
    pub fn compute_split(&mut self, graph: &ComputeGraph, index: usize, nodes: Option<std::ops::Range<usize>>) -> Result<(), GraphError> {
        let plan = self.plan.as_ref().ok_or(GraphError::NotPlanned { nodes: graph.nodes.len(), planned: 0 })?;
        let (split, work) = match (plan.splits.get(index), plan.work.get(index)) {
            (Some(s), Some(w)) => (s, w),
            _ => return Err(GraphError::NotPlanned { nodes: graph.nodes.len(), planned: plan.nodes }),
        };
        let items = match nodes {
            Some(r) => work.get(r).unwrap_or(&[]),
            None => work.as_slice(),
        };
        let backend = split.backend;
        let pool = self.pools.iter_mut().find(|p| p.backend == backend).ok_or(GraphError::NoPool { backend })?;
        pool.imp.compute(&SplitWork { graph, backend, nodes: items })
    }

    /// The number of work items of split `index` (executed nodes).
    pub fn split_len(&self, index: usize) -> usize {
        self.plan.as_ref().and_then(|p| p.work.get(index)).map_or(0, Vec::len)
    }

    /// The node of work item `item` of split `index`.
    pub fn split_node(&self, index: usize, item: usize) -> Option<NodeId> {
        Some(self.plan.as_ref()?.work.get(index)?.get(item)?.node)
    }

    /// Waits for `backend`'s queued work (a split boundary).
    pub fn synchronize(&mut self, backend: Backend) -> Result<(), GraphError> {
        self.pool_mut(backend)?.synchronize()
    }

    fn input_tensor(&self, graph: &ComputeGraph, name: &str, dtype: DType, got: usize) -> Result<TensorRef, GraphError> {
        let node = graph.input_by_name(name).ok_or_else(|| GraphError::NoSuchInput { name: name.to_string() })?;
        if node.out_dtype != dtype {
            return Err(GraphError::InputDType { name: name.to_string(), actual: node.out_dtype, requested: dtype });
        }
        if node.n_elements() != got {
            return Err(GraphError::InputLength { name: name.to_string(), expected: node.n_elements(), got });
        }
        self.node_tensor(node.id).ok_or(GraphError::NoBuffer { node: node.id })
    }

    /// Fills the F32 input `name`; `data` must hold exactly its values.
    pub fn fill_input(&mut self, graph: &ComputeGraph, name: &str, data: &[f32]) -> Result<(), GraphError> {
        let t = self.input_tensor(graph, name, DType::F32, data.len())?;
        self.pool_mut(t.backend())?.set_tensor(t, 0, bytemuck::cast_slice(data))
    }

    /// Fills the I32 input `name`; `data` must hold exactly its values.
    pub fn fill_input_i32(&mut self, graph: &ComputeGraph, name: &str, data: &[i32]) -> Result<(), GraphError> {
        let t = self.input_tensor(graph, name, DType::I32, data.len())?;
        self.pool_mut(t.backend())?.set_tensor(t, 0, bytemuck::cast_slice(data))
    }

    /// The bytes of node `id`'s value, from any backend (after its queued work).
    pub fn read_node_bytes(&mut self, id: NodeId) -> Result<Vec<u8>, GraphError> {
        let t = self.node_tensor(id).ok_or(GraphError::NoBuffer { node: id })?;
        self.read_tensor(t)
    }

    /// A host copy of the F32 node `id`'s values (logits).
    pub fn copy_to_cpu(&mut self, id: NodeId) -> Result<Vec<f32>, GraphError> {
        let t = self.node_tensor(id).ok_or(GraphError::NoBuffer { node: id })?;
        if t.dtype != DType::F32 {
            return Err(GraphError::TensorDType { what: "a host f32 copy", dtype: t.dtype });
        }
        // Read straight into the f32 vector (the logits are the largest read of every step).
        let mut out = vec![0.0f32; t.bytes / 4];
        self.read_into(t, 0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Node `id`'s value as 4-byte words for observers: f32 values, i32 values as their bit
    /// patterns, packed cells (f16, q8_0) as their bytes zero-padded to whole words.
    pub fn node_words(&mut self, id: NodeId) -> Result<Vec<f32>, GraphError> {
        let mut bytes = self.read_node_bytes(id)?;
        bytes.resize(bytes.len().div_ceil(4) * 4, 0);
        Ok(words(&bytes))
    }

    fn read_tensor(&mut self, t: TensorRef) -> Result<Vec<u8>, GraphError> {
        let mut out = vec![0u8; t.bytes];
        self.read_into(t, 0, &mut out)?;
        Ok(out)
    }

    /// Bytes `offset..offset + out.len()` of `t`, after its backend's queued work.
    fn read_into(&mut self, t: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let pool = self.pool_mut(t.backend())?;
        pool.synchronize()?;
        pool.get_tensor(t, offset, out)
    }

    fn kv_of(&self, layer: usize) -> Result<KvPair, GraphError> {
        self.kv_pair(layer).ok_or_else(|| GraphError::KvMissing { node: format!("kv.{layer}"), layer })
    }

    /// Reads bytes `offset..offset + out.len()` of the layer's K (`v = false`) or V region.
    pub fn read_kv(&mut self, layer: usize, v: bool, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let pair = self.kv_of(layer)?;
        self.read_into(if v { pair.v } else { pair.k }, offset, out)
    }

    /// Writes `data` at byte `offset` of the layer's K (`v = false`) or V region.
    pub fn write_kv(&mut self, layer: usize, v: bool, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        let pair = self.kv_of(layer)?;
        let t = if v { pair.v } else { pair.k };
        self.pool_mut(t.backend())?.set_tensor(t, offset, data)
    }

    /// Moves `bytes` bytes from `src` to `dst` (byte offsets) inside both of the layer's
    /// regions, on their backend (`memmove`: the ranges may overlap).
    pub fn move_kv_rows(&mut self, layer: usize, src: usize, dst: usize, bytes: usize) -> Result<(), GraphError> {
        let pair = self.kv_of(layer)?;
        let pool = self.pool_mut(pair.k.backend())?;
        for t in [pair.k, pair.v] {
            let range = |at| t.slice(at, bytes).ok_or(GraphError::TensorRange { backend: t.backend(), offset: at, bytes, size: t.bytes });
            pool.copy_tensor(range(src)?, range(dst)?)?;
        }
        Ok(())
    }

    /// Layers with KV regions, in order.
    pub fn kv_layers(&self) -> Vec<usize> {
        self.kv.keys().copied().collect()
    }
}

/// Little-endian 4-byte words of `bytes` (a whole number of them) as f32 bit patterns.
fn words(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Two distinct elements of a slice, both mutable.
fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}

impl KvProvider for GraphAllocator {
    fn kv_pair(&self, layer: usize) -> Option<KvPair> {
        self.kv.get(&layer).map(|r| r.pair)
    }
}
