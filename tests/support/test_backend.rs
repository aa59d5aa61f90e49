//! A test backend with **no host-visible memory**, to prove the backend seam end to end.
//!
//! [`TestBackend`] implements [`BackendImpl`] the way a device backend would have to:
//!
//! * Its buffers live behind the API, in a private map `id -> bytes` kept in a *different byte
//!   layout* from the host's ([`Scrambled`]: each 4-byte word byte-reversed and every byte
//!   XORed with [`KEY`]), so nothing can read them as host memory by accident: a value only
//!   round-trips through [`set_tensor`](BackendImpl::set_tensor) /
//!   [`get_tensor`](BackendImpl::get_tensor) / [`copy_tensor`](BackendImpl::copy_tensor).
//!   Any access to an unknown buffer, outside a buffer, or outside the [`TensorRef`]'s region
//!   is an error ([`GraphError::BadBufferId`], [`GraphError::TensorRange`],
//!   [`GraphError::BackendMismatch`]); nothing here panics.
//! * [`load_weights`](BackendImpl::load_weights) uploads its **own** copy of every offered
//!   weight (scrambled too) and kernels are answered from that copy only; a node naming a
//!   weight that was not offered fails with [`GraphError::WeightNotLoaded`].
//! * A split runs node by node: the node's operands (and the weights it names) are downloaded
//!   into host copies, the CPU backend's node kernels
//!   ([`minfer::backends::cpu::exec`]) run on them on a worker pool, and the output is written
//!   back through the backend's own storage. The kernels' ISA is a parameter
//!   ([`TestBackend::with_isa`]): [`KernelIsa::Scalar`] runs the scalar reference kernels,
//!   [`KernelIsa::Detected`] (the default) what the CPU backend itself runs. On x86 the two
//!   do **not** give the same bits for matrix products (the SIMD dots follow ggml's x86 float
//!   order, the scalar ones ggml's generic order), so a comparison with a CPU backend must
//!   run both on the same ISA ([`allocator`] does).
//! * Which nodes it claims is a type parameter, a [`Placement`]; the capability matrix is the
//!   placement intersected with what the CPU kernels implement
//!   ([`minfer::backends::cpu::cpu_supports_node`]), so the registry's answer and the pool's
//!   answer are the same function ([`supports`]).
//! * Every transfer, split and node is counted in [`Counters`], shared through a
//!   [`CounterHandle`] that stays readable after the engine took ownership of the backend.
//!
//! Typical use (see `tests/backend_seam.rs`):
//!
//! ```ignore
//! let shared = EngineShared::new(&model, 2)?;
//! let (alloc, counters) = test_backend::allocator::<MatMuls>(Backend::CUDA, shared.pool.clone(), KernelIsa::Detected)?;
//! let mut engine = Engine::with_allocator(model, &params, &shared, alloc)?;
//! engine.eval(&tokens, 1)?;
//! println!("{:?}", counters.snapshot());
//! ```
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use minfer::backends::cpu::{self, exec::{self, KernelCtx, KernelIsa, Operand, Weights}};
use minfer::graph::{
    Backend, BackendConfig, BackendEntry, BackendFence, BackendImpl, BackendRegistry, BufferId, BufferUsage, CNode, Capabilities,
    DeviceInfo, FusedOp, GraphAllocator, GraphError, KvPair, MemoryStats, NodeWork, Op, OutOfMemory, SplitWork, TensorRef,
    WeightId, WeightStore, WeightView,
};
use minfer::quants::GgmlType;
use minfer::workers::Pool;
use minfer::backends::cpu::kernels::RopeTables;

/// The byte every stored byte is XORed with.
pub const KEY: u8 = 0xA5;

/// The device name the registry entry reports.
pub const DEVICE_NAME: &str = "test backend";

/// The offset alignment the test backend asks of the planner (larger than the CPU's 64, as a
/// device's would be, so per-backend alignment is exercised).
pub const ALIGNMENT: usize = 256;

// ---------------------------------------------------------------------------------------------
// Placements
// ---------------------------------------------------------------------------------------------

