//! The CPU backend: host buffers, its capability matrix and its split execution.
//!
//! Buffers are [`HostBuffer`]s (zero-filled, 64-byte aligned, fallible); an optional byte cap
//! (`MINFER_CPU_MEMORY_CAP`, or [`BackendConfig::memory_cap`]) makes the backend refuse what
//! does not fit, as a device with that much memory would. Weights stay in the model's memory
//! map: [`load_weights`](BackendImpl::load_weights) only records which ids were offered. A
//! split runs node by node on the worker pool; a node's output region is borrowed mutably from
//! its buffer while its operands are borrowed from the rest of that buffer or from other ones
//! (the allocator never places an operand across an output, except the in-place alias).

pub mod buffer;
pub mod exec;
pub mod kernels;

use std::sync::Arc;

use self::buffer::HostBuffer;
use self::exec::{KernelCtx, KernelIsa, Operand};
use crate::graph::{
    Backend, BackendConfig, BackendImpl, BufferId, BufferUsage, CNode, Capabilities, DType, DeviceInfo, FusedOp, GraphError,
    MemoryStats, NodeWork, Op, OutOfMemory, SplitWork, TensorRef, Unavailable, WeightId, WeightStore, attn_operands, operands,
};
use crate::quants::packed::PackedMatrix;
use crate::quants::simd::Kernels;
use crate::workers::Pool;

/// Environment variable that turns the load-time repacking off (`0`): one-token products
/// then read the file's blocks (A/B measurements; the answers are the same bits either way).
pub const REPACK_ENV: &str = "MINFER_REPACK";

/// Environment variable capping the CPU backend's allocations (bytes; `K`, `M`, `G` suffixes).
pub const MEMORY_CAP_ENV: &str = "MINFER_CPU_MEMORY_CAP";

/// The CPU capability matrix: every op the kernels implement, on F32 activations with I32
/// ids/positions and KV regions of any [`KvType`](crate::graph::KvType); RoPE only in the
/// styles [`exec::rope_supported`] names.
pub fn cpu_supports_node(node: &CNode) -> bool {
    match &node.op {
        Op::Input => true,
        Op::KvcacheStore { .. } | Op::KvcacheLoad { .. } => true,
        Op::KvShift { .. } => exec::rope_supported(node),
        Op::RoPE { .. } => node.out_dtype == DType::F32 && exec::rope_supported(node),
        Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::GeGLU | Op::RmsNorm { .. } | Op::QkNorm { .. } | Op::MatMul | Op::GetRows | Op::Attn => {
            node.out_dtype == DType::F32
        }
    }
}

/// The CPU runs SwiGLU as one pass.
pub fn cpu_supports_fused(fused: FusedOp) -> bool {
    match fused {
        FusedOp::SwiGLU | FusedOp::GeGLU => true,
    }
}

/// What the registry advertises for the CPU (the trait methods forward to the same functions).
pub const CAPABILITIES: Capabilities = Capabilities { supports_node: cpu_supports_node, supports_fused: cpu_supports_fused };

/// The CPU is always there: its name (from `/proc/cpuinfo` where readable) and the memory the
/// system reports.
pub fn probe() -> Result<DeviceInfo, Unavailable> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_bytes = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024);
    Ok(DeviceInfo { name, memory_bytes })
}

/// Creates the CPU backend: `config`'s workers (or a new pool of `n_threads`) and cap (or
/// `MINFER_CPU_MEMORY_CAP`).
pub fn create(_info: &DeviceInfo, config: &BackendConfig) -> Result<Box<dyn BackendImpl>, GraphError> {
    let pool = match &config.workers {
        Some(p) => p.clone(),
        None => Arc::new(Pool::new(config.n_threads.max(1)).map_err(|e| GraphError::BackendUnusable { name: "cpu".into(), reason: e.to_string() })?),
    };
    let cap = match config.memory_cap {
        Some(c) => Some(c),
        None => memory_cap_from_env()?,
    };
    Ok(Box::new(CpuBackend { pool: Some(pool), cap, ..CpuBackend::default() }))
}

