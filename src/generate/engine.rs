//! One sequence's inference state: the model, its graph cache (graph + allocator, so the KV
//! regions live here) and the number of tokens already in the KV.
//!
//! `eval` is the whole forward path of the design: build or reuse the graph for these
//! [`GraphParams`] (a prefill → decode change rebuilds once, decode steps reuse), fill the
//! inputs (token ids, positions = n_past.., tail ids), execute, and read the logits.

use std::sync::Arc;

use std::collections::{BTreeMap, BTreeSet};

use super::trace::TraceRecorder;
use crate::backends;
use crate::graph::{
    ArenaNeed, Backend, BackendConfig, BackendScheduler, CParams, ComputeGraph, FusionPass, GraphAllocator, GraphCache, GraphError, GraphParams,
    GraphType, KvType, MemoryStats, Prepared, WeightId, WeightStore,
};
use crate::models::Model;
use crate::workers::{Pool, PoolError};

pub mod kv;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineParams {
    /// KV rows (tokens of context).
    pub n_ctx: usize,
    /// The most tokens one forward pass evaluates (llama.cpp's `n_ubatch`): the compute arenas
    /// are reserved for it once, and a longer prompt is evaluated in chunks of this size.
    pub n_ubatch: usize,
    /// A cap on each backend's allocations (bytes); `None`: the device's memory (the CPU also
    /// reads `MINFER_CPU_MEMORY_CAP`).
    pub memory_cap: Option<usize>,
    pub n_threads: usize,
    /// `--backend` fence (comma-separated names); `None` reads `MINFER_BACKENDS`.
    pub backends: Option<String>,
    /// Print the splits and the op census of every execution (`MINFER_GRAPH_TRACE=1`).
    pub trace: bool,
    /// Dump every node's output for one position (`MINFER_DUMP_DIR` + `MINFER_DUMP_POS`).
    pub dump: Option<NodeDump>,
    /// How KV cells are stored (`--cache-type`, `MINFER_CACHE_TYPE`).
    pub kv_type: KvType,
}

/// A debugging dump of one evaluation: when the token at position `pos` is evaluated, every
/// executed node's output row for that token is written to `dir/<node name>.f32` (raw
/// little-endian f32; a repeated name gets `#1`, `#2`, ... appended), and `dir/index.tsv` lists
/// the files with their op and shape. Nodes without a per-token row (KV regions) are written
/// whole; nodes computed only for the output rows (the last layer's tail, the head) are skipped
/// when `pos` is not one of them. Used to compare minfer with llama.cpp's intermediate tensors
/// node by node (`tools/parity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDump {
    pub dir: std::path::PathBuf,
    pub pos: usize,
}

impl NodeDump {
    /// `MINFER_DUMP_DIR` and `MINFER_DUMP_POS`, when both are set (and the position parses).
    pub fn from_env() -> Option<NodeDump> {
        let dir = std::env::var_os("MINFER_DUMP_DIR")?;
        let pos = std::env::var("MINFER_DUMP_POS").ok()?.trim().parse().ok()?;
        Some(NodeDump { dir: dir.into(), pos })
    }

    /// Writes `node`'s output row of token `t` of an evaluation of `nt` tokens with `n_out`
    /// output rows, and its line of the index.
    fn write_node(
        &self,
        seen: &mut std::collections::HashMap<String, usize>,
        index: &mut String,
        node: &crate::graph::CNode,
        data: &[f32],
        (t, nt, n_out): (usize, usize, usize),
    ) -> std::io::Result<()> {
        use std::fmt::Write as _;
        let [width, rows, ..] = node.out_shape;
        let row = if rows == nt {
            Some(t)
        } else if rows == n_out {
            // After the tail-row gather only the last n_out tokens have rows here.
            match t.checked_sub(nt - n_out) {
                Some(r) => Some(r),
                None => return Ok(()),
            }
        } else {
            None
        };
        let values = match row {
            Some(r) if node.n_elements() == width * rows && data.len() >= (r + 1) * width => &data[r * width..(r + 1) * width],
            _ => data,
        };
        let n = seen.entry(node.name.clone()).or_insert(0);
        let file = if *n == 0 { node.name.clone() } else { format!("{}#{}", node.name, n) };
        *n += 1;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(self.dir.join(format!("{file}.f32")), bytes)?;
        let _ = writeln!(index, "{file}\t{}\t{:?}\t{}", node.op.name(), node.out_shape, values.len());
        Ok(())
    }
}

