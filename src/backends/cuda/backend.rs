//! The CUDA executor: [`BackendImpl`] over a [`Device`].
//!
//! Buffers are device allocations (zero-filled) in a table indexed by [`BufferId`]; a cap
//! (`MINFER_CUDA_MEMORY_CAP` or the config's) refuses what does not fit with an
//! [`OutOfMemory`] that names the bytes. Weights are uploaded once at
//! [`load_weights`](BackendImpl::load_weights): matrices as their GGUF blocks, 1-D weights as
//! the store's f32 vectors. A split is a sequence of launches in stream order
//! ([`exec`](super::exec)); [`synchronize`](BackendImpl::synchronize) waits for them.

use std::collections::HashMap;
use std::sync::Arc;

use super::device::{DevPtr, Device, DeviceError, FuncId};
use super::exec::{self, DevWeight, Launcher, Region};
use super::graphs::{GraphCache, Plan};
use crate::graph::{
    Backend, BackendImpl, BufferId, BufferUsage, CNode, FusedOp, GraphError, MemoryStats, NodeMeta, NodeWork, Op, OutOfMemory, SplitWork, TensorRef,
    WeightId, WeightStore, attn_operands, operands,
};

/// The handle this backend's tensors carry.
const HANDLE: Backend = Backend::CUDA;

/// The CUDA backend over one device.
pub struct CudaBackend {
    dev: Box<dyn Device>,
    /// `(base, bytes)` per buffer id.
    buffers: Vec<Option<(DevPtr, usize)>>,
    stats: MemoryStats,
    cap: Option<usize>,
    /// Uploaded weights by id. A backend holds one model's weights: offering another store's
    /// releases these first.
    weights: HashMap<WeightId, DevWeight>,
    /// The store they came from (names for errors).
    weight_names: Option<Arc<WeightStore>>,
    /// Bytes of weights on the device (not in [`MemoryStats::bytes_in_use`], which counts
    /// buffers; the cap covers both and the scratch).
    weight_bytes: usize,
    /// The quantized-activation scratch of the matmuls, grown to the largest asked.
    scratch: Option<(DevPtr, usize)>,
    funcs: HashMap<String, FuncId>,
    /// Recorded decode splits ([`graphs`](super::graphs)).
    graphs: GraphCache,
    /// Launches are being recorded (no allocation may happen).
    recording: bool,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.dev.name())
            .field("buffers", &self.buffers.iter().flatten().count())
            .field("weights", &self.weights.len())
            .field("stats", &self.stats)
            .finish()
    }
}

fn device_err(e: DeviceError) -> GraphError {
    GraphError::BackendUnusable { name: HANDLE.to_string(), reason: e.to_string() }
}

impl CudaBackend {
    /// A backend on `dev`, capped at `cap` bytes of buffers and weights.
    pub fn new(dev: Box<dyn Device>, cap: Option<usize>) -> CudaBackend {
        CudaBackend {
            dev,
            buffers: Vec::new(),
            stats: MemoryStats { capacity: cap, ..MemoryStats::default() },
            cap,
            weights: HashMap::new(),
            weight_names: None,
            weight_bytes: 0,
            scratch: None,
            funcs: HashMap::new(),
            graphs: GraphCache::new(super::graphs::enabled_by_env()),
            recording: false,
        }
    }

    /// Records and replays decode splits as graphs, or not (default: unless
    /// `MINFER_NO_CUDA_GRAPH=1`).
    pub fn with_graphs(mut self, on: bool) -> CudaBackend {
        self.graphs.enabled = on;
        self
    }

    /// Rule 4 of [`graphs`](super::graphs): an address a graph holds may change.
    fn drop_graphs(&mut self) {
        for g in self.graphs.invalidate() {
            self.dev.drop_graph(g);
        }
    }

    fn run_split(&mut self, split: &SplitWork) -> Result<(), GraphError> {
        for w in split.nodes {
            let node = split.node(w)?;
            self.run_node(node, w)?;
        }
        Ok(())
    }

