//! The graph allocator: the single owner of every buffer.
//!
//! Backends own pools; the allocator decides which pool buffer every live node writes, and it
//! owns the persistent per-layer KV regions, which survive graph rebuilds (a `GraphCache` keeps
//! the allocator across `replace_graph`). The scheduler never allocates.
//!
//! [`GraphAllocator::alloc_graph`] plans one graph:
//! 1. release the previous graph's buffers into their pools (KV regions are untouched);
//! 2. validate the graph (acyclic, sources before consumers);
//! 3. liveness **in build order** — the order the scheduler executes — never the Kahn order of
//!    `topo_order()`, which can move a source-less node ahead and let a later node reuse an input
//!    the scheduler has not read yet (the G3 regression). Inputs and outputs are never freed: an
//!    input is host-filled before execution, so sharing its buffer would let a later fill (or an
//!    earlier-dead node) clobber it;
//! 4. in-place aliasing: an op whose table row says `in_place_safe` (Silu, RoPE) writes over its
//!    `src[0]` when this node is that value's sole live consumer on the same backend (and the
//!    value is neither an input, an output nor a KV view);
//! 5. `KvcacheStore` / `KvcacheLoad` bind their node buffer to the layer's K region, created on
//!    first use by [`ensure_kv`](GraphAllocator::ensure_kv) on the backend of the node that first
//!    touches the layer; dead nodes (orphaned by fusion) get no buffer at all.
//!
//! Buffers are f32; I32 inputs are stored as bit patterns (`f32::from_bits`).

use std::collections::BTreeMap;

use super::backend::{BackendImpl, KvPair, KvProvider};
use super::cpu_backend::CpuBackend;
use super::error::GraphError;
use super::ops::{FusedOp, NodeMeta, Op};
use super::registry::{Backend, BackendFence, BackendRegistry};
use super::{BufRef, ComputeGraph, DType, NodeId, PersistentBuf};

/// One backend's pool, under its registry handle.
struct Pool {
    backend: Backend,
    imp: Box<dyn BackendImpl>,
}

/// A layer's two persistent regions, each `len` f32 values (`[n_embd_kv, n_ctx]` token-major).
#[derive(Debug, Clone, Copy)]
struct KvRegion {
    pair: KvPair,
    len: usize,
}

/// Owner of the node buffers of the current graph, the split-boundary staging buffers and the
/// persistent KV regions; holds one pool per enabled backend, in identity order.
pub struct GraphAllocator {
    registry: BackendRegistry,
    /// The registry's priority order, devices only (the CPU is the terminal, asked last).
    device_priority: Vec<Backend>,
    fence: BackendFence,
    pools: Vec<Pool>,
    /// Current plan: the buffer of each node (`None`: dead, or not planned).
    node_to_buf: Vec<Option<BufRef>>,
    /// Plan buffers not returned to their pool during the walk (inputs, outputs, late values).
    held: Vec<BufRef>,
    /// Staging copies of a node's value on another backend, per (node, backend).
    cross: BTreeMap<(NodeId, Backend), BufRef>,
    kv: BTreeMap<usize, KvRegion>,
    persistent: Vec<PersistentBuf>,
}

