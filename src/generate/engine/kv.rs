//! Editing the KV of an [`Engine`] in place: removing cells and moving positions, as llama.cpp's
//! `seq_rm` / `seq_add`, for context shift and for re-using a common prefix.
//!
//! The KV is a run of cells `0..n_past`; cell `i` holds the K and V rows of `tokens[i]`, and
//! attention treats cell `i` as position `i`. Each cell also records the position its K was
//! rotated with (`cell_pos`). [`Engine::kv_rm`] removes cells and closes the gap, so the cells
//! after it sit at new indices with their old rotation; [`Engine::kv_shift`] re-rotates K rows
//! by a position delta (NEOX RoPE, as Qwen2/Qwen3 use: rotations compose, so rotating by `d`
//! turns position `p` into `p + d`). Evaluation refuses to run until every cell's rotation
//! matches its index again. V rows never depend on the position and move verbatim.

use super::{Engine, EngineError};
use crate::vec_ops::rope::RopeCache;

impl Engine {
    /// Fails unless cell `i` holds position `i` for every cell.
    pub(super) fn check_aligned(&self) -> Result<(), EngineError> {
        match self.cell_pos.iter().enumerate().find(|&(i, &p)| p != i as i32) {
            Some((cell, &pos)) => Err(EngineError::KvNotAligned { cell, pos }),
            None => Ok(()),
        }
    }

    /// The position each cell's K is rotated with.
    pub fn kv_positions(&self) -> &[i32] {
        &self.cell_pos
    }

    /// Removes cells `p0..p1`; the cells after them move down to `p0..` (keeping their K
    /// rotation until [`Engine::kv_shift`]). `p1 == n_past` just forgets the tail.
    pub fn kv_rm(&mut self, p0: usize, p1: usize) -> Result<(), EngineError> {
        let n_past = self.n_past();
        if p0 > p1 || p1 > n_past {
            return Err(EngineError::KvRange { p0, p1, n_past });
        }
        if p0 == p1 {
            return Ok(());
        }
        if p1 < n_past {
            self.edit_kv(|k, v, width| {
                k.copy_within(p1 * width..n_past * width, p0 * width);
                v.copy_within(p1 * width..n_past * width, p0 * width);
                Ok(())
            })?;
        }
        self.tokens.drain(p0..p1);
        self.cell_pos.drain(p0..p1);
        Ok(())
    }

    /// Adds `delta` to the positions of cells `p0..p1`, re-rotating their K rows.
    pub fn kv_shift(&mut self, p0: usize, p1: usize, delta: i32) -> Result<(), EngineError> {
        let n_past = self.n_past();
        if p0 > p1 || p1 > n_past {
            return Err(EngineError::KvRange { p0, p1, n_past });
        }
        if self.cell_pos[p0..p1].iter().any(|&p| p + delta < 0) {
            return Err(EngineError::KvShiftBelowZero { p0, p1, delta });
        }
        if p0 == p1 || delta == 0 {
            return Ok(());
        }
        let h = self.model.hparams();
        let (n_head_kv, head_dim, freq_base) = (h.n_head_kv as usize, h.head_dim as usize, h.rope_freq_base);
        let rot = RopeCache::new(&[delta], head_dim, freq_base).map_err(|e| EngineError::Kv(e.to_string()))?;
        self.edit_kv(|k, _, width| {
            for row in k[p0 * width..p1 * width].chunks_exact_mut(width) {
                rot.apply(row, n_head_kv).map_err(|e| EngineError::Kv(e.to_string()))?;
            }
            Ok(())
        })?;
        self.cell_pos[p0..p1].iter_mut().for_each(|p| *p += delta);
        Ok(())
    }

    /// Context shift: drops `n_discard` cells after the first `keep` and moves the rest down,
    /// so that generation can go on in a full context.
    pub fn context_shift(&mut self, keep: usize, n_discard: usize) -> Result<(), EngineError> {
        let n_past = self.n_past();
        let end = keep.saturating_add(n_discard);
        if end > n_past {
            return Err(EngineError::KvRange { p0: keep, p1: end, n_past });
        }
        self.kv_rm(keep, end)?;
        self.kv_shift(keep, n_past - n_discard, -(n_discard as i32))
    }