    /// Device memory for `bytes` (buffers and weights together stay under the cap).
    fn reserve(&mut self, bytes: usize, usage: BufferUsage) -> Result<DevPtr, OutOfMemory> {
        let in_use = self.stats.bytes_in_use + self.weight_bytes + self.scratch.map_or(0, |(_, b)| b);
        let oom = OutOfMemory { backend: HANDLE, requested: bytes, usage, in_use, capacity: self.cap };
        if self.cap.is_some_and(|cap| in_use.saturating_add(bytes) > cap) {
            return Err(oom);
        }
        self.dev.alloc(bytes).map_err(|_| oom)
    }

    /// A scratch of at least `bytes` (the old one freed after the queued launches that use it).
    fn ensure_scratch(&mut self, bytes: usize) -> Result<Region, GraphError> {
        if let Some((ptr, have)) = self.scratch
            && have >= bytes
        {
            return Ok(Region { ptr, bytes: have });
        }
        if self.recording {
            return Err(device_err(DeviceError::new("graph capture", format!("the scratch would grow to {bytes} bytes while launches are recorded"))));
        }
        self.drop_graphs();
        if let Some((ptr, _)) = self.scratch.take() {
            self.dev.synchronize().map_err(device_err)?;
            self.dev.free(ptr);
        }
        let ptr = self.reserve(bytes, BufferUsage::Compute).map_err(GraphError::OutOfMemory)?;
        self.scratch = Some((ptr, bytes));
        Ok(Region { ptr, bytes })
    }

    fn release_weights(&mut self) {
        for w in std::mem::take(&mut self.weights).into_values() {
            match w {
                DevWeight::Vector { ptr, .. } | DevWeight::Matrix { ptr, .. } => self.dev.free(ptr),
            }
        }
        self.weight_bytes = 0;
        self.weight_names = None;
    }

    fn base(&self, id: BufferId) -> Result<(DevPtr, usize), GraphError> {
        self.buffers.get(id.0 as usize).copied().flatten().ok_or(GraphError::BadBufferId { backend: HANDLE, id })
    }

    /// The device address of bytes `offset..offset + len` of tensor `t`, bounds-checked.
    fn addr(&self, t: TensorRef, offset: usize, len: usize) -> Result<DevPtr, GraphError> {
        if t.buf.backend != HANDLE {
            return Err(GraphError::BackendMismatch { node: format!("buffer {}", t.buf.id.0), split: HANDLE, buffer: t.buf.backend });
        }
        let (base, size) = self.base(t.buf.id)?;
        let end = offset.checked_add(len).filter(|&e| e <= t.bytes).ok_or(GraphError::TensorRange { backend: HANDLE, offset, bytes: len, size: t.bytes })?;
        if t.offset + end > size {
            return Err(GraphError::TensorRange { backend: HANDLE, offset: t.offset, bytes: t.bytes, size });
        }
        Ok(base + (t.offset + offset) as u64)
    }

    fn region(&self, t: TensorRef) -> Result<Region, GraphError> {
        Ok(Region { ptr: self.addr(t, 0, t.bytes)?, bytes: t.bytes })
    }