/// Which nodes the test backend claims. A placement is a type so that its claim can become a
/// plain `fn` pointer ([`supports::<P>`](supports)) for the registry's [`Capabilities`] and the
/// registry's [`create`](BackendEntry::create) function.
pub trait Placement: 'static {
    /// A short name for reports.
    const NAME: &'static str;
    /// Does the test backend take `node`? (It is then also limited to what the CPU kernels
    /// implement, see [`supports`].)
    fn claims(node: &CNode) -> bool;
}

/// Every node, inputs included: the whole graph runs on the test backend.
pub struct Everything;
impl Placement for Everything {
    const NAME: &'static str = "everything";
    fn claims(_: &CNode) -> bool {
        true
    }
}

/// Only the matrix products (`Op::MatMul`); everything else stays on the CPU.
pub struct MatMuls;
impl Placement for MatMuls {
    const NAME: &'static str = "matmuls";
    fn claims(node: &CNode) -> bool {
        node.op == Op::MatMul
    }
}

/// The nodes of the odd layers (`layer == Some(l)`, `l % 2 == 1`); the embedding, the head,
/// the inputs and the even layers stay on the CPU.
pub struct OddLayers;
impl Placement for OddLayers {
    const NAME: &'static str = "odd layers";
    fn claims(node: &CNode) -> bool {
        node.layer.is_some_and(|l| l % 2 == 1)
    }
}

/// Nothing: the test backend is enabled but idle.
pub struct Nothing;
impl Placement for Nothing {
    const NAME: &'static str = "nothing";
    fn claims(_: &CNode) -> bool {
        false
    }
}

/// The test backend's capability: `P` claims the node and the CPU kernels implement it.
pub fn supports<P: Placement>(node: &CNode) -> bool {
    P::claims(node) && cpu::cpu_supports_node(node)
}

/// The fused kernels the test backend has: those of the CPU kernels it runs.
pub fn supports_fused(fused: FusedOp) -> bool {
    cpu::cpu_supports_fused(fused)
}

/// The capability matrix of placement `P`, as the registry advertises it.
pub fn capabilities<P: Placement>() -> Capabilities {
    Capabilities { supports_node: supports::<P>, supports_fused }
}

// ---------------------------------------------------------------------------------------------
// Registry and construction
// ---------------------------------------------------------------------------------------------

/// This build's registry ([`minfer::backends::registry`]) with the entry of `handle` (a device
/// handle: `Backend::CUDA` or `Backend::METAL`, not the CPU) turned into the test backend of
/// placement `P`: compiled in, probed `Ok(DeviceInfo { name: "test backend" })`, with `P`'s
/// capabilities and [`create::<P, id>`](create). The entry keeps the handle's built-in name and
/// priority (so `Display` and the fence agree).
pub fn registry_with<P: Placement>(handle: Backend) -> BackendRegistry {
    let entries = minfer::backends::registry()
        .entries()
        .iter()
        .cloned()
        .map(|mut e: BackendEntry| {
            if e.handle == handle {
                e.compiled_in = true;
                e.probed = Ok(DeviceInfo { name: DEVICE_NAME.to_string(), memory_bytes: None });
                e.capabilities = Some(capabilities::<P>());
                e.create = match handle {
                    Backend::METAL => Some(create::<P, 1>),
                    _ => Some(create::<P, 2>),
                };
            }
            e
        })
        .collect();
    BackendRegistry::new(entries)
}

/// The registry's create function for placement `P` under the handle of id `H`
/// ([`minfer::graph::registry::CreateFn`] has no handle parameter, so the handle is part of
/// the instantiation: [`registry_with`] picks `create::<P, 1>` for Metal, `create::<P, 2>` for
/// CUDA). Uses `config`'s workers (or a new pool of `n_threads`) and cap.
pub fn create<P: Placement, const H: u16>(_info: &DeviceInfo, config: &BackendConfig) -> Result<Box<dyn BackendImpl>, GraphError> {
    let handle = Backend::from_id(H).ok_or_else(|| GraphError::BackendUnusable { name: DEVICE_NAME.into(), reason: format!("no backend id {H}") })?;
    let pool = match &config.workers {
        Some(p) => p.clone(),
        None => Arc::new(
            Pool::new(config.n_threads.max(1)).map_err(|e| GraphError::BackendUnusable { name: DEVICE_NAME.into(), reason: e.to_string() })?,
        ),
    };
    Ok(Box::new(TestBackend::new::<P>(handle, pool).with_cap(config.memory_cap)))
}