/// `MINFER_CPU_MEMORY_CAP` parsed (`"512M"`, `"2G"`, `"1000000"`); a malformed value is an error.
pub fn memory_cap_from_env() -> Result<Option<usize>, GraphError> {
    memory_cap_from_var(MEMORY_CAP_ENV, "cpu")
}

/// A backend's memory-cap variable `var` parsed as [`memory_cap_from_env`] does; errors name
/// `backend`.
pub fn memory_cap_from_var(var: &str, backend: &str) -> Result<Option<usize>, GraphError> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => parse_bytes(&v)
            .map(Some)
            .ok_or_else(|| GraphError::BackendUnusable { name: backend.into(), reason: format!("{var}='{}' is not a byte count (e.g. 512M, 2G)", v.chars().take(40).collect::<String>()) }),
        _ => Ok(None),
    }
}

/// `"512M"` → 512 MiB; plain digits are bytes.
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(mult)
}

/// The CPU backend.
#[derive(Default)]
pub struct CpuBackend {
    buffers: Vec<Option<HostBuffer>>,
    stats: MemoryStats,
    cap: Option<usize>,
    weights: Option<Arc<WeightStore>>,
    /// `loaded[id]`: weight `id` was offered.
    loaded: Vec<bool>,
    /// `packed[id]`: matrix `id` repacked for one-token products (see [`PackedMatrix`]),
    /// where the kernels have packed products.
    packed: Vec<Option<Arc<PackedMatrix>>>,
    pool: Option<Arc<Pool>>,
    isa: Option<KernelIsa>,
    /// RoPE tables shared by the rotations of a pass (see [`kernels::RopeTables`]).
    rope: kernels::RopeTables,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("buffers", &self.buffers.iter().flatten().count())
            .field("stats", &self.stats)
            .field("weights", &self.weights.is_some())
            .field("threads", &self.pool.as_ref().map(|p| p.n_threads()))
            .finish()
    }
}

impl CpuBackend {
    /// A backend without weights or workers (graph tests of element-wise ops).
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    /// A backend with `pool`'s workers.
    pub fn with_pool(pool: Arc<Pool>) -> CpuBackend {
        CpuBackend { pool: Some(pool), ..CpuBackend::default() }
    }

    /// Refuses allocations past `cap` bytes in total.
    pub fn with_cap(mut self, cap: Option<usize>) -> CpuBackend {
        self.stats.capacity = cap;
        self.cap = cap;
        self
    }

    /// Runs every kernel with the scalar reference (tests, A/B checks).
    pub fn with_isa(mut self, isa: KernelIsa) -> CpuBackend {
        self.isa = Some(isa);
        self
    }

    fn buffer(&self, id: BufferId) -> Result<&HostBuffer, GraphError> {
        self.buffers.get(id.0 as usize).and_then(Option::as_ref).ok_or(GraphError::BadBufferId { backend: Backend::CPU, id })
    }

    fn check(&self, t: TensorRef, offset: usize, len: usize) -> Result<std::ops::Range<usize>, GraphError> {
        let size = self.buffer(t.buf.id)?.len();
        let bad = GraphError::TensorRange { backend: Backend::CPU, offset, bytes: len, size: t.bytes };
        if t.buf.backend != Backend::CPU {
            return Err(GraphError::BackendMismatch { node: format!("buffer {}", t.buf.id.0), split: Backend::CPU, buffer: t.buf.backend });
        }
        let end = offset.checked_add(len).filter(|&e| e <= t.bytes).ok_or(bad)?;
        let range = t.offset + offset..t.offset + end;
        match range.end <= size {
            true => Ok(range),
            false => Err(GraphError::TensorRange { backend: Backend::CPU, offset: t.offset, bytes: t.bytes, size }),
        }
    }