impl Default for EngineParams {
    fn default() -> Self {
        EngineParams {
            n_ctx: 4096,
            n_ubatch: DEFAULT_UBATCH,
            memory_cap: None,
            n_threads: default_threads(),
            backends: None,
            trace: trace_from_env(),
            dump: NodeDump::from_env(),
            kv_type: KvType::F32,
        }
    }
}

/// Executes the cached graph with an observer that writes the node dump and/or feeds the tracer.
fn observed_execute(
    cache: &mut GraphCache,
    sched: &BackendScheduler,
    dump: Option<&NodeDump>,
    mut tracer: Option<&mut TraceRecorder>,
    (n_past, nt, n_out): (usize, usize, usize),
) -> Result<(), EngineError> {
    let io = |d: &NodeDump, err| EngineError::Dump { dir: d.dir.display().to_string(), err };
    if let Some(d) = dump {
        std::fs::create_dir_all(&d.dir).map_err(|e| io(d, e))?;
    }
    let (mut seen, mut index, mut failed) = (Default::default(), String::new(), None);
    cache.execute_observed(sched, &mut |node, data| {
        if let Some(d) = dump
            && failed.is_none()
        {
            failed = d.write_node(&mut seen, &mut index, node, data, (d.pos - n_past, nt, n_out)).err();
        }
        if let Some(t) = tracer.as_deref_mut() {
            t.observe(node, data);
        }
    })?;
    if let Some(d) = dump {
        if let Some(err) = failed {
            return Err(io(d, err));
        }
        std::fs::write(d.dir.join("index.tsv"), index).map_err(|e| io(d, e))?;
    }
    Ok(())
}

/// Tokens per forward pass the arenas are reserved for, as llama.cpp's default `n_ubatch`.
pub const DEFAULT_UBATCH: usize = 512;

/// Logit rows per pass the reserve covers (speculative decoding verifies a few drafted tokens
/// at once); a pass asking for more grows the arena once.
pub const RESERVED_OUTPUTS: usize = 8;

/// The number of cores, at least 1.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// `MINFER_GRAPH_TRACE=1`.
pub fn trace_from_env() -> bool {
    std::env::var("MINFER_GRAPH_TRACE").is_ok_and(|v| v == "1")
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("context is full: {n_past} tokens in the KV + {n_tokens} new > n_ctx {n_ctx}")]
    ContextFull { n_past: usize, n_tokens: usize, n_ctx: usize },
    #[error("nothing to evaluate: no tokens")]
    NoTokens,
    #[error("token id {id} is not in the vocabulary ({n_vocab} tokens)")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("n_ctx must be at least 1")]
    ZeroContext,
    #[error("n_ubatch must be at least 1")]
    ZeroUbatch,
    #[error("n_out {n_out} must be between 1 and the {n_tokens} tokens evaluated")]
    BadOutputRows { n_out: usize, n_tokens: usize },
    #[error("the KV cells are not at their positions (cell {cell} holds position {pos}): apply kv_shift before evaluating")]
    KvNotAligned { cell: usize, pos: i32 },
    #[error("KV range {p0}..{p1} is not within the {n_past} cells in use")]
    KvRange { p0: usize, p1: usize, n_past: usize },
    #[error("shifting positions {p0}..{p1} by {delta} would make a position negative")]
    KvShiftBelowZero { p0: usize, p1: usize, delta: i32 },
    #[error("context shift: keeping {keep} tokens leaves no room in n_ctx {n_ctx} for {n_new} new ones")]
    ShiftTooSmall { keep: usize, n_new: usize, n_ctx: usize },
    #[error("KV edit: {0}")]
    Kv(String),
    #[error("node dump to {dir}: {err}")]
    Dump { dir: String, err: std::io::Error },
}

/// What the last `eval` did with the graph (for tests and traces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalInfo {
    pub prepared: Prepared,
}