/// An allocator over [`registry_with::<P>(handle)`](registry_with), no fence, with the CPU
/// backend and a [`TestBackend`] of placement `P` under `handle` enabled, both on `pool`'s
/// workers and both running their kernels with `isa`; returns it with the test backend's
/// counters. Hand it to `Engine::with_allocator`. With [`Nothing`] it is a CPU-only engine
/// (the test backend idle), the reference for a placement run with the same `isa`.
pub fn allocator<P: Placement>(handle: Backend, pool: Arc<Pool>, isa: KernelIsa) -> Result<(GraphAllocator, CounterHandle), GraphError> {
    let mut alloc = GraphAllocator::new(registry_with::<P>(handle), BackendFence::all());
    alloc.enable_backend(Backend::CPU, Box::new(cpu::CpuBackend::with_pool(pool.clone()).with_isa(isa)))?;
    let backend = TestBackend::new::<P>(handle, pool).with_isa(isa);
    let counters = backend.counters();
    alloc.enable_backend(handle, Box::new(backend))?;
    Ok((alloc, counters))
}

// ---------------------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------------------

/// What the test backend did, counted since creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// `set_tensor` calls (host → backend: input fills, staged cross-backend sources, KV writes).
    pub set_tensor: u64,
    pub bytes_set: u64,
    /// `get_tensor` calls (backend → host: staged sources for another backend, read-backs).
    pub get_tensor: u64,
    pub bytes_got: u64,
    /// `copy_tensor` calls (inside the backend: KV row moves).
    pub copy_tensor: u64,
    /// `synchronize` calls.
    pub synchronize: u64,
    /// Splits computed (`compute` calls).
    pub splits: u64,
    /// Work items executed (every node of every split, `kv_load` views included).
    pub nodes: u64,
    /// Work items executed per op name (`"mul_mat"`, `"kv_store"`...).
    pub nodes_by_op: BTreeMap<&'static str, u64>,
    /// Weights uploaded by `load_weights`, and their bytes.
    pub weights_loaded: u64,
    pub weight_bytes: u64,
    /// The allocation counters, mirrored from [`BackendImpl::memory`].
    pub memory: MemoryStats,
}

impl Counters {
    /// The counts of `self` minus those of `earlier` (a snapshot taken before); the memory
    /// stats are `self`'s.
    pub fn since(&self, earlier: &Counters) -> Counters {
        let mut by_op = self.nodes_by_op.clone();
        for (op, n) in &earlier.nodes_by_op {
            if let Some(v) = by_op.get_mut(op) {
                *v = v.saturating_sub(*n);
            }
        }
        by_op.retain(|_, n| *n > 0);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Counters {
            set_tensor: d(self.set_tensor, earlier.set_tensor),
            bytes_set: d(self.bytes_set, earlier.bytes_set),
            get_tensor: d(self.get_tensor, earlier.get_tensor),
            bytes_got: d(self.bytes_got, earlier.bytes_got),
            copy_tensor: d(self.copy_tensor, earlier.copy_tensor),
            synchronize: d(self.synchronize, earlier.synchronize),
            splits: d(self.splits, earlier.splits),
            nodes: d(self.nodes, earlier.nodes),
            nodes_by_op: by_op,
            weights_loaded: d(self.weights_loaded, earlier.weights_loaded),
            weight_bytes: d(self.weight_bytes, earlier.weight_bytes),
            memory: self.memory,
        }
    }
}

/// A shared view of a test backend's [`Counters`], readable while (and after) an engine owns
/// the backend.
#[derive(Debug, Clone, Default)]
pub struct CounterHandle(Arc<Mutex<Counters>>);