    fn run_node(&mut self, node: &CNode, w: &NodeWork) -> Result<(), GraphError> {
        let kv = || w.kv.ok_or_else(|| GraphError::KvMissing { node: node.name.clone(), layer: node.kv_layer().unwrap_or(0) });
        let srcs: Vec<Region> = w.srcs.iter().map(|t| self.region(*t)).collect::<Result<_, _>>()?;
        let out = self.region(w.out)?;
        match &node.op {
            Op::Input | Op::KvcacheLoad { .. } => Ok(()),
            Op::KvcacheStore { .. } => {
                let pair = kv()?;
                let [k, v, pos] = operands(node, &srcs)?;
                if w.srcs.iter().any(|t| t.overlaps(&pair.k) || t.overlaps(&pair.v)) || pair.k.overlaps(&pair.v) {
                    return Err(GraphError::KvAliased { node: node.name.clone() });
                }
                let (kr, vr) = (self.region(pair.k)?, self.region(pair.v)?);
                self.launcher(None).kv_store(node, (k, v, pos), (kr, vr))
            }
            Op::KvShift { .. } => {
                let pair = kv()?;
                let deltas = *srcs.first().ok_or(GraphError::OperandCount { node: node.name.clone(), expected: 1, got: 0 })?;
                if w.srcs.iter().any(|t| t.overlaps(&pair.k)) {
                    return Err(GraphError::KvAliased { node: node.name.clone() });
                }
                let kr = self.region(pair.k)?;
                self.launcher(None).kv_shift(node, deltas, kr)
            }
            Op::Attn => {
                let pair = kv()?;
                let (q, _view, pos, cells) = attn_operands(node, &srcs)?;
                let mut read = vec![w.srcs[0], w.srcs[2], pair.k, pair.v];
                read.extend(w.srcs.get(3));
                if read.iter().any(|t| t.overlaps(&w.out)) {
                    return Err(GraphError::KvAliased { node: node.name.clone() });
                }
                let (k, v) = (self.region(pair.k)?, self.region(pair.v)?);
                let NodeMeta::Attn(m) = &node.meta else { return Err(GraphError::WrongMeta { node: node.name.clone(), expected: "attn", found: node.meta.kind_name() }) };
                let scratch = self.ensure_scratch(exec::attn_scratch_bytes(m, pos.bytes / 4))?;
                self.launcher(Some(scratch)).attention(node, (q, pos, cells), (k, v), out)
            }
            Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::GeGLU | Op::RmsNorm { .. } | Op::QkNorm { .. } | Op::MatMul | Op::GetRows | Op::RoPE { .. } => {
                // Operands either are the output region (in place) or do not touch it.
                if w.srcs.iter().any(|t| t.overlaps(&w.out) && t.range() != w.out.range()) {
                    return Err(GraphError::KvAliased { node: node.name.clone() });
                }
                let scratch = match (&node.op, &node.meta) {
                    (Op::MatMul, NodeMeta::MatMul(m)) => {
                        let nt = srcs.first().map_or(0, |x| x.bytes / 4 / m.in_dim.max(1));
                        exec::q8_scratch_bytes(m.weight_type, m.in_dim, nt)
                    }
                    _ => None,
                };
                let scratch = match scratch {
                    Some(b) => Some(self.ensure_scratch(b)?),
                    None => None,
                };
                let (weights, names) = (&self.weights, &self.weight_names);
                let weight = |id: WeightId| {
                    weights.get(&id).copied().ok_or_else(|| GraphError::WeightNotLoaded {
                        node: node.name.clone(),
                        weight: names.as_ref().map_or_else(|| format!("#{}", id.0), |s| s.name(id).to_string()),
                        backend: HANDLE,
                    })
                };
                let mut launcher = Launcher { dev: self.dev.as_mut(), funcs: &mut self.funcs, scratch };
                launcher.run(node, &weight, &srcs, out)
            }
        }
    }

    fn launcher(&mut self, scratch: Option<Region>) -> Launcher<'_> {
        Launcher { dev: self.dev.as_mut(), funcs: &mut self.funcs, scratch }
    }
}

impl BackendImpl for CudaBackend {
    fn supports_node(&self, node: &CNode) -> bool {
        super::cuda_supports_node(node)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        super::cuda_supports_fused(fused)
    }

    fn alignment(&self) -> usize {
        // cudaMalloc bases are 256-byte aligned; offsets of 64 keep every f32 and 16-byte
        // vector load aligned.
        64
    }