impl std::fmt::Debug for GraphAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphAllocator")
            .field("backends", &self.backends())
            .field("fence", &self.fence)
            .field("planned_nodes", &self.node_to_buf.len())
            .field("kv_layers", &self.kv.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl GraphAllocator {
    /// An allocator with a CPU pool; further backends join through
    /// [`enable_backend`](Self::enable_backend).
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
            pools: vec![Pool {
                backend: Backend::CPU,
                imp: Box::new(CpuBackend::new()),
            }],
            node_to_buf: Vec::new(),
            held: Vec::new(),
            cross: BTreeMap::new(),
            kv: BTreeMap::new(),
            persistent: Vec::new(),
        }
    }

    /// The built-in registry, no fence, CPU only.
    pub fn cpu_only() -> GraphAllocator {
        GraphAllocator::new(BackendRegistry::builtin(), BackendFence::all())
    }

    /// Installs `pool` as `backend`'s pool (replacing an unused one, e.g. the CPU pool by a
    /// test double). The handle must be in the registry.
    pub fn enable_backend(
        &mut self,
        backend: Backend,
        pool: Box<dyn BackendImpl>,
    ) -> Result<(), GraphError> {
        if self.registry.entry(backend).is_none() {
            return Err(GraphError::UnregisteredBackend { backend });
        }
        match self.pools.iter_mut().find(|p| p.backend == backend) {
            Some(p) if p.imp.pool_len() > 0 => return Err(GraphError::PoolInUse { backend }),
            Some(p) => p.imp = pool,
            None => {
                self.pools.push(Pool { backend, imp: pool });
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
        self.pools
            .iter()
            .find(|p| p.backend == backend)
            .map(|p| p.imp.as_ref())
    }

    pub fn pool_mut(&mut self, backend: Backend) -> Result<&mut dyn BackendImpl, GraphError> {
        match self.pools.iter_mut().find(|p| p.backend == backend) {
            Some(p) => Ok(p.imp.as_mut()),
            None => Err(GraphError::NoPool { backend }),
        }
    }

    /// The backend that takes a node of `(op, dtype)`: the registry's priority walk over the
    /// fenced backends that have a pool, CPU last. `None` if not even the CPU claims it.
    pub fn supports_for(&self, op: &Op, dtype: DType) -> Option<Backend> {
        let claims = |b: Backend| self.pool(b).is_some_and(|p| p.supports_op(op, dtype));
        let device = self
            .device_priority
            .iter()
            .copied()
            .find(|&b| self.fence.allows(b) && claims(b));
        device.or_else(|| claims(Backend::CPU).then_some(Backend::CPU))
    }

    /// Does `backend`'s pool claim the fused kernel?
    pub fn supports_fused(&self, backend: Backend, fused: FusedOp) -> bool {
        self.pool(backend).is_some_and(|p| p.supports_fused(fused))
    }

    /// Returns the current plan's buffers and staging copies to their pools. KV regions stay.
    pub fn release(&mut self) {
        let bufs: Vec<BufRef> = self
            .held
            .drain(..)
            .chain(std::mem::take(&mut self.cross).into_values())
            .collect();
        for buf in bufs {
            if let Ok(pool) = self.pool_mut(buf.backend) {
                pool.free_buffer(buf.id);
            }
        }
        self.node_to_buf.clear();
    }

    /// Plans buffers for `graph` (see the module docs). Every live node must have a backend
    /// with a pool. On error nothing of the new plan stays allocated.
    pub fn alloc_graph(&mut self, graph: &ComputeGraph) -> Result<(), GraphError> {
        self.release();
        graph.validate()?;
        let plan = Liveness::analyse(graph)?;
        for backend in graph
            .nodes
            .iter()
            .filter(|x| plan.live[x.id])
            .filter_map(|x| x.backend)
        {
            self.pool_mut(backend)?;
        }
        // expiring[i]: buffers whose last reader runs before node i, returned before placing i.
        let mut expiring: Vec<Vec<BufRef>> = vec![Vec::new(); graph.nodes.len()];
        self.node_to_buf = vec![None; graph.nodes.len()];
        let placed = self.place(graph, &plan, &mut expiring);
        if placed.is_err() {
            self.held.extend(expiring.into_iter().flatten());
            self.release();
        }
        placed
    }

    /// The build-order walk: return expired buffers, then give node `i` its buffer.
    fn place(
        &mut self,
        graph: &ComputeGraph,
        plan: &Liveness,
        expiring: &mut [Vec<BufRef>],
    ) -> Result<(), GraphError> {
        let n = graph.nodes.len();
        for node in &graph.nodes {
            let i = node.id;
            for buf in std::mem::take(&mut expiring[i]) {
                self.pool_mut(buf.backend)?.free_buffer(buf.id);
            }
            let (true, Some(backend)) = (plan.live[i], node.backend) else {
                continue; // dead: no buffer, never executed
            };
            if node.op.binds_kv_region() {
                let NodeMeta::Kvcache(meta) = &node.meta else {
                    return Err(GraphError::MissingMeta {
                        node: node.name.clone(),
                        op: node.op.clone(),
                        expected: "kvcache",
                    });
                };
                let layer = node.op.kv_layer().unwrap_or(meta.layer);
                let pair = self.ensure_kv(layer, backend, meta.region_len())?;
                if pair.k.backend != backend {
                    return Err(GraphError::KvBackendMismatch {
                        node: node.name.clone(),
                        layer,
                        node_backend: backend,
                        kv_backend: pair.k.backend,
                    });
                }
                self.node_to_buf[i] = Some(pair.k);
                continue;
            }
            let root = plan.root[i];
            if root != i {
                self.node_to_buf[i] = self.node_to_buf[root]; // in place over its source
                continue;
            }
            // [n_elements] f32 from the pool's free list (exact length) or fresh.
            let len = node.n_elements();
            let buf = BufRef {
                backend,
                id: self.pool_mut(backend)?.alloc_buffer(len),
            };
            self.node_to_buf[i] = Some(buf);
            match plan.expiry[i].checked_add(1).filter(|&at| at < n) {
                Some(at) => expiring[at].push(buf),
                None => self.held.push(buf),
            }
        }
        Ok(())
    }

    /// The layer's K and V regions (`len` f32 each), created zero-filled on `backend` on first
    /// use and kept across rebuilds. They come from `alloc_fresh`: a recycled id could still be
    /// written by a node of the current plan.
    pub fn ensure_kv(
        &mut self,
        layer: usize,
        backend: Backend,
        len: usize,
    ) -> Result<KvPair, GraphError> {
        if let Some(region) = self.kv.get(&layer) {
            if region.len != len {
                return Err(GraphError::KvRegionSize {
                    layer,
                    have: region.len,
                    want: len,
                });
            }
            return Ok(region.pair);
        }
        let pool = self.pool_mut(backend)?;
        let k = BufRef {
            backend,
            id: pool.alloc_fresh(len),
        };
        let v = BufRef {
            backend,
            id: pool.alloc_fresh(len),
        };
        let pair = KvPair { k, v };
        self.kv.insert(layer, KvRegion { pair, len });
        for (half, buf) in [("k", k), ("v", v)] {
            self.persistent.push(PersistentBuf {
                name: format!("kv.{layer}.{half}"),
                buf,
                len,
            });
        }
        Ok(pair)
    }

    /// The persistent buffers (KV regions) in creation order.
    pub fn persistent(&self) -> &[PersistentBuf] {
        &self.persistent
    }

    /// Errors unless the current plan was made for a graph of `graph`'s size: executing an
    /// unplanned graph would otherwise skip every node as dead.
    pub fn check_plan(&self, graph: &ComputeGraph) -> Result<(), GraphError> {
        match self.node_to_buf.len() == graph.nodes.len() {
            true => Ok(()),
            false => Err(GraphError::NotPlanned {
                nodes: graph.nodes.len(),
                planned: self.node_to_buf.len(),
            }),
        }
    }

    /// Node `id`'s buffer in the current plan (`None`: dead or unplanned).
    pub fn node_buffer(&self, id: NodeId) -> Option<BufRef> {
        self.node_to_buf.get(id).copied().flatten()
    }

    /// The staging copy of node `id` on `backend`, if one was made this plan.
    pub fn cross_buffer(&self, id: NodeId, backend: Backend) -> Option<BufRef> {
        self.cross.get(&(id, backend)).copied()
    }

    /// Copies node `id`'s value onto `dst` (a host round trip) into a staging buffer made once
    /// per plan with `alloc_fresh`, so nothing in the running plan can recycle it. Consumers on
    /// the producer's own backend keep reading the canonical buffer.
    pub fn copy_across(&mut self, id: NodeId, dst: Backend) -> Result<BufRef, GraphError> {
        let canon = self
            .node_buffer(id)
            .ok_or(GraphError::NoBuffer { node: id })?;
        if canon.backend == dst {
            return Ok(canon);
        }
        let data = self.pool_mut(canon.backend)?.copy_to_host(canon.id).ok_or(
            GraphError::BadBufferId {
                backend: canon.backend,
                id: canon.id,
            },
        )?;
        let staged = match self.cross.get(&(id, dst)) {
            Some(&b) => b,
            None => {
                let b = BufRef {
                    backend: dst,
                    id: self.pool_mut(dst)?.alloc_fresh(data.len()),
                };
                self.cross.insert((id, dst), b);
                b
            }
        };
        self.pool_mut(dst)?.write_host(staged.id, &data)?;
        Ok(staged)
    }

    /// Waits for `backend`'s queued work (a split boundary).
    pub fn synchronize(&mut self, backend: Backend) -> Result<(), GraphError> {
        self.pool_mut(backend)?.synchronize()
    }

    fn input_buffer(
        &self,
        graph: &ComputeGraph,
        name: &str,
        dtype: DType,
        got: usize,
    ) -> Result<BufRef, GraphError> {
        let node = graph
            .input_by_name(name)
            .ok_or_else(|| GraphError::NoSuchInput {
                name: name.to_string(),
            })?;
        if node.out_dtype != dtype {
            return Err(GraphError::InputDType {
                name: name.to_string(),
                actual: node.out_dtype,
                requested: dtype,
            });
        }
        if node.n_elements() != got {
            return Err(GraphError::InputLength {
                name: name.to_string(),
                expected: node.n_elements(),
                got,
            });
        }
        self.node_buffer(node.id)
            .ok_or(GraphError::NoBuffer { node: node.id })
    }

    /// Fills the F32 input `name`; `data` must hold exactly its values.
    pub fn fill_input(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        data: &[f32],
    ) -> Result<(), GraphError> {
        let buf = self.input_buffer(graph, name, DType::F32, data.len())?;
        self.pool_mut(buf.backend)?.write_host(buf.id, data)
    }

    /// Fills the I32 input `name`, storing each value as an f32 bit pattern (`f32::from_bits`);
    /// kernels read them back with `to_bits() as i32`.
    pub fn fill_input_i32(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        data: &[i32],
    ) -> Result<(), GraphError> {
        let buf = self.input_buffer(graph, name, DType::I32, data.len())?;
        let bits: Vec<f32> = data.iter().map(|&v| f32::from_bits(v as u32)).collect();
        self.pool_mut(buf.backend)?.write_host(buf.id, &bits)
    }

    /// A borrowed view of node `id`'s buffer, where its memory is host-visible.
    pub fn read_node(&self, id: NodeId) -> Option<&[f32]> {
        let buf = self.node_buffer(id)?;
        self.pool(buf.backend)?.read_host(buf.id)
    }

    /// A host copy of node `id`'s value, from any backend.
    pub fn copy_to_cpu(&mut self, id: NodeId) -> Result<Vec<f32>, GraphError> {
        let buf = self
            .node_buffer(id)
            .ok_or(GraphError::NoBuffer { node: id })?;
        self.copy_buf(buf)
    }

    /// Host copies of the layer's K and V regions.
    pub fn copy_kv_to_cpu(&mut self, layer: usize) -> Result<(Vec<f32>, Vec<f32>), GraphError> {
        let pair = self.kv_pair(layer).ok_or_else(|| GraphError::KvMissing {
            node: format!("kv.{layer}"),
            layer,
        })?;
        Ok((self.copy_buf(pair.k)?, self.copy_buf(pair.v)?))
    }

    /// Overwrites the layer's K and V regions from host copies of their full length.
    pub fn write_kv_from_cpu(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), GraphError> {
        let pair = self.kv_pair(layer).ok_or_else(|| GraphError::KvMissing {
            node: format!("kv.{layer}"),
            layer,
        })?;
        self.pool_mut(pair.k.backend)?.write_host(pair.k.id, k)?;
        self.pool_mut(pair.v.backend)?.write_host(pair.v.id, v)
    }

    /// Layers with KV regions, in order.
    pub fn kv_layers(&self) -> Vec<usize> {
        self.kv.keys().copied().collect()
    }

    fn copy_buf(&mut self, buf: BufRef) -> Result<Vec<f32>, GraphError> {
        self.pool_mut(buf.backend)?
            .copy_to_host(buf.id)
            .ok_or(GraphError::BadBufferId {
                backend: buf.backend,
                id: buf.id,
            })
    }
}

impl KvProvider for GraphAllocator {
    fn kv_pair(&self, layer: usize) -> Option<KvPair> {
        self.kv.get(&layer).map(|r| r.pair)
    }
}

/// The liveness plan of one graph, in build order.
struct Liveness {
    /// Does the node do work (see [`ComputeGraph::live_mask`])?
    live: Vec<bool>,
    /// The node whose buffer this node writes: itself, or the start of an in-place chain.
    root: Vec<NodeId>,
    /// For a root: the last build-order index at which its buffer is read (`usize::MAX`: never
    /// freed — inputs and outputs).
    expiry: Vec<usize>,
}

impl Liveness {
    fn analyse(graph: &ComputeGraph) -> Result<Liveness, GraphError> {
        let nodes = &graph.nodes;
        let n = nodes.len();
        let live = graph.live_mask();
        if let Some(node) = nodes.iter().find(|x| live[x.id] && x.backend.is_none()) {
            return Err(GraphError::Unassigned {
                node: node.name.clone(),
            });
        }
        // Pinned values are never freed: host-filled inputs and read-back outputs.
        let mut pinned: Vec<bool> = nodes.iter().map(|x| x.is_input()).collect();
        for &o in &graph.outputs {
            pinned[o] = true;
        }
        // Last reader of each value, in build order (= execution order).
        let mut last_use: Vec<usize> = (0..n).collect();
        for node in nodes.iter().filter(|x| live[x.id]) {
            for &s in &node.src {
                last_use[s] = last_use[s].max(node.id);
            }
        }
        // In-place aliasing: sole live consumer, same backend, same size, and the source is
        // neither pinned nor a KV view.
        let consumers = graph.consumer_counts(&live);
        let mut root: Vec<NodeId> = (0..n).collect();
        for node in nodes.iter().filter(|x| live[x.id] && x.op.in_place_safe()) {
            if let Some(&s) = node.src.first()
                && consumers[s] == 1
                && !pinned[s]
                && !nodes[s].op.binds_kv_region()
                && nodes[s].backend == node.backend
                && nodes[s].n_elements() == node.n_elements()
            {
                root[node.id] = root[s];
            }
        }
        // A buffer lives until the last read of every node that writes it.
        let mut expiry = vec![0usize; n];
        for node in nodes.iter().filter(|x| live[x.id]) {
            let e = if pinned[node.id] {
                usize::MAX
            } else {
                last_use[node.id]
            };
            let r = root[node.id];
            expiry[r] = expiry[r].max(e);
        }
        Ok(Liveness { live, root, expiry })
    }
}