/// What the engines of one model can share: its weights and the CPU workers. A server's slots
/// each own an [`Engine`] (and so their KV) but share these; their forward passes must then
/// not run at the same time (the server runs them from one thread).
#[derive(Clone)]
pub struct EngineShared {
    pub weights: Arc<WeightStore>,
    pub pool: Arc<Pool>,
}

impl EngineShared {
    /// `model`'s weights with another engine's workers (a draft model beside its target: two
    /// pools would fight over the cores).
    pub fn with_pool(model: &Model, pool: Arc<Pool>) -> Result<EngineShared, EngineError> {
        Ok(EngineShared { weights: Arc::new(WeightStore::new(model.file.clone())?), pool })
    }

    pub fn new(model: &Model, n_threads: usize) -> Result<EngineShared, EngineError> {
        Ok(EngineShared {
            weights: Arc::new(WeightStore::new(model.file.clone())?),
            pool: Arc::new(Pool::new(n_threads)?),
        })
    }
}

pub struct Engine {
    model: Arc<Model>,
    weights: Arc<WeightStore>,
    n_ubatch: usize,
    cache: GraphCache,
    sched: BackendScheduler,
    /// The CPU backend's workers; a forward pass runs inside [`Pool::install`].
    pool: Arc<Pool>,
    cparams: CParams,
    /// The tokens in the KV, one per cell (cell i holds position i when `aligned`).
    tokens: Vec<u32>,
    /// The position each cell's K was rotated with (RoPE); see `kv.rs`.
    cell_pos: Vec<i32>,
    last: Option<EvalInfo>,
    dump: Option<NodeDump>,
    /// Per-node capture of every evaluation (`MINFER_TRACE`, `minfer viz`).
    tracer: Option<TraceRecorder>,
}

impl Engine {
    pub fn new(model: Arc<Model>, p: &EngineParams) -> Result<Engine, EngineError> {
        let shared = EngineShared::new(&model, p.n_threads)?;
        Engine::with_shared(model, p, &shared)
    }

    /// An engine over weights and workers another engine may also use (`p.n_threads` is
    /// ignored: the pool is `shared`'s).
    pub fn with_shared(model: Arc<Model>, p: &EngineParams, shared: &EngineShared) -> Result<Engine, EngineError> {
        let registry = backends::registry();
        let fence = registry.resolve_fence(p.backends.as_deref())?;
        let mut alloc = GraphAllocator::new(registry, fence);
        let config = BackendConfig { n_threads: shared.pool.n_threads(), workers: Some(shared.pool.clone()), memory_cap: p.memory_cap };
        backends::enable_all(&mut alloc, &config)?;
        Engine::with_allocator(model, p, shared, alloc)
    }

    /// An engine over an allocator whose backends the caller enabled (tests place nodes on a
    /// test backend this way; `p.backends` and `p.memory_cap` are the caller's business then).
    /// Reserves the arenas and KV regions and offers each backend its weights.
    pub fn with_allocator(model: Arc<Model>, p: &EngineParams, shared: &EngineShared, alloc: GraphAllocator) -> Result<Engine, EngineError> {
        if p.n_ctx == 0 {
            return Err(EngineError::ZeroContext);
        }
        if p.n_ubatch == 0 {
            return Err(EngineError::ZeroUbatch);
        }
        let (weights, pool) = (shared.weights.clone(), shared.pool.clone());
        let gpu = alloc.backends().iter().any(|&b| b != Backend::CPU);
        let cparams = CParams { n_ctx: p.n_ctx, gpu, kv_type: p.kv_type };
        let mut engine = Engine {
            model,
            weights,
            n_ubatch: p.n_ubatch.min(p.n_ctx),
            pool,
            cache: GraphCache::new(alloc),
            sched: BackendScheduler::with_trace(p.trace),
            cparams,
            tokens: Vec::new(),
            cell_pos: Vec::new(),
            last: None,
            dump: p.dump.clone(),
            tracer: None,
        };
        engine.reserve()?;
        crate::backends::cpu::buffer::release_free_heap();
        Ok(engine)
    }