impl CounterHandle {
    /// A copy of the counters now.
    pub fn snapshot(&self) -> Counters {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

// ---------------------------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------------------------

/// Bytes in the test backend's own layout: logical byte `p` is stored at `p ^ 3` (each 4-byte
/// word byte-reversed) XORed with [`KEY`]. The storage is padded to whole words.
#[derive(Clone)]
pub struct Scrambled {
    raw: Vec<u8>,
    len: usize,
}

impl Scrambled {
    /// `len` logical zero bytes.
    pub fn zeroed(len: usize) -> Scrambled {
        Scrambled { raw: vec![KEY; len.div_ceil(4) * 4], len }
    }

    /// A scrambled copy of `data`.
    pub fn from_plain(data: &[u8]) -> Scrambled {
        let mut s = Scrambled::zeroed(data.len());
        let _ = s.write(0, data);
        s
    }

    /// The stored bytes (the backend's own layout, padded to whole words): for tests that
    /// check nothing is kept in the host's layout.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// Logical length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads logical bytes `at..at + out.len()`; `false` (and nothing read) when they are not
    /// all inside.
    pub fn read(&self, at: usize, out: &mut [u8]) -> bool {
        if at.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        let n = out.len();
        let mut i = 0;
        while i < n && !(at + i).is_multiple_of(4) {
            out[i] = self.raw[(at + i) ^ 3] ^ KEY;
            i += 1;
        }
        let words = (n - i) / 4;
        let (body, _) = out[i..].split_at_mut(words * 4);
        for (o, s) in body.chunks_exact_mut(4).zip(self.raw[at + i..at + i + words * 4].chunks_exact(4)) {
            let w = u32::from_le_bytes([s[0], s[1], s[2], s[3]]).swap_bytes() ^ u32::from_ne_bytes([KEY; 4]);
            o.copy_from_slice(&w.to_le_bytes());
        }
        i += words * 4;
        while i < n {
            out[i] = self.raw[(at + i) ^ 3] ^ KEY;
            i += 1;
        }
        true
    }

    /// Writes `data` at logical byte `at`; `false` (and nothing written) when it does not fit.
    pub fn write(&mut self, at: usize, data: &[u8]) -> bool {
        if at.checked_add(data.len()).is_none_or(|end| end > self.len) {
            return false;
        }
        let n = data.len();
        let mut i = 0;
        while i < n && !(at + i).is_multiple_of(4) {
            self.raw[(at + i) ^ 3] = data[i] ^ KEY;
            i += 1;
        }
        let words = (n - i) / 4;
        for (s, d) in self.raw[at + i..at + i + words * 4].chunks_exact_mut(4).zip(data[i..i + words * 4].chunks_exact(4)) {
            let w = u32::from_le_bytes([d[0], d[1], d[2], d[3]]).swap_bytes() ^ u32::from_ne_bytes([KEY; 4]);
            s.copy_from_slice(&w.to_le_bytes());
        }
        i += words * 4;
        while i < n {
            self.raw[(at + i) ^ 3] = data[i] ^ KEY;
            i += 1;
        }
        true
    }
}

/// A host copy of a region, 8-byte aligned (kernels view it as f32 / i32 / f16 cells).
struct HostCopy {
    words: Vec<u64>,
    len: usize,
}

impl HostCopy {
    fn zeroed(len: usize) -> HostCopy {
        HostCopy { words: vec![0u64; len.div_ceil(8)], len }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }
}

/// A weight as the test backend holds it.
enum DeviceWeight {
    /// A matrix's blocks.
    Matrix { ty: GgmlType, rows: usize, cols: usize, data: Scrambled },
    /// A 1-D float weight: `n` f32 values (little-endian).
    Vector { n: usize, data: Scrambled },
}

/// Host copies of the weights one node names, downloaded for its kernel.
#[derive(Default)]
struct StagedWeights {
    matrices: BTreeMap<WeightId, (GgmlType, usize, usize, HostCopy)>,
    vectors: BTreeMap<WeightId, Vec<f32>>,
    names: BTreeMap<WeightId, String>,
}

impl Weights for StagedWeights {
    fn matrix(&self, id: WeightId) -> Result<WeightView<'_>, GraphError> {
        match self.matrices.get(&id) {
            Some((ty, rows, cols, data)) => Ok(WeightView { ty: *ty, data: data.bytes(), rows: *rows, cols: *cols }),
            None => Err(GraphError::MissingWeight { name: self.name(id), what: "a 2-D tensor on the test backend" }),
        }
    }

    fn vector(&self, id: WeightId) -> Result<&[f32], GraphError> {
        match self.vectors.get(&id) {
            Some(v) => Ok(v),
            None => Err(GraphError::MissingWeight { name: self.name(id), what: "a 1-D float tensor on the test backend" }),
        }
    }

    fn name(&self, id: WeightId) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| format!("tensor #{}", id.0))
    }
}

// ---------------------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------------------