    /// Calls `f(k, v, row_width)` on host copies of every layer's regions and writes them back.
    fn edit_kv(&mut self, mut f: impl FnMut(&mut [f32], &mut [f32], usize) -> Result<(), EngineError>) -> Result<(), EngineError> {
        let n_ctx = self.cparams.n_ctx;
        let alloc = self.cache.alloc_mut();
        for layer in alloc.kv_layers() {
            let (mut k, mut v) = alloc.copy_kv_to_cpu(layer)?;
            let width = k.len() / n_ctx.max(1);
            f(&mut k, &mut v, width)?;
            alloc.write_kv_from_cpu(layer, &k, &v)?;
        }
        Ok(())
    }
}

/// The KV of a sequence, for saving: its tokens, their positions, and every layer's first
/// `tokens.len()` K and V rows.
#[derive(Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    pub tokens: Vec<u32>,
    pub positions: Vec<i32>,
    /// Values per K (and V) row.
    pub width: usize,
    /// Per layer: K rows, V rows, `[tokens.len()][width]` each.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Engine {
    /// A copy of the KV in use.
    pub fn kv_snapshot(&mut self) -> Result<KvSnapshot, EngineError> {
        let n = self.n_past();
        let n_ctx = self.cparams.n_ctx;
        let alloc = self.cache.alloc_mut();
        let mut layers = Vec::new();
        let mut width = 0;
        for layer in alloc.kv_layers() {
            let (k, v) = alloc.copy_kv_to_cpu(layer)?;
            width = k.len() / n_ctx.max(1);
            layers.push((k[..n * width].to_vec(), v[..n * width].to_vec()));
        }
        Ok(KvSnapshot { tokens: self.tokens.clone(), positions: self.cell_pos.clone(), width, layers })
    }

    /// Replaces the KV with `snap` (taken from an engine of the same model, any context size
    /// that holds it). Nothing changes when it does not fit.
    pub fn kv_restore(&mut self, snap: &KvSnapshot) -> Result<(), EngineError> {
        let n = snap.tokens.len();
        let n_ctx = self.cparams.n_ctx;
        let bad = |why: String| Err(EngineError::Kv(why));
        if n > n_ctx {
            return Err(EngineError::ContextFull { n_past: 0, n_tokens: n, n_ctx });
        }
        if snap.positions.len() != n {
            return bad(format!("{} positions for {n} tokens", snap.positions.len()));
        }
        let n_layer = self.model.hparams().n_layer as usize;
        if snap.layers.len() != n_layer {
            return bad(format!("{} layers, the model has {n_layer}", snap.layers.len()));
        }
        if self.cache.alloc().kv_layers().len() != n_layer {
            // The regions are made with the first graph: prepare one, execute nothing.
            let params = self.graph_params(1, 1);
            let model = &self.model;
            self.cache.prepare(&params, &self.sched, |p| model.def.build_graph(p))?;
        }
        let alloc = self.cache.alloc_mut();
        let layers = alloc.kv_layers();
        let width = match layers.first() {
            Some(&l) => alloc.copy_kv_to_cpu(l)?.0.len() / n_ctx.max(1),
            None => 0,
        };
        // Everything is checked before anything is written.
        if snap.width != width || snap.layers.iter().any(|(k, v)| k.len() != n * width || v.len() != n * width) {
            return bad(format!("rows of {} values, this engine's are {width}", snap.width));
        }
        for (layer, (ks, vs)) in layers.into_iter().zip(&snap.layers) {
            let (mut k, mut v) = alloc.copy_kv_to_cpu(layer)?;
            k[..n * width].copy_from_slice(ks);
            v[..n * width].copy_from_slice(vs);
            alloc.write_kv_from_cpu(layer, &k, &v)?;
        }
        self.tokens = snap.tokens.clone();
        self.cell_pos = snap.positions.clone();
        Ok(())
    }
}
