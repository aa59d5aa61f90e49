//! Rotary position embedding as ggml's `rope_ext` computes it (no YaRN: `ext_factor` 0,
//! `freq_scale` 1, `attn_factor` 1, no frequency factors), in its two plain layouts:
//!
//! * NeoX ([`RopeMode::Neox`], `GGML_ROPE_TYPE_NEOX`, Qwen2/Qwen3): pair `i` is
//!   `(x[i], x[i + n_rot/2])`;
//! * normal ([`RopeMode::Normal`], `GGML_ROPE_TYPE_NORMAL`, "interleaved", LLaMA-style GGUFs):
//!   pair `i` is `(x[2i], x[2i+1])`;
//!
//! each on the first `n_rot` dimensions of every head (`n_rot` even, `<= head_dim`); the
//! dimensions `n_rot..head_dim` pass through unchanged (partial rotation). [`rope_neox`] and
//! [`RopeCache::new`] are the NeoX case with `n_rot = head_dim`; [`rope_ext`] takes a
//! [`RopeSpec`].
//!
//! The cos/sin table of a token follows `ggml_rope_cache_init`: `theta` starts at the
//! position (converted to f32) and is multiplied by `theta_scale = powf(freq_base,
//! -2.0f/n_rot)` after each pair, iteratively (not one `powf` per dimension); each pair
//! stores `cosf(theta)`, `sinf(theta)` (the C library's, which Rust's `f32::cos`/`sin` call
//! on Linux as ggml does). Pair `i` uses entry `i` in both layouts (ggml fills the table for
//! all `head_dim/2` pairs; the entries past `n_rot/2` are never read, so they are not kept
//! here).
//!
//! A [`RopeCache`] holds the tables of a batch's positions, so Q and K (and every layer) share
//! them; the table of a token depends only on its position, so a token gets the same bits in
//! any batch.

use super::error::{OpsError, check_len, rows_of};
use super::isa::Isa;
#[cfg(target_arch = "x86_64")]
use super::isa::Kernels;

/// Which dimensions of a head form the rotated pairs (ggml's `mode` of `rope_ext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// `GGML_ROPE_TYPE_NORMAL` (0): adjacent pairs `(x[2i], x[2i+1])`, `i < n_rot/2`.
    Normal,
    /// `GGML_ROPE_TYPE_NEOX` (2): split halves `(x[i], x[i + n_rot/2])`, `i < n_rot/2`.
    Neox,
}

/// The geometry of a RoPE: layout, heads per token, head size, rotated dimensions (the first
/// `n_rot` of each head; even, positive, `<= head_dim`) and frequency base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    pub mode: RopeMode,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub freq_base: f32,
}

impl RopeSpec {
    /// NeoX over whole heads (`n_rot = head_dim`), what [`rope_neox`] computes.
    pub fn neox(n_head: usize, head_dim: usize, freq_base: f32) -> RopeSpec {
        RopeSpec {
            mode: RopeMode::Neox,
            n_head,
            head_dim,
            n_rot: head_dim,
            freq_base,
        }
    }

    /// [`OpsError::BadDim`] unless `head_dim` and `n_rot` are positive, `n_rot` is even and
    /// `n_rot <= head_dim`, `head_dim` is even (ggml copies the unrotated tail in pairs), and
    /// `n_head` is positive.
    pub fn check(&self) -> Result<(), OpsError> {
        check_geometry(self.head_dim, self.n_rot)?;
        if self.n_head == 0 {
            return Err(OpsError::BadDim {
                what: "n_head",
                value: 0,
                why: "RoPE needs at least one head",
            });
        }
        Ok(())
    }
}

/// The head-size checks shared by [`RopeCache`] and [`RopeSpec::check`].
fn check_geometry(head_dim: usize, n_rot: usize) -> Result<(), OpsError> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(OpsError::BadDim {
            what: "head_dim",
            value: head_dim,
            why: "RoPE needs an even, positive head size",
        });
    }
    if n_rot == 0 || !n_rot.is_multiple_of(2) {
        return Err(OpsError::BadDim {
            what: "n_rot",
            value: n_rot,
            why: "RoPE needs an even, positive number of rotated dimensions",
        });
    }
    if n_rot > head_dim {
        return Err(OpsError::BadDim {
            what: "n_rot",
            value: n_rot,
            why: "RoPE cannot rotate more dimensions than the head has",
        });
    }
    Ok(())
}