/// A backend whose memory the host cannot see (see the module docs).
pub struct TestBackend {
    handle: Backend,
    supports: fn(&CNode) -> bool,
    buffers: BTreeMap<u32, Scrambled>,
    next_id: u32,
    stats: MemoryStats,
    cap: Option<usize>,
    weights: BTreeMap<WeightId, DeviceWeight>,
    /// `loaded[id]`: weight `id` was offered (and uploaded).
    loaded: Vec<bool>,
    /// Every tensor name of the model file, for errors.
    names: Vec<String>,
    pool: Arc<Pool>,
    isa: KernelIsa,
    counters: CounterHandle,
    /// RoPE tables, as the CPU backend keeps them.
    rope: RopeTables,
}

impl TestBackend {
    /// A test backend under `handle` claiming what placement `P` claims (and the CPU kernels
    /// implement), running kernels on `pool`.
    pub fn new<P: Placement>(handle: Backend, pool: Arc<Pool>) -> TestBackend {
        TestBackend::with_supports(handle, supports::<P>, pool)
    }

    /// A test backend whose capability is `supports` as given (the caller makes sure the CPU
    /// kernels implement what it claims; `compute` refuses a node they do not).
    pub fn with_supports(handle: Backend, supports: fn(&CNode) -> bool, pool: Arc<Pool>) -> TestBackend {
        TestBackend {
            handle,
            supports,
            buffers: BTreeMap::new(),
            next_id: 0,
            stats: MemoryStats::default(),
            cap: None,
            weights: BTreeMap::new(),
            loaded: Vec::new(),
            names: Vec::new(),
            pool,
            isa: KernelIsa::Detected,
            counters: CounterHandle::default(),
            rope: RopeTables::default(),
        }
    }

    /// Runs the kernels with `isa` (default [`KernelIsa::Detected`], the CPU backend's own
    /// choice). On x86 the SIMD matrix products follow ggml's x86 float order, which is *not*
    /// the scalar reference's (`tests/matmul_real.rs` bounds the difference, it does not
    /// assert bits), so results bit-identical to a CPU backend need the same ISA on both.
    pub fn with_isa(mut self, isa: KernelIsa) -> TestBackend {
        self.isa = isa;
        self
    }

    /// The ISA the kernels run with.
    pub fn isa(&self) -> KernelIsa {
        self.isa
    }

    /// Refuses allocations past `cap` bytes in total ([`OutOfMemory`]).
    pub fn with_cap(mut self, cap: Option<usize>) -> TestBackend {
        self.cap = cap;
        self.stats.capacity = cap;
        self
    }

    /// The shared counters (clone the handle before handing the backend to an allocator).
    pub fn counters(&self) -> CounterHandle {
        self.counters.clone()
    }

    pub fn handle(&self) -> Backend {
        self.handle
    }

    fn sync_memory(&self) {
        let stats = self.memory();
        self.counters.update(|c| c.memory = stats);
    }

    /// The stored buffer of `t`, after checking that `t` is on this backend, names a live
    /// buffer and lies inside it, and that `offset..offset + len` lies inside `t`. Returns the
    /// buffer and the absolute byte offset.
    fn locate(&self, t: TensorRef, offset: usize, len: usize) -> Result<(&Scrambled, usize), GraphError> {
        if t.buf.backend != self.handle {
            return Err(GraphError::BackendMismatch { node: format!("buffer {}", t.buf.id.0), split: self.handle, buffer: t.buf.backend });
        }
        let buf = self.buffers.get(&t.buf.id.0).ok_or(GraphError::BadBufferId { backend: self.handle, id: t.buf.id })?;
        if t.offset.checked_add(t.bytes).is_none_or(|end| end > buf.len()) {
            return Err(GraphError::TensorRange { backend: self.handle, offset: t.offset, bytes: t.bytes, size: buf.len() });
        }
        if offset.checked_add(len).is_none_or(|end| end > t.bytes) {
            return Err(GraphError::TensorRange { backend: self.handle, offset, bytes: len, size: t.bytes });
        }
        Ok((buf, t.offset + offset))
    }

    /// A host copy of the whole region `t`.
    fn download(&self, t: TensorRef) -> Result<HostCopy, GraphError> {
        let (buf, at) = self.locate(t, 0, t.bytes)?;
        let mut host = HostCopy::zeroed(t.bytes);
        match buf.read(at, host.bytes_mut()) {
            true => Ok(host),
            false => Err(GraphError::TensorRange { backend: self.handle, offset: at, bytes: t.bytes, size: buf.len() }),
        }
    }