    fn ctx(&self) -> KernelCtx<'_> {
        KernelCtx {
            weights: self.weights.as_deref().map(|w| w as &dyn exec::Weights),
            loaded: &self.loaded,
            packed: &self.packed,
            pool: self.pool.as_deref(),
            isa: self.isa.unwrap_or(KernelIsa::Detected),
            rope: &self.rope,
        }
    }

    /// Repacks the matrices that one-token passes multiply (`ids`) where their type packs
    /// ([`PackedMatrix::for_decode`]: Q4_K in llama.cpp's gemv order, Q6_K, Q5_0, Q8_0, Q4_1), the
    /// detected kernels have packed products and [`REPACK_ENV`] is not `0`. Each copy is made
    /// once per model ([`WeightStore::prepared`]) and costs about what the file's blocks cost
    /// (148 bytes per 144 of Q4_K, 212 per 210 of Q6_K, the same for Q5_0, Q8_0 and Q4_1).
    fn pack_for_decode(&mut self, store: &WeightStore, ids: &[WeightId]) -> Result<(), GraphError> {
        let off = std::env::var(REPACK_ENV).is_ok_and(|v| v == "0");
        if off || self.isa == Some(KernelIsa::Scalar) || !Kernels::active().has_packed() {
            return Ok(());
        }
        for &id in ids {
            let Ok(w) = store.matrix(id) else { continue };
            let mut failed = None;
            // Where the copy replaces the file's bytes on the usual paths, their pages are
            // released as the copy grows (they fault back in if read), so a load never holds a
            // matrix twice.
            let replaces = PackedMatrix::replaces_source(w.ty);
            let mut release = |bytes: std::ops::Range<usize>| {
                if replaces {
                    store.release_file_range(id, bytes);
                }
            };
            let packed = store.prepared(id, || {
                PackedMatrix::for_decode_releasing(w.ty, w.data, w.rows, w.cols, &mut release).unwrap_or_else(|e| {
                    failed = Some(e);
                    None
                })
            });
            if let Some(source) = failed {
                return Err(GraphError::Weight { name: store.name(id).to_string(), source });
            }
            // And once more whole (a copy made by an earlier engine, a page refaulted when a
            // run's edge shared it with the next row).
            if replaces && packed.is_some() {
                store.release_file_pages(id);
            }
            let i = id.0 as usize;
            if self.packed.len() <= i {
                self.packed.resize(i + 1, None);
            }
            self.packed[i] = packed;
        }
        Ok(())
    }

    /// Takes buffer `id` out of the table while a kernel writes it.
    fn take(&mut self, id: BufferId) -> Result<HostBuffer, GraphError> {
        self.buffers.get_mut(id.0 as usize).and_then(Option::take).ok_or(GraphError::BadBufferId { backend: Backend::CPU, id })
    }

    fn put(&mut self, id: BufferId, b: HostBuffer) {
        self.buffers[id.0 as usize] = Some(b);
    }

    /// Runs `f(dst, operands)` with `out`'s region mutable and each of `ins` borrowed: from
    /// the same buffer around the output, as [`Operand::Aliased`] when it is the output region
    /// itself, or from another buffer.
    fn with_regions<R>(
        &mut self,
        node: &CNode,
        out: TensorRef,
        ins: &[TensorRef],
        f: impl FnOnce(&KernelCtx, &mut [u8], &[Operand]) -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        let out_range = self.check(out, 0, out.bytes)?;
        for t in ins {
            self.check(*t, 0, t.bytes)?;
            if t.overlaps(&out) && t.range() != out.range() {
                return Err(GraphError::KvAliased { node: node.name.clone() });
            }
        }
        let mut buf = self.take(out.buf.id)?;
        let r = {
            let (before, rest) = buf.bytes_mut().split_at_mut(out_range.start);
            let (dst, after) = rest.split_at_mut(out_range.len());
            let (before, after): (&[u8], &[u8]) = (before, after);
            let end = out_range.end;
            let operands: Vec<Operand> = ins
                .iter()
                .map(|t| match (t.buf == out.buf, t.range()) {
                    (true, r) if r == out_range => Operand::Aliased,
                    (true, r) if r.end <= out_range.start => Operand::Buf(&before[r]),
                    (true, r) => Operand::Buf(&after[r.start - end..r.end - end]),
                    (false, r) => Operand::Buf(self.buffers[t.buf.id.0 as usize].as_ref().map_or(&[][..], |b| &b.bytes()[r])),
                })
                .collect();
            f(&self.ctx(), dst, &operands)
        };
        self.put(out.buf.id, buf);
        r
    }

    fn run_node(&mut self, node: &CNode, w: &NodeWork) -> Result<(), GraphError> {
        let kv = || w.kv.ok_or_else(|| GraphError::KvMissing { node: node.name.clone(), layer: node.kv_layer().unwrap_or(0) });
        match &node.op {
            // Host-filled before execution; never listed in a split's work.
            Op::Input => Ok(()),
            // A view: the node's region *is* the layer's K region. Nothing to compute.
            Op::KvcacheLoad { .. } => Ok(()),
            Op::KvcacheStore { .. } => {
                let pair = kv()?;
                let [k, v, pos] = operands(node, &w.srcs)?;
                if [k, v, pos].iter().any(|t| t.buf == pair.k.buf || t.buf == pair.v.buf) || pair.k.buf == pair.v.buf {
                    return Err(GraphError::KvAliased { node: node.name.clone() });
                }
                let (kr, vr) = (self.check(pair.k, 0, pair.k.bytes)?, self.check(pair.v, 0, pair.v.bytes)?);
                let ins = [self.check(k, 0, k.bytes)?, self.check(v, 0, v.bytes)?, self.check(pos, 0, pos.bytes)?];
                let (mut kb, mut vb) = (self.take(pair.k.buf.id)?, self.take(pair.v.buf.id)?);
                let r = {
                    let get = |t: &TensorRef, r: &std::ops::Range<usize>| self.buffers[t.buf.id.0 as usize].as_ref().map_or(&[][..], |b| &b.bytes()[r.clone()]);
                    exec::kv_store(node, (get(&k, &ins[0]), get(&v, &ins[1]), get(&pos, &ins[2])), (&mut kb.bytes_mut()[kr], &mut vb.bytes_mut()[vr]))
                };
                self.put(pair.k.buf.id, kb);
                self.put(pair.v.buf.id, vb);
                r
            }
            Op::KvShift { .. } => {
                let pair = kv()?;
                let deltas = *w.srcs.first().ok_or(GraphError::OperandCount { node: node.name.clone(), expected: 1, got: 0 })?;
                self.with_regions(node, pair.k, &[deltas], |cx, dst, ops| match ops {
                    [Operand::Buf(d)] => exec::kv_shift(node, cx.isa.isa(), d, dst),
                    _ => Err(GraphError::KvAliased { node: node.name.clone() }),
                })
            }
            Op::Attn => {
                let pair = kv()?;
                let (q, _view, pos, cells) = attn_operands(node, &w.srcs)?;
                let mut regions = vec![q, pos, pair.k, pair.v];
                regions.extend(cells);
                self.with_regions(node, w.out, &regions, |cx, dst, ops| match ops {
                    [Operand::Buf(q), Operand::Buf(pos), Operand::Buf(k), Operand::Buf(v)] => exec::attention(node, cx, (q, pos, None), (k, v), dst),
                    [Operand::Buf(q), Operand::Buf(pos), Operand::Buf(k), Operand::Buf(v), Operand::Buf(cells)] => {
                        exec::attention(node, cx, (q, pos, Some(cells)), (k, v), dst)
                    }
                    _ => Err(GraphError::KvAliased { node: node.name.clone() }),
                })
            }
            Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::GeGLU | Op::RmsNorm { .. } | Op::QkNorm { .. } | Op::MatMul | Op::GetRows | Op::RoPE { .. } => {
                self.with_regions(node, w.out, &w.srcs, |cx, dst, ops| exec::run(node, cx, ops, dst))
            }
        }
    }
}