/// The cos/sin tables of a batch of positions for one head geometry, layout and frequency base.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeCache {
    mode: RopeMode,
    head_dim: usize,
    n_rot: usize,
    /// `[nt][n_rot / 2]` pairs of (cos, sin).
    cos_sin: Vec<[f32; 2]>,
}

impl RopeCache {
    /// The NeoX tables over whole heads for `positions` (one per token). `head_dim` must be
    /// even and positive.
    pub fn new(positions: &[i32], head_dim: usize, freq_base: f32) -> Result<RopeCache, OpsError> {
        Self::build(positions, RopeMode::Neox, head_dim, head_dim, freq_base)
    }

    /// The tables of `spec`'s layout, head size, `n_rot` and base for `positions` (one per
    /// token); `spec.n_head` is not part of the tables (pass it to [`apply`](Self::apply)).
    pub fn with_spec(positions: &[i32], spec: &RopeSpec) -> Result<RopeCache, OpsError> {
        Self::build(
            positions,
            spec.mode,
            spec.head_dim,
            spec.n_rot,
            spec.freq_base,
        )
    }

    fn build(
        positions: &[i32],
        mode: RopeMode,
        head_dim: usize,
        n_rot: usize,
        freq_base: f32,
    ) -> Result<RopeCache, OpsError> {
        check_geometry(head_dim, n_rot)?;
        let half = n_rot / 2;
        let theta_scale = theta_scale(freq_base, n_rot);
        let mut cos_sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            let mut theta = p as f32;
            for _ in 0..half {
                cos_sin.push([theta.cos(), theta.sin()]);
                theta *= theta_scale;
            }
        }
        Ok(RopeCache {
            mode,
            head_dim,
            n_rot,
            cos_sin,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The number of rotated dimensions at the start of each head.
    pub fn n_rot(&self) -> usize {
        self.n_rot
    }

    pub fn mode(&self) -> RopeMode {
        self.mode
    }

    /// The number of tokens (positions) covered.
    pub fn n_tokens(&self) -> usize {
        self.cos_sin.len() / (self.n_rot / 2)
    }

    /// Token `t`'s `n_rot / 2` (cos, sin) pairs.
    pub fn token(&self, t: usize) -> &[[f32; 2]] {
        let half = self.n_rot / 2;
        &self.cos_sin[t * half..(t + 1) * half]
    }

    /// Rotates `x`, `[nt][n_head * head_dim]`, in place with the tables of its tokens; the
    /// last `head_dim - n_rot` values of each head are left as they are.
    // [n_head*head_dim, nt] feature-major, token-major memory
    pub fn apply(&self, x: &mut [f32], n_head: usize) -> Result<(), OpsError> {
        self.apply_with(Isa::detected(), x, n_head)
    }

    /// [`apply`](Self::apply) compiled for `isa` (or the best supported below it): with FMA
    /// in the instruction set each `mul_add` is one instruction and the loop is vectorized;
    /// without it, a call into the C library's `fmaf` per value. The same bits either way.
    pub fn apply_with(&self, isa: Isa, x: &mut [f32], n_head: usize) -> Result<(), OpsError> {
        let nt = self.n_tokens();
        let width = n_head * self.head_dim;
        check_len("rope input", nt * width, x.len())?;
        if width == 0 {
            return Ok(());
        }
        match isa.kernels() {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(t) => t.rope_rows(self, x, width),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(t) => t.rope_rows(self, x, width),
            _ => self.rotate_rows(x, width),
        }
        Ok(())
    }

    /// The rotation of every token row of `x` (`width` values each, checked by the caller).
    /// Inlined into the ISA wrappers (`simd_x86`), which compile it with their features.
    #[inline(always)]
    pub(crate) fn rotate_rows(&self, x: &mut [f32], width: usize) {
        let hd = self.head_dim;
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            let cs = self.token(t);
            for head in row.chunks_exact_mut(hd) {
                let rotated = &mut head[..self.n_rot];
                match self.mode {
                    RopeMode::Neox => rotate_neox(rotated, cs),
                    RopeMode::Normal => rotate_normal(rotated, cs),
                }
            }
        }
    }
}

/// `powf(freq_base, -2.0f / n_dims)`, the ratio of successive pair frequencies.
pub fn theta_scale(freq_base: f32, n_dims: usize) -> f32 {
    freq_base.powf(-2.0 / n_dims as f32)
}

/// NeoX RoPE in place on `x`, `[nt][n_head * head_dim]`, for the tokens at `positions`.
/// (To rotate Q and K of the same batch, build one [`RopeCache`] and `apply` it twice.)
// [n_head*head_dim, nt] feature-major, token-major memory
pub fn rope_neox(
    x: &mut [f32],
    positions: &[i32],
    n_head: usize,
    head_dim: usize,
    freq_base: f32,
) -> Result<(), OpsError> {
    let cache = RopeCache::new(positions, head_dim, freq_base)?;
    rows_of(
        "rope input (rows of n_head*head_dim)",
        x.len(),
        (n_head * head_dim).max(1),
    )?;
    cache.apply(x, n_head)
}

/// RoPE of `spec`'s layout in place on `x`, `[nt][n_head * head_dim]`, for the tokens at
/// `positions` (one per token): ggml's `rope_ext` with `n_dims = n_rot` and `mode` 0 (normal)
/// or 2 (NeoX). With [`RopeMode::Neox`] and `n_rot == head_dim` it is [`rope_neox`], bit for
/// bit.
// [n_head*head_dim, nt] feature-major, token-major memory
pub fn rope_ext(x: &mut [f32], positions: &[i32], spec: &RopeSpec) -> Result<(), OpsError> {
    rope_ext_with(Isa::detected(), x, positions, spec)
}

/// [`rope_ext`] compiled for `isa` (see [`RopeCache::apply_with`]): the same bits.
// [n_head*head_dim, nt] feature-major, token-major memory
pub fn rope_ext_with(isa: Isa, x: &mut [f32], positions: &[i32], spec: &RopeSpec) -> Result<(), OpsError> {
    spec.check()?;
    rows_of(
        "rope input (rows of n_head*head_dim)",
        x.len(),
        spec.n_head * spec.head_dim,
    )?;
    RopeCache::with_spec(positions, spec)?.apply_with(isa, x, spec.n_head)
}

/// How many position sets [`RopeTables`] keeps: a forward pass rotates Q and K of every
/// layer at the same positions, with one layout and base (two bases for models that mix local
/// and global layers).
const RECENT_TABLES: usize = 4;

/// The tables a backend built last ([`RECENT_TABLES`] of them, newest first), so the Q and K of
/// every layer of a pass share one: a table costs `n_rot` calls of the C library's `cosf` and
/// `sinf` per token (about 2 µs for a 64-wide head), and a decode step of the 0.5B rotates 48
/// times at the same positions. A table depends only on its positions and [`RopeSpec`]'s
/// layout, `head_dim`, `n_rot` and base, all of which are its key, so a hit gives the bits a
/// fresh table would.
#[derive(Debug, Default)]
pub struct RopeTables {
    recent: std::sync::Mutex<Vec<(TableKey, std::sync::Arc<RopeCache>)>>,
}

/// What a table is built from.
#[derive(Debug, Clone, PartialEq)]
struct TableKey {
    positions: Vec<i32>,
    mode: RopeMode,
    head_dim: usize,
    n_rot: usize,
    freq_base_bits: u32,
}

impl RopeTables {
    /// The table of `positions` under `spec` (built on a miss).
    pub fn get(&self, positions: &[i32], spec: &RopeSpec) -> Result<std::sync::Arc<RopeCache>, OpsError> {
        let key = |p: &[i32]| TableKey { positions: p.to_vec(), mode: spec.mode, head_dim: spec.head_dim, n_rot: spec.n_rot, freq_base_bits: spec.freq_base.to_bits() };
        let hit = |k: &TableKey| {
            k.positions == positions && k.mode == spec.mode && k.head_dim == spec.head_dim && k.n_rot == spec.n_rot && k.freq_base_bits == spec.freq_base.to_bits()
        };
        // A worker that panicked holding the lock left whole entries (they are inserted
        // built): the list is still good to read.
        let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = recent.iter().position(|(k, _)| hit(k)) {
            let entry = recent.remove(i);
            let table = entry.1.clone();
            recent.insert(0, entry);
            return Ok(table);
        }
        let table = std::sync::Arc::new(RopeCache::with_spec(positions, spec)?);
        recent.insert(0, (key(positions), table.clone()));
        recent.truncate(RECENT_TABLES);
        Ok(table)
    }
}

/// [`rope_ext_with`] with the table from `tables` (shared with the other rotations at the
/// same positions): the same bits.
// [n_head*head_dim, nt] feature-major, token-major memory
pub fn rope_ext_cached(isa: Isa, x: &mut [f32], positions: &[i32], spec: &RopeSpec, tables: &RopeTables) -> Result<(), OpsError> {
    spec.check()?;
    rows_of("rope input (rows of n_head*head_dim)", x.len(), spec.n_head * spec.head_dim)?;
    tables.get(positions, spec)?.apply_with(isa, x, spec.n_head)
}

/// The rotated part of one head: `(x[i], x[i+h]) <- (x[i] cos - x[i+h] sin, x[i] sin + x[i+h] cos)`, `h` = half,
/// each as ggml's `rotate_pairs` compiles under GCC's `-ffp-contract=fast` (see `rot`).
#[inline(always)]
fn rotate_neox(head: &mut [f32], cs: &[[f32; 2]]) {
    let half = head.len() / 2;
    let (lo, hi) = head.split_at_mut(half);
    for ((a, b), &[c, s]) in lo.iter_mut().zip(hi.iter_mut()).zip(cs) {
        let (x0, x1) = (*a, *b);
        let (y0, y1) = rot(x0, x1, c, s);
        *a = y0;
        *b = y1;
    }
}

/// The rotated part of one head, normal layout: `(x[2i], x[2i+1])` rotated by pair `i`'s
/// (cos, sin), with the same contraction as [`rotate_neox`] (ggml's `rotate_pairs` with
/// `n_offset` 1).
#[inline(always)]
fn rotate_normal(head: &mut [f32], cs: &[[f32; 2]]) {
    for (pair, &[c, s]) in head.chunks_exact_mut(2).zip(cs) {
        let (y0, y1) = rot(pair[0], pair[1], c, s);
        pair[0] = y0;
        pair[1] = y1;
    }
}

/// `x0*c - x1*s` and `x0*s + x1*c`, GCC's contraction: the first product of each expression
/// fused with the rounded second one.
#[inline(always)]
fn rot(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_errors() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let orig = x.clone();
        rope_neox(&mut x, &[0, 0], 2, 4, 10000.0).unwrap();
        assert_eq!(x, orig);
        assert!(matches!(
            rope_neox(&mut x, &[0], 2, 3, 1e4),
            Err(OpsError::BadDim { .. })
        ));
        assert!(matches!(
            rope_neox(&mut x, &[0, 1, 2], 2, 4, 1e4),
            Err(OpsError::Length { .. })
        ));
        assert!(matches!(
            rope_neox(&mut x, &[0, 1], 3, 4, 1e4),
            Err(OpsError::Ragged { .. })
        ));
    }