    /// Writes `data` over the whole region `t`.
    fn upload(&mut self, t: TensorRef, data: &[u8]) -> Result<(), GraphError> {
        if data.len() != t.bytes {
            return Err(GraphError::TensorRange { backend: self.handle, offset: 0, bytes: data.len(), size: t.bytes });
        }
        self.write_at(t, 0, data)
    }

    fn write_at(&mut self, t: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        let (_, at) = self.locate(t, offset, data.len())?;
        let handle = self.handle;
        let buf = self.buffers.get_mut(&t.buf.id.0).ok_or(GraphError::BadBufferId { backend: handle, id: t.buf.id })?;
        let size = buf.len();
        match buf.write(at, data) {
            true => Ok(()),
            false => Err(GraphError::TensorRange { backend: handle, offset: at, bytes: data.len(), size }),
        }
    }

    /// Host copies of the weights `node` names (each must have been offered).
    fn stage_weights(&self, node: &CNode) -> Result<StagedWeights, GraphError> {
        let mut staged = StagedWeights::default();
        for id in node.weights() {
            let name = self.names.get(id.0 as usize).cloned().unwrap_or_else(|| format!("tensor #{}", id.0));
            let not_loaded = || GraphError::WeightNotLoaded { node: node.name.clone(), weight: name.clone(), backend: self.handle };
            if !self.loaded.get(id.0 as usize).copied().unwrap_or(false) {
                return Err(not_loaded());
            }
            match self.weights.get(&id).ok_or_else(not_loaded)? {
                DeviceWeight::Matrix { ty, rows, cols, data } => {
                    let mut host = HostCopy::zeroed(data.len());
                    data.read(0, host.bytes_mut());
                    staged.matrices.insert(id, (*ty, *rows, *cols, host));
                }
                DeviceWeight::Vector { n, data } => {
                    let mut host = HostCopy::zeroed(data.len());
                    data.read(0, host.bytes_mut());
                    let v: Vec<f32> = host.bytes().chunks_exact(4).take(*n).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                    staged.vectors.insert(id, v);
                }
            }
            staged.names.insert(id, name);
        }
        Ok(staged)
    }

    fn ctx<'a>(&'a self, weights: &'a StagedWeights) -> KernelCtx<'a> {
        KernelCtx { weights: Some(weights as &dyn Weights), loaded: &self.loaded, packed: &[], pool: Some(&self.pool), isa: self.isa, rope: &self.rope }
    }

