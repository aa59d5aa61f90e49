//! CUDA graph replay of decode splits: a decode step launches the same kernels with the same
//! arguments every time (shapes are structure, positions and ids are data in device buffers),
//! so its launches are recorded once and replayed, which removes the per-launch CPU cost that
//! bounds a small model's decode.
//!
//! Rules (the executor, [`super::CudaBackend::compute`], applies them):
//! 1. Only **decode-shaped** splits are recorded: every node holds at most one token row
//!    (the KV views, whose rows are cells, aside). `MINFER_NO_CUDA_GRAPH=1` records nothing.
//! 2. A split is known by its **key** ([`split_key`]): every node's id, op, output shape and
//!    metadata that shapes launches, and every region it reads and writes (buffer, offset,
//!    bytes), KV regions included. Equal keys launch the same kernels with the same arguments.
//! 3. A key seen for the **first** time runs normally (it may grow the scratch, compile
//!    kernels); once that run succeeded, the **second** sight is recorded and replayed;
//!    afterwards replayed. A recording that fails is dropped.
//! 4. Every graph is dropped when an address it holds may change: a buffer allocated or freed,
//!    weights (re)loaded, the scratch regrown.

use std::collections::{HashMap, HashSet};

use super::device::GraphId;
use super::fnv::Fnv;
use crate::graph::{CNode, NodeMeta, Op, RopeStyle, SplitWork, TensorRef};

/// Environment variable that turns graph replay off (`1`).
pub const NO_GRAPH_ENV: &str = "MINFER_NO_CUDA_GRAPH";

/// Is replay on (`MINFER_NO_CUDA_GRAPH` is not `1`)?
pub fn enabled_by_env() -> bool {
    std::env::var(NO_GRAPH_ENV).map_or(true, |v| v != "1")
}

/// Rule 1: does every node hold at most one token row?
pub fn decode_shaped(split: &SplitWork) -> bool {
    split.nodes.iter().all(|w| match split.graph.nodes.get(w.node) {
        Some(n) => n.op.binds_kv_region() || n.out_shape[1] <= 1,
        None => false,
    })
}

fn region(h: &mut Fnv, t: &TensorRef) {
    [t.buf.backend.id() as u64, t.buf.id.0 as u64, t.offset as u64, t.bytes as u64].into_iter().for_each(|v| h.u64(v));
}

/// The op's payload (no wildcard: a new variant must say what it adds to the key).
fn op(h: &mut Fnv, op: &Op) {
    h.field(op.name().as_bytes());
    match *op {
        Op::RmsNorm { eps } => h.u64(eps.to_bits() as u64),
        Op::QkNorm { hd, nh, eps } => [hd as u64, nh as u64, eps.to_bits() as u64].into_iter().for_each(|v| h.u64(v)),
        Op::RoPE { style } => h.u64(matches!(style, RopeStyle::NonInterleaved) as u64),
        Op::Scale { s } => h.u64(s.to_bits() as u64),
        Op::KvcacheStore { layer } | Op::KvcacheLoad { layer } | Op::KvShift { layer } => h.u64(layer as u64),
        Op::Input | Op::Add | Op::Mul | Op::Silu | Op::MatMul | Op::GetRows | Op::Attn | Op::SwiGLU | Op::Gelu | Op::GeGLU => {}
    }
}

fn meta(h: &mut Fnv, n: &CNode) {
    h.field(n.meta.kind_name().as_bytes());
    match &n.meta {
        NodeMeta::MatMul(m) => [m.weight.0 as u64, m.bias.map_or(u64::MAX, |b| b.0 as u64), m.in_dim as u64, m.out_dim as u64, m.weight_type.id() as u64].into_iter().for_each(|v| h.u64(v)),
        NodeMeta::Embed(m) => [m.weight.0 as u64, m.n_embd as u64].into_iter().for_each(|v| h.u64(v)),
        NodeMeta::Norm(m) => h.u64(m.weight.map_or(u64::MAX, |w| w.0 as u64)),
        NodeMeta::Rope(m) => [m.n_head as u64, m.head_dim as u64, m.n_rot as u64, m.freq_base.to_bits() as u64].into_iter().for_each(|v| h.u64(v)),
        NodeMeta::Attn(m) => [m.n_head as u64, m.n_head_kv as u64, m.head_dim as u64, m.n_ctx as u64, m.kv_type.tag() as u64, m.scale.to_bits() as u64, m.window.map_or(0, |w| w as u64)].into_iter().for_each(|v| h.u64(v)),
        NodeMeta::Kvcache(m) => [m.n_embd_kv as u64, m.n_ctx as u64, m.kv_type.tag() as u64, m.head_dim as u64].into_iter().for_each(|v| h.u64(v)),
        NodeMeta::KvShift(m) => [
            m.kv.n_ctx as u64,
            m.kv.n_embd_kv as u64,
            m.kv.head_dim as u64,
            m.kv.kv_type.tag() as u64,
            m.rope.n_head as u64,
            m.rope.head_dim as u64,
            m.rope.n_rot as u64,
            m.rope.freq_base.to_bits() as u64,
            matches!(m.style, RopeStyle::NonInterleaved) as u64,
        ]
        .into_iter()
        .for_each(|v| h.u64(v)),
        NodeMeta::None => {}
    }
}