    #[test]
    fn rope_ext_errors_and_neox_full_is_rope_neox() {
        let spec = |mode, n_head, head_dim, n_rot| RopeSpec {
            mode,
            n_head,
            head_dim,
            n_rot,
            freq_base: 1e4,
        };
        let bad_dim = |r: Result<(), OpsError>, name: &str| {
            assert!(
                matches!(r, Err(OpsError::BadDim { what, .. }) if what == name),
                "{name}: {r:?}"
            );
        };
        let mut x = crate::backends::cpu::kernels::test_data(2 * 2 * 8, 3, 1, 2.0);
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            bad_dim(rope_ext(&mut x, &[0, 1], &spec(mode, 2, 8, 0)), "n_rot");
            bad_dim(rope_ext(&mut x, &[0, 1], &spec(mode, 2, 8, 3)), "n_rot");
            bad_dim(rope_ext(&mut x, &[0, 1], &spec(mode, 2, 8, 10)), "n_rot");
            bad_dim(rope_ext(&mut x, &[0, 1], &spec(mode, 2, 0, 0)), "head_dim");
            bad_dim(
                rope_ext(&mut x[..30], &[0, 1], &spec(mode, 2, 15, 4)),
                "head_dim",
            );
            bad_dim(rope_ext(&mut x, &[0, 1], &spec(mode, 0, 8, 4)), "n_head");
            assert!(matches!(
                rope_ext(&mut x, &[0, 1, 2], &spec(mode, 2, 8, 4)),
                Err(OpsError::Length { .. })
            ));
            assert!(matches!(
                rope_ext(&mut x, &[0, 1], &spec(mode, 3, 8, 4)),
                Err(OpsError::Ragged { .. })
            ));
        }
        // Nothing was touched by the failed calls.
        assert_eq!(x, crate::backends::cpu::kernels::test_data(2 * 2 * 8, 3, 1, 2.0));

