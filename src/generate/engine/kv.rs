//! Editing the KV of an [`Engine`]'s sequence 0 in place: removing cells and moving positions, as llama.cpp's
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
//!
//! Every edit runs on the backend that owns the KV regions: removal is the backend's own
//! `copy_tensor` inside each region, the shift is the model's K-shift graph executed like any
//! forward pass, and snapshots read and write only the rows in use through `get_tensor` /
//! `set_tensor` — no host copy of whole regions.

use super::{Engine, EngineError};
use crate::backends::cpu::kernels::kv_cache::decode_row;
use crate::graph::KvType;

impl Engine {
    /// Bytes of every layer's K and V regions (the whole context, used or not).
    pub fn kv_bytes(&self) -> usize {
        let h = self.model.hparams();
        let per_region = self.kv_type().region_bytes((h.n_head_kv * h.head_dim) as usize, self.cparams.n_ctx);
        2 * h.n_layer as usize * per_region
    }

    /// The position each cell of sequence 0 has its K rotated with.
    pub fn kv_positions(&self) -> &[i32] {
        &self.seqs[0].cell_pos
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
            let alloc = self.cache.alloc_mut();
            let moved = alloc.kv_layers().into_iter().try_for_each(|layer| alloc.move_kv_rows(layer, p1 * rb, p0 * rb, (n_past - p1) * rb));
            if let Err(e) = moved {
                // Some layers moved, others not: the KV is forgotten rather than left mixed.
                self.reset();
                return Err(e.into());
            }
        }
        self.seqs[0].tokens.drain(p0..p1);
        self.seqs[0].cell_pos.drain(p0..p1);
        Ok(())
    }

    /// Adds `delta` to the positions of cells `p0..p1`, re-rotating their K rows.
    pub fn kv_shift(&mut self, p0: usize, p1: usize, delta: i32) -> Result<(), EngineError> {
        let n_past = self.n_past();
        if p0 > p1 || p1 > n_past {
            return Err(EngineError::KvRange { p0, p1, n_past });
        }
        if self.seqs[0].cell_pos[p0..p1].iter().any(|&p| p + delta < 0) {
            return Err(EngineError::KvShiftBelowZero { p0, p1, delta });
        }
        if p0 == p1 || delta == 0 {
            return Ok(());
        }
        let mut deltas = vec![0i32; self.cparams.n_ctx];
        deltas[p0..p1].iter_mut().for_each(|d| *d = delta);
        let params = self.graph_params(1, 1);
        let graph = self.model.def.build_kv_shift(&params)?;
        let shifted = self.cache.run_once(graph, &self.sched, |g, alloc| alloc.fill_input_i32(g, "kv_deltas", &deltas));
        if let Err(e) = shifted {
            self.reset();
            return Err(e.into());
        }
        self.seqs[0].cell_pos[p0..p1].iter_mut().for_each(|p| *p += delta);
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
    /// A copy of the KV in use (the first `n_past` rows of every region).
    pub fn kv_snapshot(&mut self) -> Result<KvSnapshot, EngineError> {
        self.seq_snapshot(0)
    }

    /// Replaces the KV with `snap` (taken from an engine of the same model, any context size
    /// that holds it). Nothing changes when it does not fit.
    pub fn kv_restore(&mut self, snap: &KvSnapshot) -> Result<(), EngineError> {
        self.seq_restore(0, snap)
    }

    /// A copy of sequence `seq`'s KV (its cells in use, of every layer).
    pub fn seq_snapshot(&mut self, seq: usize) -> Result<KvSnapshot, EngineError> {
        let n_seq = self.seqs.len();
        let s = self.seqs.get(seq).ok_or(EngineError::NoSequence { seq, n_seq })?;
        let (tokens, positions) = (s.tokens.clone(), s.cell_pos.clone());
        let n = tokens.len();
        let (kv_type, rb) = (self.kv_type(), self.row_bytes());
        let at = seq * self.n_ctx_seq * rb;
        let alloc = self.cache.alloc_mut();
        let mut layers = Vec::new();
        for layer in alloc.kv_layers() {
            let (mut k, mut v) = (vec![0u8; n * rb], vec![0u8; n * rb]);
            alloc.read_kv(layer, false, at, &mut k)?;
            alloc.read_kv(layer, true, at, &mut v)?;
            layers.push((k, v));
        }
        Ok(KvSnapshot { tokens, positions, kv_type, row_bytes: rb, layers })
    }

    /// Replaces sequence `seq`'s KV with `snap` (taken from an engine of the same model, any
    /// context size that holds it). Nothing changes when it does not fit; a write that fails
    /// midway leaves the sequence empty.
    pub fn seq_restore(&mut self, seq: usize, snap: &KvSnapshot) -> Result<(), EngineError> {
        let n_seq = self.seqs.len();
        if seq >= n_seq {
            return Err(EngineError::NoSequence { seq, n_seq });
        }
        let n = snap.tokens.len();
        let n_ctx = self.n_ctx_seq;
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
        if let Some(&id) = snap.tokens.iter().find(|&&t| t as usize >= self.n_vocab()) {
            return bad(format!("token {id} is outside the vocabulary ({})", self.n_vocab()));
        }
        let (kv_type, rb) = (self.kv_type(), self.row_bytes());
        // Everything is checked before anything is written.
        if snap.kv_type != kv_type {
            return bad(format!("cells stored as {}, this engine's are {kv_type}", snap.kv_type));
        }
        if snap.row_bytes != rb || snap.layers.iter().any(|(k, v)| k.len() != n * rb || v.len() != n * rb) {
            return bad(format!("rows of {} bytes, this engine's are {rb}", snap.row_bytes));
        }
        let at = seq * n_ctx * rb;
        let alloc = self.cache.alloc_mut();
        let written = alloc.kv_layers().into_iter().zip(&snap.layers).try_for_each(|(layer, (ks, vs))| {
            alloc.write_kv(layer, false, at, ks)?;
            alloc.write_kv(layer, true, at, vs)
        });
        if let Err(e) = written {
            // Some layers restored, others not: forget the KV rather than keep a mix.
            self.seqs[seq] = Default::default();
            return Err(e.into());
        }
        self.seqs[seq].tokens = snap.tokens.clone();
        self.seqs[seq].cell_pos = snap.positions.clone();
        Ok(())
    }
}