    /// Reserves once: the KV regions of every layer and each backend's compute arena, sized
    /// for the largest graphs (`n_ubatch` tokens with one logit row and with
    /// [`RESERVED_OUTPUTS`] rows, as speculative verification asks) and the decode graph;
    /// then offers each backend
    /// the weights its nodes use. An allocation that does not fit fails here, before any
    /// evaluation, naming the backend and the bytes.
    fn reserve(&mut self) -> Result<(), EngineError> {
        let mut used: BTreeMap<Backend, BTreeSet<WeightId>> = BTreeMap::new();
        let wide = self.n_ubatch.min(RESERVED_OUTPUTS);
        let mut need = ArenaNeed::default();
        // Built, planned and dropped one at a time.
        for (nt, n_out) in [(self.n_ubatch, 1), (self.n_ubatch, wide), (1, 1)] {
            let params = self.graph_params(nt, n_out);
            let mut graph = self.model.def.build_graph(&params)?;
            let alloc = self.cache.alloc_mut();
            self.sched.assign_backends(&mut graph, alloc);
            FusionPass::new().run(&mut graph, alloc);
            for node in &graph.nodes {
                if let Some(b) = node.backend {
                    used.entry(b).or_default().extend(node.weights());
                }
            }
            alloc.reserve_graph(&graph, &mut need)?;
        }
        let alloc = self.cache.alloc_mut();
        alloc.reserve_arenas(&need)?;
        for (backend, ids) in used {
            let ids: Vec<WeightId> = ids.into_iter().collect();
            alloc.pool_mut(backend)?.load_weights(&self.weights, &ids)?;
        }
        Ok(())
    }

    /// The largest number of tokens one forward pass evaluates (the reserve).
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// `backend`'s allocation counters (`None`: not enabled).
    pub fn memory(&self, backend: Backend) -> Option<MemoryStats> {
        self.cache.alloc().memory(backend)
    }

    /// The splits of the last graph evaluated (how the work was cut between backends).
    pub fn splits(&self) -> &[crate::graph::Split] {
        self.cache.alloc().splits()
    }

    /// The backends this engine runs on, in identity order.
    pub fn backends(&self) -> Vec<Backend> {
        self.cache.alloc().backends()
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The CPU workers.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn n_ctx(&self) -> usize {
        self.cparams.n_ctx
    }

    pub fn kv_type(&self) -> KvType {
        self.cparams.kv_type
    }

    /// Tokens already in the KV (the next token's position).
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// The tokens in the KV, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn n_vocab(&self) -> usize {
        self.model.hparams().n_vocab as usize
    }

    /// Captures every later evaluation node by node into `tracer` (`None` stops capturing).
    /// Capture only reads outputs: the logits are the same with or without it.
    pub fn set_tracer(&mut self, tracer: Option<TraceRecorder>) {
        self.tracer = tracer;
    }

    /// Ends capturing and returns what was recorded.
    pub fn take_tracer(&mut self) -> Option<TraceRecorder> {
        self.tracer.take()
    }