/// Rule 2: the key of a split.
pub fn split_key(split: &SplitWork) -> u64 {
    let mut h = Fnv::default();
    h.u64(split.nodes.len() as u64);
    for w in split.nodes {
        h.u64(w.node as u64);
        if let Some(n) = split.graph.nodes.get(w.node) {
            op(&mut h, &n.op);
            n.out_shape.iter().for_each(|&d| h.u64(d as u64));
            meta(&mut h, n);
        }
        region(&mut h, &w.out);
        h.u64(w.srcs.len() as u64);
        w.srcs.iter().for_each(|t| region(&mut h, t));
        match &w.kv {
            Some(kv) => {
                region(&mut h, &kv.k);
                region(&mut h, &kv.v);
            }
            None => h.u64(u64::MAX),
        }
    }
    h.0
}

/// What to do with a split (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Launch its kernels (not decode-shaped, or replay off).
    Launch,
    /// Launch its kernels, first sight of this key: [`GraphCache::saw`] it once they ran.
    First(u64),
    /// Record its launches under this key, then replay them.
    Record(u64),
    /// Replay this graph.
    Replay(GraphId),
}

/// The recorded graphs and the keys seen once.
#[derive(Debug, Default)]
pub struct GraphCache {
    pub enabled: bool,
    graphs: HashMap<u64, GraphId>,
    seen: HashSet<u64>,
}

impl GraphCache {
    pub fn new(enabled: bool) -> GraphCache {
        GraphCache { enabled, ..GraphCache::default() }
    }

    pub fn plan(&mut self, split: &SplitWork) -> Plan {
        if !self.enabled || !decode_shaped(split) {
            return Plan::Launch;
        }
        let key = split_key(split);
        if let Some(&g) = self.graphs.get(&key) {
            return Plan::Replay(g);
        }
        match self.seen.contains(&key) {
            false => Plan::First(key),
            true => Plan::Record(key),
        }
    }

    /// A first sight ran without error (a failed one is not recorded next time).
    pub fn saw(&mut self, key: u64) {
        self.seen.insert(key);
    }

    pub fn insert(&mut self, key: u64, g: GraphId) {
        self.graphs.insert(key, g);
    }

    /// Rule 4: forgets every graph and key; returns the graphs for the device to release.
    pub fn invalidate(&mut self) -> Vec<GraphId> {
        self.seen.clear();
        self.graphs.drain().map(|(_, g)| g).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Backend, BufRef, BufferId, DType, GraphBuilder, NodeWork};

    fn region(offset: usize, bytes: usize) -> TensorRef {
        TensorRef { buf: BufRef { backend: Backend::CUDA, id: BufferId(0) }, offset, bytes, dtype: DType::F32 }
    }

    /// `a + b` over `nt` tokens of 8 values, its regions at `at`.
    fn split(nt: usize, at: usize) -> (crate::graph::ComputeGraph, Vec<NodeWork>) {
        let mut b = GraphBuilder::new();
        let x = b.input("a", [8, nt, 1, 1], DType::F32);
        let y = b.input("b", [8, nt, 1, 1], DType::F32);
        let s = b.add(x, y).expect("add");
        let g = b.build();
        let bytes = 32 * nt;
        let work = vec![NodeWork { node: s, out: region(at + 2 * bytes, bytes), srcs: vec![region(at, bytes), region(at + bytes, bytes)], kv: None }];
        (g, work)
    }

    #[test]
    fn keys_follow_shapes_and_regions() {
        let key = |nt, at| {
            let (g, w) = split(nt, at);
            split_key(&SplitWork { graph: &g, backend: Backend::CUDA, nodes: &w })
        };
        assert_eq!(key(1, 0), key(1, 0), "the same split, the same key");
        assert_ne!(key(1, 0), key(1, 64), "other regions, another key");
        assert_ne!(key(1, 0), key(2, 0), "another shape, another key");
        let (g, w) = split(1, 0);
        assert!(decode_shaped(&SplitWork { graph: &g, backend: Backend::CUDA, nodes: &w }));
        let (g, w) = split(2, 0);
        assert!(!decode_shaped(&SplitWork { graph: &g, backend: Backend::CUDA, nodes: &w }), "two token rows are a prefill");
    }

    /// Rule 3: launch, record, replay; rule 4: after an invalidation, launch again; prefills and
    /// a disabled cache always launch.
    #[test]
    fn a_key_is_launched_then_recorded_then_replayed() {
        let (g, w) = split(1, 0);
        let s = SplitWork { graph: &g, backend: Backend::CUDA, nodes: &w };
        let mut c = GraphCache::new(true);
        let Plan::First(k0) = c.plan(&s) else { panic!("the first sight launches") };
        assert_eq!(c.plan(&s), Plan::First(k0), "a first sight that did not run to the end is a first sight again");
        c.saw(k0);
        let Plan::Record(k) = c.plan(&s) else { panic!("the second sight records") };
        c.insert(k, GraphId(7));
        assert_eq!(c.plan(&s), Plan::Replay(GraphId(7)));
        assert_eq!(c.invalidate(), vec![GraphId(7)]);
        assert_eq!(c.plan(&s), Plan::First(k), "forgotten keys start over");
        let (g2, w2) = split(4, 0);
        let prefill = SplitWork { graph: &g2, backend: Backend::CUDA, nodes: &w2 };
        assert_eq!([c.plan(&prefill), c.plan(&prefill), c.plan(&prefill)], [Plan::Launch; 3]);
        let mut off = GraphCache::new(false);
        assert_eq!([off.plan(&s), off.plan(&s), off.plan(&s)], [Plan::Launch; 3]);
    }
}
