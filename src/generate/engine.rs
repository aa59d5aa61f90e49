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
    GraphOutput, GraphType, KvType, MemoryStats, NodeMeta, Prepared, WeightId, WeightStore,
};
use crate::models::Model;
use crate::workers::{Pool, PoolError};

pub mod kv;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineParams {
    /// KV rows (tokens of context) of each sequence.
    pub n_ctx: usize,
    /// Sequences the KV holds side by side (a server's slots), each with `n_ctx` cells of its
    /// own; one forward pass may evaluate tokens of several ([`Engine::eval_batch`]). The
    /// single-sequence methods (`eval`, `prefill`, `kv_*`, snapshots) work on sequence 0.
    pub n_seq: usize,
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
            n_seq: 1,
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
    #[error("n_seq must be at least 1")]
    ZeroSequences,
    #[error("{n_seq} sequences of {n_ctx} cells are more KV cells than this machine can count")]
    TooManyCells { n_ctx: usize, n_seq: usize },
    #[error("sequence {seq} does not exist: the engine holds {n_seq}")]
    NoSequence { seq: usize, n_seq: usize },
    #[error("sequence {seq} appears twice in one batch")]
    SequenceTwice { seq: usize },
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
    /// Cells of each sequence: sequence `s` owns cells `s * n_ctx_seq..(s + 1) * n_ctx_seq`.
    n_ctx_seq: usize,
    /// Per sequence: what its cells hold.
    seqs: Vec<SeqKv>,
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
        if p.n_seq == 0 {
            return Err(EngineError::ZeroSequences);
        }
        let n_cells = p.n_ctx.checked_mul(p.n_seq).ok_or(EngineError::TooManyCells { n_ctx: p.n_ctx, n_seq: p.n_seq })?;
        let (weights, pool) = (shared.weights.clone(), shared.pool.clone());
        let gpu = alloc.backends().iter().any(|&b| b != Backend::CPU);
        let cparams = CParams { n_ctx: n_cells, n_seq: p.n_seq, gpu, kv_type: p.kv_type };
        let mut engine = Engine {
            model,
            weights,
            n_ubatch: p.n_ubatch.min(p.n_ctx),
            pool,
            cache: GraphCache::new(alloc),
            sched: BackendScheduler::with_trace(p.trace),
            cparams,
            n_ctx_seq: p.n_ctx,
            seqs: vec![SeqKv::default(); p.n_seq],
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
        // The matrices one-token passes multiply, per backend (offered for a decode layout).
        let mut decode_matrices: BTreeMap<Backend, BTreeSet<WeightId>> = BTreeMap::new();
        let wide = self.n_ubatch.min(RESERVED_OUTPUTS.max(self.seqs.len()));
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
                    if let (1, NodeMeta::MatMul(m)) = (nt, &node.meta) {
                        decode_matrices.entry(b).or_default().insert(m.weight);
                    }
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
        for (backend, ids) in decode_matrices {
            let ids: Vec<WeightId> = ids.into_iter().collect();
            alloc.pool_mut(backend)?.prepare_decode_matrices(&self.weights, &ids)?;
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

    /// Cells of each sequence (its context).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx_seq
    }

    /// Sequences the KV holds.
    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    pub fn kv_type(&self) -> KvType {
        self.cparams.kv_type
    }

    /// Tokens already in sequence 0's KV (the next token's position).
    pub fn n_past(&self) -> usize {
        self.seqs[0].tokens.len()
    }

    /// The tokens in sequence 0's KV, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.seqs[0].tokens
    }

    /// The tokens in sequence `seq`'s KV, in order (`None`: no such sequence).
    pub fn seq_tokens(&self, seq: usize) -> Option<&[u32]> {
        self.seqs.get(seq).map(|s| s.tokens.as_slice())
    }