impl BackendImpl for CpuBackend {
    fn supports_node(&self, node: &CNode) -> bool {
        cpu_supports_node(node)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        cpu_supports_fused(fused)
    }

    fn alignment(&self) -> usize {
        buffer::ALIGN
    }

    fn alloc_buffer(&mut self, bytes: usize, usage: BufferUsage) -> Result<BufferId, OutOfMemory> {
        let oom = OutOfMemory { backend: Backend::CPU, requested: bytes, usage, in_use: self.stats.bytes_in_use, capacity: self.cap };
        if self.cap.is_some_and(|cap| self.stats.bytes_in_use.saturating_add(bytes) > cap) {
            return Err(oom);
        }
        let buf = HostBuffer::zeroed(bytes).ok_or(oom)?;
        let id = BufferId::insert(&mut self.buffers, buf);
        self.stats.allocations += 1;
        self.stats.bytes_in_use += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.bytes_in_use);
        Ok(id)
    }

    fn free_buffer(&mut self, id: BufferId) {
        if let Some(b) = self.buffers.get_mut(id.0 as usize).and_then(Option::take) {
            self.stats.frees += 1;
            self.stats.bytes_in_use -= b.len();
        }
    }

    fn buffer_size(&self, id: BufferId) -> Option<usize> {
        self.buffer(id).ok().map(HostBuffer::len)
    }

    fn memory(&self) -> MemoryStats {
        // The repacked copies are the only weight bytes the CPU holds beside the map.
        let weight_bytes = self.packed.iter().flatten().map(|p| p.bytes()).sum();
        MemoryStats { capacity: self.cap, weight_bytes, ..self.stats }
    }

    fn set_tensor(&mut self, dst: TensorRef, offset: usize, data: &[u8]) -> Result<(), GraphError> {
        let range = self.check(dst, offset, data.len())?;
        let buf = self.buffers[dst.buf.id.0 as usize].as_mut().ok_or(GraphError::BadBufferId { backend: Backend::CPU, id: dst.buf.id })?;
        buf.bytes_mut()[range].copy_from_slice(data);
        Ok(())
    }

    fn get_tensor(&mut self, src: TensorRef, offset: usize, out: &mut [u8]) -> Result<(), GraphError> {
        let range = self.check(src, offset, out.len())?;
        out.copy_from_slice(&self.buffer(src.buf.id)?.bytes()[range]);
        Ok(())
    }

    fn copy_tensor(&mut self, src: TensorRef, dst: TensorRef) -> Result<(), GraphError> {
        if src.bytes != dst.bytes {
            return Err(GraphError::TensorRange { backend: Backend::CPU, offset: dst.offset, bytes: src.bytes, size: dst.bytes });
        }
        let (from, to) = (self.check(src, 0, src.bytes)?, self.check(dst, 0, dst.bytes)?);
        if src.buf == dst.buf {
            let buf = self.buffers[src.buf.id.0 as usize].as_mut().ok_or(GraphError::BadBufferId { backend: Backend::CPU, id: src.buf.id })?;
            buf.bytes_mut().copy_within(from, to.start);
            return Ok(());
        }
        let data = self.buffer(src.buf.id)?.bytes()[from].to_vec();
        self.set_tensor(dst, 0, &data)
    }

    fn load_weights(&mut self, store: &Arc<WeightStore>, ids: &[WeightId]) -> Result<(), GraphError> {
        // Zero-copy: the store's memory map is the CPU's copy. Resolving each id now turns a
        // missing or malformed tensor into a load-time error.
        for &id in ids {
            store.bytes(id)?;
            let i = id.0 as usize;
            if self.loaded.len() <= i {
                self.loaded.resize(i + 1, false);
            }
            self.loaded[i] = true;
        }
        self.weights = Some(store.clone());
        Ok(())
    }

    fn prepare_decode_matrices(&mut self, store: &Arc<WeightStore>, ids: &[WeightId]) -> Result<(), GraphError> {
        self.pack_for_decode(store, ids)
    }

    fn compute(&mut self, split: &SplitWork) -> Result<(), GraphError> {
        for w in split.nodes {
            let node = split.node(w)?;
            // Assignment is total: a node nobody claims lands here and is refused by name.
            if !cpu_supports_node(node) {
                return Err(GraphError::NoKernel { node: node.name.clone(), op: node.op.clone() });
            }
            self.run_node(node, w)?;
        }
        Ok(())
    }
}