    fn run_node(&mut self, node: &CNode, w: &NodeWork) -> Result<(), GraphError> {
        // Every region the node touches must be this backend's and in bounds.
        for t in w.srcs.iter().chain([&w.out]).chain(w.kv.iter().flat_map(|p| [&p.k, &p.v])) {
            self.locate(*t, 0, t.bytes)?;
        }
        let kv = || -> Result<KvPair, GraphError> { w.kv.ok_or_else(|| GraphError::KvMissing { node: node.name.clone(), layer: node.kv_layer().unwrap_or(0) }) };
        let disjoint_from_kv = |pair: &KvPair, ts: &[TensorRef]| -> Result<(), GraphError> {
            match ts.iter().any(|t| t.overlaps(&pair.k) || t.overlaps(&pair.v)) || pair.k.overlaps(&pair.v) {
                true => Err(GraphError::KvAliased { node: node.name.clone() }),
                false => Ok(()),
            }
        };
        match &node.op {
            // Host-filled; never listed in a split's work.
            Op::Input => Ok(()),
            // A view of the layer's K region: nothing to compute.
            Op::KvcacheLoad { .. } => Ok(()),
            Op::KvcacheStore { .. } => {
                let pair = kv()?;
                let [k, v, pos] = minfer::graph::operands(node, &w.srcs)?;
                disjoint_from_kv(&pair, &[k, v, pos])?;
                let (k, v, pos) = (self.download(k)?, self.download(v)?, self.download(pos)?);
                let (mut kr, mut vr) = (self.download(pair.k)?, self.download(pair.v)?);
                exec::kv_store(node, (k.bytes(), v.bytes(), pos.bytes()), (kr.bytes_mut(), vr.bytes_mut()))?;
                self.upload(pair.k, kr.bytes())?;
                self.upload(pair.v, vr.bytes())
            }
            Op::KvShift { .. } => {
                let pair = kv()?;
                let deltas = *w.srcs.first().ok_or(GraphError::OperandCount { node: node.name.clone(), expected: 1, got: 0 })?;
                disjoint_from_kv(&pair, &[deltas])?;
                let deltas = self.download(deltas)?;
                let mut kr = self.download(pair.k)?;
                exec::kv_shift(node, self.isa.isa(), deltas.bytes(), kr.bytes_mut())?;
                self.upload(pair.k, kr.bytes())
            }
            Op::Attn => {
                let pair = kv()?;
                let (q, view, pos, cells) = minfer::graph::attn_operands(node, &w.srcs)?;
                // The view operand is the layer's K region itself (the kv_load node).
                if view.buf != pair.k.buf || view.range() != pair.k.range() {
                    return Err(GraphError::AttnKvSource { node: node.name.clone(), kv: format!("buffer {} @{}", view.buf.id.0, view.offset), layer: node.kv_layer().unwrap_or(0) });
                }
                let mut read = vec![q, pos, w.out];
                read.extend(cells);
                disjoint_from_kv(&pair, &read)?;
                self.check_out_size(node, w.out)?;
                let (q, pos, k, v) = (self.download(q)?, self.download(pos)?, self.download(pair.k)?, self.download(pair.v)?);
                let cells = cells.map(|c| self.download(c)).transpose()?;
                let mut dst = self.download(w.out)?;
                let staged = StagedWeights::default();
                let ins = (q.bytes(), pos.bytes(), cells.as_ref().map(|c| c.bytes()));
                exec::attention(node, &self.ctx(&staged), ins, (k.bytes(), v.bytes()), dst.bytes_mut())?;
                self.upload(w.out, dst.bytes())
            }
            Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::GeGLU | Op::RmsNorm { .. } | Op::QkNorm { .. } | Op::MatMul | Op::GetRows | Op::RoPE { .. } => {
                self.check_out_size(node, w.out)?;
                let out = w.out;
                // In place: a source that *is* the output region is passed as `Aliased` (the
                // kernel reads the output's current value); any other overlap is refused.
                let mut copies: Vec<Option<HostCopy>> = Vec::with_capacity(w.srcs.len());
                for s in &w.srcs {
                    let aliased = s.buf == out.buf && s.range() == out.range();
                    if !aliased && s.overlaps(&out) {
                        return Err(GraphError::KvAliased { node: node.name.clone() });
                    }
                    copies.push(if aliased { None } else { Some(self.download(*s)?) });
                }
                let operands: Vec<Operand> = copies.iter().map(|c| c.as_ref().map_or(Operand::Aliased, |h| Operand::Buf(h.bytes()))).collect();
                let mut dst = self.download(out)?;
                let staged = self.stage_weights(node)?;
                exec::run(node, &self.ctx(&staged), &operands, dst.bytes_mut())?;
                drop(operands);
                self.upload(out, dst.bytes())
            }
        }
    }

    /// An output region must hold exactly the node's values.
    fn check_out_size(&self, node: &CNode, out: TensorRef) -> Result<(), GraphError> {
        let want = node.out_dtype.bytes_for(node.n_elements());
        match out.bytes == want && out.dtype == node.out_dtype {
            true => Ok(()),
            false => Err(GraphError::TensorRange { backend: self.handle, offset: out.offset, bytes: want, size: out.bytes }),
        }
    }
}

impl BackendImpl for TestBackend {
    fn supports_node(&self, node: &CNode) -> bool {
        (self.supports)(node)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        supports_fused(fused)
    }

    fn alignment(&self) -> usize {
        ALIGNMENT
    }

