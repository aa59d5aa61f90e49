//! Editing the KV of an [`Engine`] in place: removing cells and moving positions, as llama.cpp's
//! `seq_rm` / `seq_add`, for context shift and for re-using a common prefix.
//!
//! The KV is a run of cells `0..n_past`; cell `i` holds the K and V rows of `tokens[i]`, and
//! attention treats cell `i` as position `i`. Each cell also records the position its K was
//! rotated with (`cell_pos`). [`Engine::kv_rm`] removes cells and closes the gap, so the cells
//! after it sit at new indices with their old rotation; [`Engine::kv_shift`] re-rotates K rows
//! by a position delta (NEOX RoPE, as Qwen2/Qwen3 use: rotations compose, so rotating by `d`
//! turns position `p` into `p + d`). Evaluation refuses to run until every cell's rotation
//! matches its index again. V rows never depend on the position and move verbatim. Packed
//! rows (f16, q8_0) move as bytes; a shifted K row is decoded, rotated and encoded again
//! (re-quantized).

use super::{Engine, EngineError};
use crate::graph::KvType;
use crate::vec_ops::kv_cache::{decode_row, encode_row};
use crate::vec_ops::rope::RopeCache;

impl Engine {
    /// Fails unless cell `i` holds position `i` for every cell.
    pub(super) fn check_aligned(&self) -> Result<(), EngineError> {
        match self.cell_pos.iter().enumerate().find(|&(i, &p)| p != i as i32) {
            Some((cell, &pos)) => Err(EngineError::KvNotAligned { cell, pos }),
            None => Ok(()),
        }
    }