    /// Forgets all but the first `keep` tokens of sequence `seq` (a cached prompt prefix is
    /// kept this way); the cells stay and are overwritten.
    pub fn seq_truncate(&mut self, seq: usize, keep: usize) -> Result<(), EngineError> {
        let n_seq = self.seqs.len();
        let s = self.seqs.get_mut(seq).ok_or(EngineError::NoSequence { seq, n_seq })?;
        s.tokens.truncate(keep);
        s.cell_pos.truncate(keep);
        Ok(())
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

    /// Forgets sequence 0; the KV regions are kept and overwritten.
    pub fn reset(&mut self) {
        self.seqs[0] = SeqKv::default();
    }

    pub fn last_eval(&self) -> Option<EvalInfo> {
        self.last
    }

    /// The graph for `n_tokens` new tokens producing `n_out` logit rows (for dumps).
    pub fn graph_params(&self, n_tokens: usize, n_out: usize) -> GraphParams {
        self.graph_params_for(n_tokens, n_out, GraphOutput::Logits)
    }

    /// Like [`Engine::graph_params`], yielding `output`.
    fn graph_params_for(&self, n_tokens: usize, n_out: usize, output: GraphOutput) -> GraphParams {
        GraphParams {
            n_tokens,
            n_out,
            output,
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

    /// Evaluates `tokens` at positions `n_past..` of sequence 0; returns the logits of the
    /// last `n_out` tokens, `[n_out][n_vocab]`.
    pub fn eval(&mut self, tokens: &[u32], n_out: usize) -> Result<Vec<f32>, EngineError> {
        let nt = tokens.len();
        if nt == 0 {
            return Err(EngineError::NoTokens);
        }
        if n_out == 0 || n_out > nt {
            return Err(EngineError::BadOutputRows { n_out, n_tokens: nt });
        }
        let tail: Vec<i32> = ((nt - n_out)..nt).map(|i| i as i32).collect();
        self.run_pass(&[SeqChunk { seq: 0, tokens }], tail, GraphOutput::Logits)
    }

    /// Evaluates `chunk` (its tokens at its sequence's next positions) and returns the final
    /// hidden states, after the output norm, of the chunk's tokens `rows`, `[rows.len()][n_embd]`:
    /// what embeddings pool. The tokens stay in the sequence's KV like any other evaluation's
    /// (the same bits).
    pub fn eval_hidden(&mut self, chunk: SeqChunk<'_>, rows: std::ops::Range<usize>) -> Result<Vec<f32>, EngineError> {
        let nt = chunk.tokens.len();
        if nt == 0 {
            return Err(EngineError::NoTokens);
        }
        if rows.is_empty() || rows.end > nt {
            return Err(EngineError::BadOutputRows { n_out: rows.len(), n_tokens: nt });
        }
        let tail = rows.map(|r| r as i32).collect();
        self.run_pass(&[chunk], tail, GraphOutput::Hidden)
    }

    /// Width of a hidden state row ([`Engine::eval_hidden`]).
    pub fn n_embd(&self) -> usize {
        self.model.hparams().n_embd as usize
    }

    /// One forward pass over chunks of several sequences (each at most once): every chunk's
    /// tokens go to its sequence's next positions, and each chunk's last token gives a row of
    /// logits, `[chunks.len()][n_vocab]` in chunk order. A sequence's logits are the same bits
    /// as evaluating its chunk alone: every kernel computes a token's row the same way
    /// whatever else is in the pass.
    pub fn eval_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<f32>, EngineError> {
        let mut tail = Vec::with_capacity(chunks.len());
        let mut end = 0usize;
        for c in chunks {
            if c.tokens.is_empty() {
                return Err(EngineError::NoTokens);
            }
            end += c.tokens.len();
            tail.push(end as i32 - 1);
        }
        if chunks.is_empty() {
            return Err(EngineError::NoTokens);
        }
        self.run_pass(chunks, tail, GraphOutput::Logits)
    }

    /// Checks the chunks against their sequences, then evaluates them with logit rows `tail`
    /// (indices into the concatenated tokens).
    fn run_pass(&mut self, chunks: &[SeqChunk<'_>], tail: Vec<i32>, output: GraphOutput) -> Result<Vec<f32>, EngineError> {
        let n_seq = self.seqs.len();
        let n_vocab = self.n_vocab();
        let mut seen = vec![false; n_seq];
        let (mut ids, mut positions, mut cells) = (Vec::new(), Vec::new(), Vec::new());
        for c in chunks {
            let s = self.seqs.get(c.seq).ok_or(EngineError::NoSequence { seq: c.seq, n_seq })?;
            if std::mem::replace(&mut seen[c.seq], true) {
                return Err(EngineError::SequenceTwice { seq: c.seq });
            }
            s.check_aligned()?;
            let n_past = s.tokens.len();
            if n_past + c.tokens.len() > self.n_ctx_seq {
                return Err(EngineError::ContextFull { n_past, n_tokens: c.tokens.len(), n_ctx: self.n_ctx_seq });
            }
            if let Some(&id) = c.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::TokenOutOfRange { id, n_vocab });
            }
            let base = c.seq * self.n_ctx_seq;
            ids.extend(c.tokens.iter().map(|&t| t as i32));
            positions.extend((n_past..n_past + c.tokens.len()).map(|p| p as i32));
            cells.extend((base + n_past..base + n_past + c.tokens.len()).map(|p| p as i32));
        }
        let (nt, n_out) = (ids.len(), tail.len());
        let params = self.graph_params_for(nt, n_out, output);
        let model = &self.model;
        let prepared = self.cache.prepare(&params, &self.sched, |p| model.def.build_graph(p))?;
        self.last = Some(EvalInfo { prepared });
        let (graph, alloc) = self.cache.current().ok_or(GraphError::NoGraph)?;
        alloc.fill_input_i32(graph, "token_ids", &ids)?;
        alloc.fill_input_i32(graph, "positions", &positions)?;
        if self.cparams.n_seq > 1 {
            alloc.fill_input_i32(graph, "kv_cells", &cells)?;
        }
        if n_out < nt {
            alloc.fill_input_i32(graph, "tail_ids", &tail)?;
        }
        let out = *graph.outputs.first().ok_or(GraphError::NoGraph)?;
        // Dumps and traces follow one sequence's positions and its logits: a logits pass of one
        // chunk only.
        let single = match chunks {
            [c] if output == GraphOutput::Logits => Some((self.seqs[c.seq].tokens.len(), c.tokens)),
            _ => None,
        };
        let dump = self.dump.as_ref().zip(single).filter(|(d, (n_past, _))| (*n_past..n_past + nt).contains(&d.pos)).map(|(d, _)| d);
        let tracer = self.tracer.as_mut().filter(|_| single.is_some());
        if let (Some(t), Some((n_past, tokens))) = (tracer, single) {
            t.begin_step(&params, graph, &self.model, n_past, tokens);
            for &id in &graph.inputs {
                if let Ok(data) = alloc.node_words(id) {
                    t.observe(&graph.nodes[id], &data);
                }
            }
        }
        let n_past0 = single.map_or(0, |(n, _)| n);
        let executed = match (dump, self.tracer.as_mut().filter(|_| single.is_some())) {
            (None, None) => {
                let (cache, sched) = (&mut self.cache, &self.sched);
                self.pool.install(|| cache.execute(sched)).map_err(EngineError::from)
            }
            (dump, tracer) => {
                let (cache, sched) = (&mut self.cache, &self.sched);
                self.pool.install(|| observed_execute(cache, sched, dump, tracer, (n_past0, nt, n_out)))
            }
        };
        let read = executed.and_then(|()| {
            let (_, alloc) = self.cache.current().ok_or(GraphError::NoGraph)?;
            Ok(alloc.copy_to_cpu(out)?)
        });
        // The trace's open step ends either way: with the logits, or dropped with the error.
        let logits = match (read, self.tracer.as_mut().filter(|_| single.is_some())) {
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
        let mut at = 0;
        for c in chunks {
            let s = &mut self.seqs[c.seq];
            s.tokens.extend_from_slice(c.tokens);
            s.cell_pos.extend_from_slice(&positions[at..at + c.tokens.len()]);
            at += c.tokens.len();
        }
        Ok(logits)
    }

    /// Evaluates a prompt in chunks of at most `ubatch` tokens (`n_ubatch` when `None`, the
    /// reserve's size); returns the logits of its last token.
    pub fn prefill(&mut self, tokens: &[u32], ubatch: Option<usize>) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::NoTokens);
        }
        if self.n_past() + tokens.len() > self.n_ctx_seq {
            return Err(EngineError::ContextFull {
                n_past: self.n_past(),
                n_tokens: tokens.len(),
                n_ctx: self.n_ctx_seq,
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

/// Tokens of one sequence in a batched forward pass ([`Engine::eval_batch`]).
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub seq: usize,
    pub tokens: &'a [u32],
}

/// What one sequence's cells hold.
#[derive(Debug, Clone, Default)]
struct SeqKv {
    /// The tokens in the KV, one per cell (the sequence's cell i holds position i when
    /// aligned).
    tokens: Vec<u32>,
    /// The position each cell's K was rotated with (RoPE); see `kv.rs`.
    cell_pos: Vec<i32>,
}

impl SeqKv {
    /// Fails unless cell `i` holds position `i` for every cell.
    fn check_aligned(&self) -> Result<(), EngineError> {
        match self.cell_pos.iter().enumerate().find(|&(i, &p)| p != i as i32) {
            Some((cell, &pos)) => Err(EngineError::KvNotAligned { cell, pos }),
            None => Ok(()),
        }
    }
}