    fn alloc_buffer(&mut self, bytes: usize, usage: BufferUsage) -> Result<BufferId, OutOfMemory> {
        let oom = OutOfMemory { backend: self.handle, requested: bytes, usage, in_use: self.stats.bytes_in_use, capacity: self.cap };
        if self.cap.is_some_and(|cap| self.stats.bytes_in_use.saturating_add(bytes) > cap) {
            return Err(oom);
        }
        let mut raw = Vec::new();
        if raw.try_reserve_exact(bytes.div_ceil(4) * 4).is_err() {
            return Err(oom);
        }
        raw.resize(bytes.div_ceil(4) * 4, KEY);
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).ok_or(oom)?;
        self.buffers.insert(id, Scrambled { raw, len: bytes });
        self.stats.allocations += 1;
        self.stats.bytes_in_use += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.bytes_in_use);
        self.sync_memory();
        Ok(BufferId(id))
    }

    fn free_buffer(&mut self, id: BufferId) {
        if let Some(b) = self.buffers.remove(&id.0) {
            self.stats.frees += 1;
            self.stats.bytes_in_use -= b.len();
            self.sync_memory();
        }
    }

    fn buffer_size(&self, id: BufferId) -> Option<usize> {
        self.buffers.get(&id.0).map(Scrambled::len)
    }

    fn memory(&self) -> MemoryStats {
        MemoryStats { capacity: self.cap, ..self.stats }
    }

    fn set_tensor(&mut self, dst: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        self.write_at(dst, offset, data)?;
        self.counters.update(|c| {
            c.set_tensor += 1;
            c.bytes_set += data.len() as u64;
        });
        Ok(())
    }

    fn get_tensor(&mut self, src: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let (buf, at) = self.locate(src, offset, out.len())?;
        if !buf.read(at, out) {
            return Err(GraphError::TensorRange { backend: self.handle, offset: at, bytes: out.len(), size: buf.len() });
        }
        self.counters.update(|c| {
            c.get_tensor += 1;
            c.bytes_got += out.len() as u64;
        });
        Ok(())
    }

    fn copy_tensor(&mut self, src: TensorRef, dst: TensorRef) -> Result<(), GraphError> {
        if src.bytes != dst.bytes {
            return Err(GraphError::TensorRange { backend: self.handle, offset: dst.offset, bytes: src.bytes, size: dst.bytes });
        }
        self.locate(dst, 0, dst.bytes)?;
        // Through a temporary: overlapping regions behave as `memmove`.
        let data = self.download(src)?;
        self.upload(dst, data.bytes())?;
        self.counters.update(|c| c.copy_tensor += 1);
        Ok(())
    }

    fn load_weights(&mut self, store: &Arc<WeightStore>, ids: &[WeightId]) -> Result<(), GraphError> {
        self.names = store.file().tensors().iter().map(|t| t.name.clone()).collect();
        let (mut n, mut bytes) = (0u64, 0u64);
        for &id in ids {
            // Vectors (norm weights, biases) as the store's f32 values; matrices as their blocks.
            let weight = match store.vector(id) {
                Ok(v) => DeviceWeight::Vector { n: v.len(), data: Scrambled::from_plain(bytemuck::cast_slice(v)) },
                Err(_) => {
                    let m = store.matrix(id)?;
                    DeviceWeight::Matrix { ty: m.ty, rows: m.rows, cols: m.cols, data: Scrambled::from_plain(m.data) }
                }
            };
            bytes += match &weight {
                DeviceWeight::Matrix { data, .. } | DeviceWeight::Vector { data, .. } => data.len() as u64,
            };
            n += 1;
            self.weights.insert(id, weight);
            let i = id.0 as usize;
            if self.loaded.len() <= i {
                self.loaded.resize(i + 1, false);
            }
            self.loaded[i] = true;
        }
        self.counters.update(|c| {
            c.weights_loaded += n;
            c.weight_bytes += bytes;
        });
        Ok(())
    }

    fn compute(&mut self, split: &SplitWork) -> Result<(), GraphError> {
        if split.backend != self.handle {
            return Err(GraphError::BackendMismatch { node: "split".into(), split: self.handle, buffer: split.backend });
        }
        self.counters.update(|c| c.splits += 1);
        for w in split.nodes {
            let node = split.node(w)?;
            // The kernels are the CPU's: refuse what they do not implement, by name.
            if !cpu::cpu_supports_node(node) {
                return Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() });
            }
            self.run_node(node, w)?;
            let op = node.op.name();
            self.counters.update(|c| {
                c.nodes += 1;
                *c.nodes_by_op.entry(op).or_default() += 1;
            });
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), GraphError> {
        self.counters.update(|c| c.synchronize += 1);
        Ok(())
    }
}