        let mut a = x.clone();
        let mut b = x.clone();
        rope_neox(&mut a, &[5, 300], 2, 8, 1e4).unwrap();
        rope_ext(&mut b, &[5, 300], &RopeSpec::neox(2, 8, 1e4)).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            RopeCache::new(&[5, 300], 8, 1e4).unwrap(),
            RopeCache::with_spec(&[5, 300], &RopeSpec::neox(2, 8, 1e4)).unwrap()
        );
    }

    #[test]
    fn partial_tables_use_n_rot() {
        // theta_scale comes from n_rot, and only n_rot/2 pairs are kept.
        let c = RopeCache::with_spec(
            &[9],
            &RopeSpec {
                mode: RopeMode::Normal,
                n_head: 1,
                head_dim: 16,
                n_rot: 6,
                freq_base: 1e4,
            },
        )
        .unwrap();
        assert_eq!(
            (c.n_rot(), c.head_dim(), c.mode(), c.n_tokens()),
            (6, 16, RopeMode::Normal, 1)
        );
        let ts = theta_scale(1e4, 6);
        let mut theta = 9.0f32;
        assert_eq!(c.token(0).len(), 3);
        for pair in c.token(0) {
            assert_eq!(pair[0].to_bits(), theta.cos().to_bits());
            assert_eq!(pair[1].to_bits(), theta.sin().to_bits());
            theta *= ts;
        }
        // Normal layout: pair i is (x[2i], x[2i+1]) with table entry i; the tail is untouched.
        let x: Vec<f32> = crate::backends::cpu::kernels::test_data(16, 4, 2, 3.0);
        let mut y = x.clone();
        c.apply(&mut y, 1).unwrap();
        for (i, &[co, si]) in c.token(0).iter().enumerate() {
            let (y0, y1) = rot(x[2 * i], x[2 * i + 1], co, si);
            assert_eq!(
                (y[2 * i].to_bits(), y[2 * i + 1].to_bits()),
                (y0.to_bits(), y1.to_bits())
            );
        }
        assert_eq!(y[6..], x[6..]);
    }

    #[test]
    fn theta_is_iterative() {
        let c = RopeCache::new(&[7], 8, 10000.0).unwrap();
        let ts = theta_scale(10000.0, 8);
        let mut theta = 7.0f32;
        for pair in c.token(0) {
            assert_eq!(pair[0].to_bits(), theta.cos().to_bits());
            assert_eq!(pair[1].to_bits(), theta.sin().to_bits());
            theta *= ts;
        }
    }

    /// Every (cos, sin) pair's bits of `t`, token by token.
    fn bits(t: &RopeCache) -> Vec<[u32; 2]> {
        (0..t.n_tokens()).flat_map(|i| t.token(i).iter().map(|[c, s]| [c.to_bits(), s.to_bits()]).collect::<Vec<_>>()).collect()
    }

    #[test]
    fn shared_tables_are_keyed_by_everything_they_are_built_from() {
        let tables = RopeTables::default();
        let spec = RopeSpec::neox(2, 8, 10000.0);
        let (p, q) = ([3, 4, 5, 6], [3, 4, 5, 7]);
        let first = tables.get(&p, &spec).unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &tables.get(&p, &spec).unwrap()), "same positions and spec share a table");
        // Any change of what a table is built from gets its own, equal to a fresh build.
        let variants = [
            (q.as_slice(), spec),
            (&p[..3], spec),
            (p.as_slice(), RopeSpec { freq_base: 1e6, ..spec }),
            (p.as_slice(), RopeSpec { n_rot: 4, ..spec }),
            (p.as_slice(), RopeSpec { mode: RopeMode::Normal, ..spec }),
            (p.as_slice(), RopeSpec { head_dim: 16, n_rot: 16, ..spec }),
        ];
        for (pos, sp) in variants {
            let got = tables.get(pos, &sp).unwrap();
            assert!(!std::sync::Arc::ptr_eq(&first, &got), "{pos:?} {sp:?}");
            let fresh = RopeCache::with_spec(pos, &sp).unwrap();
            assert_eq!((got.mode(), got.head_dim(), got.n_rot()), (fresh.mode(), fresh.head_dim(), fresh.n_rot()));
            assert_eq!(bits(&got), bits(&fresh), "{pos:?} {sp:?}");
        }
        // Only the newest RECENT_TABLES are kept; an evicted table is built again, the same.
        let again = tables.get(&p, &spec).unwrap();
        assert!(!std::sync::Arc::ptr_eq(&first, &again));
        assert_eq!(bits(&first), bits(&again));
        assert!(tables.get(&[-1], &spec).is_ok(), "RopeCache takes any position; rope_ext checks the rows");
        assert!(matches!(tables.get(&p, &RopeSpec { n_rot: 3, ..spec }), Err(OpsError::BadDim { what: "n_rot", .. })));
    }

    #[test]
    fn cached_rotation_is_rope_ext() {
        let tables = RopeTables::default();
        for (mode, n_rot) in [(RopeMode::Neox, 64), (RopeMode::Normal, 64), (RopeMode::Neox, 32)] {
            let spec = RopeSpec { mode, n_head: 3, head_dim: 64, n_rot, freq_base: 1e6 };
            let positions = [0, 17, 4095];
            let x: Vec<f32> = (0..3 * 3 * 64).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
            let (mut a, mut b) = (x.clone(), x.clone());
            rope_ext(&mut a, &positions, &spec).unwrap();
            for _ in 0..2 {
                b.copy_from_slice(&x);
                rope_ext_cached(Isa::detected(), &mut b, &positions, &spec, &tables).unwrap();
                assert!(a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits()), "{mode:?} {n_rot}");
            }
            assert!(rope_ext_cached(Isa::detected(), &mut b[..64], &positions, &spec, &tables).is_err(), "rows that do not match the positions");
        }
    }

    /// The FMA-compiled rotations (AVX2, AVX-512) equal the scalar one (`fmaf` per value) bit
    /// for bit, both layouts, whole and partial heads.
    #[test]
    fn every_isa_rotates_as_the_scalar_twin() {
        for (mode, head_dim, n_rot) in [(RopeMode::Neox, 64, 64), (RopeMode::Normal, 64, 64), (RopeMode::Neox, 128, 32), (RopeMode::Normal, 80, 40), (RopeMode::Neox, 6, 6)] {
            let positions = [0, 1, 77, 4095, 131071];
            let table = RopeCache::with_spec(&positions, &RopeSpec { mode, n_head: 3, head_dim, n_rot, freq_base: 1e6 }).unwrap();
            let x: Vec<f32> = (0..positions.len() * 3 * head_dim).map(|i| ((i * 7919) % 2000) as f32 / 400.0 - 2.5).collect();
            let mut want = x.clone();
            table.apply_with(Isa::Scalar, &mut want, 3).unwrap();
            for isa in Isa::supported() {
                let mut got = x.clone();
                table.apply_with(isa, &mut got, 3).unwrap();
                assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{mode:?} {head_dim} {n_rot} {isa:?}");
            }
        }
    }
}