    /// Forgets the sequence; the KV regions are kept and overwritten.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.cell_pos.clear();
    }

    pub fn last_eval(&self) -> Option<EvalInfo> {
        self.last
    }

    /// The graph for `n_tokens` new tokens producing `n_out` logit rows (for dumps).
    pub fn graph_params(&self, n_tokens: usize, n_out: usize) -> GraphParams {
        GraphParams {
            n_tokens,
            n_out,
            gtype: GraphType::for_tokens(n_tokens),
            cparams: self.cparams,
            weights_version: 1,
        }
    }

    /// The graph the last evaluation ran (as cached for reuse), with the params that built it;
    /// `None` before the first evaluation.
    pub fn live_graph(&self) -> Option<(&ComputeGraph, GraphParams)> {
        let g = self.cache.graph()?;
        Some((g, *self.cache.params()?))
    }

    /// The graph `eval` would run for `n_tokens` tokens and `n_out` logit rows, with backends
    /// assigned and fusion applied, without allocating or executing it (`--dump-graph`).
    pub fn preview_graph(&self, n_tokens: usize, n_out: usize) -> Result<(ComputeGraph, GraphParams), EngineError> {
        let params = self.graph_params(n_tokens, n_out);
        let mut graph = self.model.def.build_graph(&params)?;
        self.sched.assign_backends(&mut graph, self.cache.alloc());
        FusionPass::new().run(&mut graph, self.cache.alloc());
        Ok((graph, params))
    }

    /// Evaluates `tokens` at positions `n_past..`; returns the logits of the last `n_out`
    /// tokens, `[n_out][n_vocab]`.
    pub fn eval(&mut self, tokens: &[u32], n_out: usize) -> Result<Vec<f32>, EngineError> {
        let nt = tokens.len();
        if nt == 0 {
            return Err(EngineError::NoTokens);
        }
        self.check_aligned()?;
        let n_past = self.n_past();
        if n_out == 0 || n_out > nt {
            return Err(EngineError::BadOutputRows { n_out, n_tokens: nt });
        }
        if n_past + nt > self.cparams.n_ctx {
            return Err(EngineError::ContextFull { n_past, n_tokens: nt, n_ctx: self.cparams.n_ctx });
        }
        let n_vocab = self.n_vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { id, n_vocab });
        }
        let params = self.graph_params(nt, n_out);
        let model = &self.model;
        let prepared = self.cache.prepare(&params, &self.sched, |p| model.def.build_graph(p))?;
        self.last = Some(EvalInfo { prepared });
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let positions: Vec<i32> = (n_past..n_past + nt).map(|p| p as i32).collect();
        let (graph, alloc) = self.cache.current().ok_or(GraphError::NoGraph)?;
        alloc.fill_input_i32(graph, "token_ids", &ids)?;
        alloc.fill_input_i32(graph, "positions", &positions)?;
        if n_out < nt {
            let tail: Vec<i32> = ((nt - n_out)..nt).map(|i| i as i32).collect();
            alloc.fill_input_i32(graph, "tail_ids", &tail)?;
        }
        let out = *graph.outputs.first().ok_or(GraphError::NoGraph)?;
        let dump = self.dump.as_ref().filter(|d| (n_past..n_past + nt).contains(&d.pos));
        if let Some(t) = self.tracer.as_mut() {
            t.begin_step(&params, graph, &self.model, n_past, tokens);
            for &id in &graph.inputs {
                if let Ok(data) = alloc.node_words(id) {
                    t.observe(&graph.nodes[id], &data);
                }
            }
        }
        let executed = match (dump, self.tracer.as_mut()) {
            (None, None) => {
                let (cache, sched) = (&mut self.cache, &self.sched);
                self.pool.install(|| cache.execute(sched)).map_err(EngineError::from)
            }
            (dump, tracer) => {
                let (cache, sched) = (&mut self.cache, &self.sched);
                self.pool.install(|| observed_execute(cache, sched, dump, tracer, (n_past, nt, n_out)))
            }
        };
        let read = executed.and_then(|()| {
            let (_, alloc) = self.cache.current().ok_or(GraphError::NoGraph)?;
            Ok(alloc.copy_to_cpu(out)?)
        });
        // The trace's open step ends either way: with the logits, or dropped with the error.
        let logits = match (read, self.tracer.as_mut()) {
            (Ok(logits), Some(t)) => {
                t.end_step(&logits[logits.len().saturating_sub(n_vocab)..]);
                logits
            }
            (Ok(logits), None) => logits,
            (Err(e), t) => {
                if let Some(t) = t {
                    t.abort_step();
                }
                return Err(e);
            }
        };
        self.tokens.extend_from_slice(tokens);
        self.cell_pos.extend_from_slice(&positions);
        Ok(logits)
    }

    /// Evaluates a prompt in chunks of at most `ubatch` tokens (`n_ubatch` when `None`, the
    /// reserve's size); returns the logits of its last token.
    pub fn prefill(&mut self, tokens: &[u32], ubatch: Option<usize>) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::NoTokens);
        }
        if self.n_past() + tokens.len() > self.cparams.n_ctx {
            return Err(EngineError::ContextFull {
                n_past: self.n_past(),
                n_tokens: tokens.len(),
                n_ctx: self.cparams.n_ctx,
            });
        }
        let chunk = ubatch.unwrap_or(self.n_ubatch).max(1);
        let mut logits = Vec::new();
        for part in tokens.chunks(chunk) {
            logits = self.eval(part, 1)?;
        }
        Ok(logits)
    }
}