    /// Bytes of every layer's K and V regions (the whole context, used or not).
    pub fn kv_bytes(&self) -> usize {
        let h = self.model.hparams();
        let per_region = self.kv_type().region_len((h.n_head_kv * h.head_dim) as usize, self.cparams.n_ctx) * 4;
        2 * h.n_layer as usize * per_region
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
            let rb = self.row_bytes();
            self.edit_kv(|k, v| {
                k.copy_within(p1 * rb..n_past * rb, p0 * rb);
                v.copy_within(p1 * rb..n_past * rb, p0 * rb);
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
        let (kv_type, rb) = (self.kv_type(), self.row_bytes());
        let kv_err = |e: crate::vec_ops::OpsError| EngineError::Kv(e.to_string());
        let mut plain = vec![0.0f32; n_head_kv * head_dim];
        self.edit_kv(|k, _| {
            for row in k[p0 * rb..p1 * rb].chunks_exact_mut(rb) {
                decode_row(kv_type, head_dim, row, &mut plain).map_err(kv_err)?;
                rot.apply(&mut plain, n_head_kv).map_err(kv_err)?;
                encode_row(kv_type, head_dim, &plain, row).map_err(kv_err)?;
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
        let r = self.kv_shift(keep, n_past - n_discard, -(n_discard as i32));
        if r.is_err() {
            // Half a shift leaves cells at the wrong positions: forget the KV instead.
            self.reset();
        }
        r
    }

    /// Bytes of one K (or V) row.
    fn row_bytes(&self) -> usize {
        let h = self.model.hparams();
        self.kv_type().row_bytes((h.n_head_kv * h.head_dim) as usize)
    }

    /// Calls `f(k, v)` on the bytes of host copies of every layer's regions (row `i` at
    /// `i * row_bytes`) and writes them back.
    /// A failure part-way leaves layers edited and others not: the KV is then forgotten.
    fn edit_kv(&mut self, mut f: impl FnMut(&mut [u8], &mut [u8]) -> Result<(), EngineError>) -> Result<(), EngineError> {
        let alloc = self.cache.alloc_mut();
        let mut all = || -> Result<(), EngineError> {
            for layer in alloc.kv_layers() {
                let (mut k, mut v) = alloc.copy_kv_to_cpu(layer)?;
                f(bytemuck::cast_slice_mut(&mut k), bytemuck::cast_slice_mut(&mut v))?;
                alloc.write_kv_from_cpu(layer, &k, &v)?;
            }
            Ok(())
        };
        let r = all();
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// Makes the KV regions exist (they come with the first graph): prepares one, executes
    /// nothing.
    fn ensure_regions(&mut self) -> Result<(), EngineError> {
        if self.cache.alloc().kv_layers().len() != self.model.hparams().n_layer as usize {
            let params = self.graph_params(1, 1);
            let model = &self.model;
            self.cache.prepare(&params, &self.sched, |p| model.def.build_graph(p))?;
        }
        Ok(())
    }
}

/// The KV of a sequence, for saving: its tokens, their positions, and every layer's first
/// `tokens.len()` K and V rows as stored (bytes of the engine's [`KvType`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    pub tokens: Vec<u32>,
    pub positions: Vec<i32>,
    pub kv_type: KvType,
    /// Bytes per K (and V) row.
    pub row_bytes: usize,
    /// Per layer: K rows, V rows, `[tokens.len()][row_bytes]` bytes each.
    pub layers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl KvSnapshot {
    /// Layer `layer`'s K and V rows as plain f32 values, `[tokens.len()][width]`.
    pub fn rows_f32(&self, layer: usize, width: usize, head_dim: usize) -> Result<(Vec<f32>, Vec<f32>), EngineError> {
        let (k, v) = self.layers.get(layer).ok_or_else(|| EngineError::Kv(format!("no layer {layer}")))?;
        let decode = |bytes: &[u8]| -> Result<Vec<f32>, EngineError> {
            let mut out = vec![0.0f32; self.tokens.len() * width];
            for (o, row) in out.chunks_exact_mut(width.max(1)).zip(bytes.chunks_exact(self.row_bytes.max(1))) {
                decode_row(self.kv_type, head_dim, row, o).map_err(|e| EngineError::Kv(e.to_string()))?;
            }
            Ok(out)
        };
        Ok((decode(k)?, decode(v)?))
    }
}

impl Engine {
    /// A copy of the KV in use.
    pub fn kv_snapshot(&mut self) -> Result<KvSnapshot, EngineError> {
        self.ensure_regions()?;
        let n = self.n_past();
        let (kv_type, rb) = (self.kv_type(), self.row_bytes());
        let alloc = self.cache.alloc_mut();
        let mut layers = Vec::new();
        for layer in alloc.kv_layers() {
            let (k, v) = alloc.copy_kv_to_cpu(layer)?;
            let bytes = |x: &[f32]| bytemuck::cast_slice::<f32, u8>(x)[..n * rb].to_vec();
            layers.push((bytes(&k), bytes(&v)));
        }
        Ok(KvSnapshot { tokens: self.tokens.clone(), positions: self.cell_pos.clone(), kv_type, row_bytes: rb, layers })
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
        if let Some((cell, &pos)) = snap.positions.iter().enumerate().find(|&(i, &p)| p != i as i32) {
            return bad(format!("cell {cell} holds position {pos}: cells must be at their positions"));
        }
        let n_layer = self.model.hparams().n_layer as usize;
        if snap.layers.len() != n_layer {
            return bad(format!("{} layers, the model has {n_layer}", snap.layers.len()));
        }
        self.ensure_regions()?;
        let (kv_type, rb) = (self.kv_type(), self.row_bytes());
        // Everything is checked before anything is written.
        if snap.kv_type != kv_type {
            return bad(format!("cells stored as {}, this engine's are {kv_type}", snap.kv_type));
        }
        if snap.row_bytes != rb || snap.layers.iter().any(|(k, v)| k.len() != n * rb || v.len() != n * rb) {
            return bad(format!("rows of {} bytes, this engine's are {rb}", snap.row_bytes));
        }
        // The tokens are set first: if a layer fails to write, edit_kv's failure path forgets
        // the whole KV rather than leave some layers restored.
        self.tokens = snap.tokens.clone();
        self.cell_pos = snap.positions.clone();
        let mut layers = snap.layers.iter();
        self.edit_kv(|k, v| {
            let (ks, vs) = layers.next().ok_or_else(|| EngineError::Kv("a layer is missing".into()))?;
            k[..n * rb].copy_from_slice(ks);
            v[..n * rb].copy_from_slice(vs);
            Ok(())
        })
    }
}