    fn alloc_buffer(&mut self, bytes: usize, usage: BufferUsage) -> Result<BufferId, OutOfMemory> {
        let ptr = self.reserve(bytes, usage)?;
        self.drop_graphs();
        self.stats.allocations += 1;
        self.stats.bytes_in_use += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.bytes_in_use);
        Ok(BufferId::insert(&mut self.buffers, (ptr, bytes)))
    }

    fn free_buffer(&mut self, id: BufferId) {
        if let Some((ptr, bytes)) = self.buffers.get_mut(id.0 as usize).and_then(Option::take) {
            self.drop_graphs();
            self.dev.free(ptr);
            self.stats.frees += 1;
            self.stats.bytes_in_use -= bytes;
        }
    }

    fn buffer_size(&self, id: BufferId) -> Option<usize> {
        self.base(id).ok().map(|(_, b)| b)
    }

    fn memory(&self) -> MemoryStats {
        MemoryStats { capacity: self.cap, weight_bytes: self.weight_bytes, ..self.stats }
    }

    fn set_tensor(&mut self, dst: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        let at = self.addr(dst, offset, data.len())?;
        self.dev.upload(at, data).map_err(device_err)
    }

    fn get_tensor(&mut self, src: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let at = self.addr(src, offset, out.len())?;
        self.dev.download(at, out).map_err(device_err)
    }

    fn copy_tensor(&mut self, src: TensorRef, dst: TensorRef) -> Result<(), GraphError> {
        if src.bytes != dst.bytes {
            return Err(GraphError::TensorRange { backend: HANDLE, offset: dst.offset, bytes: src.bytes, size: dst.bytes });
        }
        let (from, to) = (self.addr(src, 0, src.bytes)?, self.addr(dst, 0, dst.bytes)?);
        if from == to || src.bytes == 0 {
            return Ok(());
        }
        if src.overlaps(&dst) {
            // memmove semantics: stage through the host (the allocator never asks for it on
            // the hot path).
            let mut tmp = vec![0u8; src.bytes];
            self.dev.download(from, &mut tmp).map_err(device_err)?;
            return self.dev.upload(to, &tmp).map_err(device_err);
        }
        self.dev.copy(to, from, src.bytes).map_err(device_err)
    }

    fn load_weights(&mut self, store: &Arc<WeightStore>, ids: &[WeightId]) -> Result<(), GraphError> {
        if self.weight_names.as_ref().is_some_and(|s| !Arc::ptr_eq(s, store)) {
            self.release_weights();
        }
        self.drop_graphs();
        self.weight_names = Some(store.clone());
        for &id in ids {
            if self.weights.contains_key(&id) {
                continue;
            }
            // 1-D weights as the store's f32 vectors, matrices as their blocks.
            let (bytes, matrix): (&[u8], _) = match store.vector(id) {
                Ok(v) => (bytemuck::cast_slice(v), None),
                Err(_) => {
                    let m = store.matrix(id)?;
                    (m.data, Some((m.ty, m.rows, m.cols)))
                }
            };
            let ptr = self.reserve(bytes.len(), BufferUsage::Weights).map_err(GraphError::OutOfMemory)?;
            self.dev.upload(ptr, bytes).map_err(device_err)?;
            let w = match matrix {
                None => DevWeight::Vector { ptr, len: bytes.len() / 4 },
                Some((ty, rows, cols)) => DevWeight::Matrix { ptr, ty, rows, cols },
            };
            self.weights.insert(id, w);
            self.weight_bytes += bytes.len();
        }
        Ok(())
    }

    fn compute(&mut self, split: &SplitWork) -> Result<(), GraphError> {
        for w in split.nodes {
            let node = split.node(w)?;
            if !super::cuda_supports_node(node) {
                return Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() });
            }
        }
        match self.graphs.plan(split) {
            Plan::Launch => self.run_split(split),
            Plan::First(key) => {
                self.run_split(split)?;
                self.graphs.saw(key);
                Ok(())
            }
            Plan::Replay(g) => self.dev.replay(g).map_err(device_err),
            Plan::Record(key) => {
                if !self.dev.begin_capture().map_err(device_err)? {
                    self.graphs.enabled = false;
                    return self.run_split(split);
                }
                self.recording = true;
                let ran = self.run_split(split);
                self.recording = false;
                // The recording ends whatever happened inside it; a failed one is dropped.
                let g = self.dev.end_capture().map_err(device_err);
                if let (Err(_), Ok(g)) = (&ran, &g) {
                    self.dev.drop_graph(*g);
                }
                ran?;
                let g = g?;
                self.graphs.insert(key, g);
                self.dev.replay(g).map_err(device_err)
            }
        }
    }

    fn synchronize(&mut self) -> Result<(), GraphError> {
        self.dev.synchronize().map_err(device_err)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        for (ptr, _) in self.buffers.iter().flatten() {
            self.dev.free(*ptr);
        }
        self.release_weights();
        if let Some((ptr, _)) = self.scratch.take() {
            self.dev.free(ptr);
        }
    }
}
