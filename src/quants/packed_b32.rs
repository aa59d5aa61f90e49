//! Q5_0, Q8_0 and Q4_1 matrices repacked at load for the single-token product (decode): 16
//! rows interleaved per block, in the row lanes of the prefill tiles
//! ([`B32Tile`](super::gemm::B32Tile)) but with the nibbles and Q5_0's fifth bits still
//! packed, so a copy costs what the file's blocks cost (22 bytes per Q5_0 row and block, 34 per
//! Q8_0, 20 per Q4_1).
//!
//! # Why
//!
//! ggml's x86 `vec_dot` for these types (and minfer's twin of it, [`Kernels::dot`]) runs one
//! row at a time: per 32 values it expands the nibbles and the fifth bits, applies the
//! `sign_epi8` trick, multiplies, converts and adds, 15 to 20 instructions per block and row.
//! Where the weights sit in a large cache (an Intel Xeon with 480 MiB of L3 holds the whole
//! 0.5B) decode is bound by that arithmetic, not by memory (docs/PERFORMANCE.md). With 16 rows
//! in the lanes of one register every instruction serves 16 rows: 8 `vpdpbusd`, 8 converts and
//! 8 FMAs per block for all of them.
//!
//! # Layout (per 16 rows `g` and block `b`, slot `gb = g * per_row + b`)
//!
//! * Q8_0: `q[8 gb + k]` holds, at bytes `4r..4r + 4`, row `r`'s values `4k..4k + 4` as
//!   unsigned bytes `u = q + 128` (ggml's lane `k` of 16 rows side by side).
//! * Q5_0: `q[4 gb + j]` holds, at bytes `4r..4r + 4`, row `r`'s `qs[4j..4j + 4]`: the low
//!   nibbles are values `4j..4j + 4` (lane `j`), the high nibbles values `16 + 4j..` (lane
//!   `j + 4`). `high[gb]`, eight little-endian `u64` masks: bit `4r + i` of mask `k` is the
//!   fifth bit of value `4k + i` of row `r`. A lane's unsigned quant is
//!   `u = nibble | bit << 4 = q + 16`.
//! * Q4_1: `q[4 gb + j]` as Q5_0's, without fifth bits: `u = nibble = q`; `m[gb]`, the 16
//!   rows' block mins (f16).
//! * `d[gb]`: the 16 rows' block scales, still f16.
//!
//! # Same bits
//!
//! Per row and block the kernels compute ggml's 8 lane integers exactly (`Σ (u - off)·a` as
//! `corr + Σ u·a` with the activation's correction, [`B32Panel`]), and the row's float steps
//! are `vec_dot`'s: `acc[k] = fma(d_w·d_a, lane[k], acc[k])`, then `hsum_float_8` (Q4_1: plus
//! `summs`, the row's `fma(m_w, s_a, summs)` over its blocks, added last). So a packed
//! product equals [`Kernels::dot`] of every row bit for bit; [`b32_packed_scalar`] is the
//! scalar twin (tests in `tests/matmul_packed.rs`). Rows past the last multiple of 16 are
//! zero and never written out.
//!
//! [`Kernels::dot`]: super::simd::Kernels::dot

use super::F16Le;
use super::blocks::{BlockQ4_1, BlockQ5_0, BlockQ8_0};
use super::gemm::{B32Panel, Block32Gemm, LANES, hsum_float_8};
use super::dequant::WeightBlock;
use super::types::GgmlType;

/// 64 bytes on a cache line of their own: one 512-bit register of 16 row lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

const _: () = assert!(std::mem::size_of::<Line>() == 64);

impl Line {
    const ZERO: Line = Line([0; 64]);
}

/// A 32-value block type that packs this way (Q5_0, Q8_0, Q4_1); a type with a min
/// ([`Block32Gemm::HAS_MIN`]) keeps it per 16 rows and block.
pub trait Block32Pack: Block32Gemm + WeightBlock {
    /// Whether the fifth bits come as a line of masks per 16 rows and block.
    const HIGH: bool;
    /// Puts this block in lane `r` of its slot: `q` is the slot's lines
    /// ([`B32Layout::lines`]), `high` its mask line (ignored where there is none).
    fn put(&self, r: usize, q: &mut [Line], high: &mut Line);
    fn scale(&self) -> F16Le;
}

/// Nibbles `qs` (16 bytes, two values each) into lane `r` of the 4 lines `q`: line `j` takes
/// `qs[4j..4j + 4]` (Q5_0's and Q4_1's layout).
fn put_nibbles(qs: &[u8; 16], r: usize, q: &mut [Line]) {
    for (line, word) in q.iter_mut().zip(qs.chunks_exact(4)) {
        line.0[4 * r..4 * r + 4].copy_from_slice(word);
    }
}

impl Block32Pack for BlockQ5_0 {
    const HIGH: bool = true;
    fn put(&self, r: usize, q: &mut [Line], high: &mut Line) {
        put_nibbles(&self.qs, r, q);
        let qh = u32::from_le_bytes(self.qh);
        for (k, mask) in high.0.chunks_exact_mut(8).enumerate() {
            let bits = u64::from((qh >> (4 * k)) & 0xf) << (4 * r);
            for (m, b) in mask.iter_mut().zip(bits.to_le_bytes()) {
                *m |= b;
            }
        }
    }
    fn scale(&self) -> F16Le {
        self.d
    }
}

impl Block32Pack for BlockQ4_1 {
    const HIGH: bool = false;
    fn put(&self, r: usize, q: &mut [Line], _high: &mut Line) {
        put_nibbles(&self.qs, r, q);
    }
    fn scale(&self) -> F16Le {
        self.d
    }
}

impl Block32Pack for BlockQ8_0 {
    const HIGH: bool = false;
    fn put(&self, r: usize, q: &mut [Line], _high: &mut Line) {
        for (line, four) in q.iter_mut().zip(self.qs.chunks_exact(4)) {
            for (u, &v) in line.0[4 * r..4 * r + 4].iter_mut().zip(four) {
                *u = (v as u8) ^ 0x80;
            }
        }
    }
    fn scale(&self) -> F16Le {
        self.d
    }
}

/// How a [`B32Packed`] holds its quants, from its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum B32Layout {
    /// Q8_0: 8 lines of `q + 128` bytes.
    Bytes,
    /// Q5_0: 4 lines of nibbles and a line of fifth-bit masks.
    Nibbles5,
    /// Q4_1: 4 lines of nibbles, and the mins.
    Nibbles4Min,
}

impl B32Layout {
    /// The layout of `ty`, where it packs.
    pub fn of(ty: GgmlType) -> Option<B32Layout> {
        match ty {
            GgmlType::Q8_0 => Some(B32Layout::Bytes),
            GgmlType::Q5_0 => Some(B32Layout::Nibbles5),
            GgmlType::Q4_1 => Some(B32Layout::Nibbles4Min),
            _ => None,
        }
    }

    /// Lines of quants per 16 rows and block.
    pub fn lines(self) -> usize {
        if self == B32Layout::Bytes { 8 } else { 4 }
    }

    /// `u - q` of the unsigned bytes the kernels multiply (the activations' corrections,
    /// [`B32Panel`]).
    pub fn offset(self) -> i32 {
        match self {
            B32Layout::Bytes => 128,
            B32Layout::Nibbles5 => 16,
            B32Layout::Nibbles4Min => 0,
        }
    }
}

/// A whole Q5_0, Q8_0 or Q4_1 matrix repacked (see the module docs): `groups()` groups of
/// [`LANES`] rows, `per_row` blocks each.
#[derive(Debug, Clone)]
pub struct B32Packed {
    pub ty: GgmlType,
    /// [`B32Layout::lines`] lines per slot.
    pub q: Vec<Line>,
    /// One mask line per slot for Q5_0, else empty.
    pub high: Vec<Line>,
    pub d: Vec<[F16Le; LANES]>,
    /// The mins per slot for Q4_1, else empty.
    pub m: Vec<[F16Le; LANES]>,
    pub rows: usize,
    pub per_row: usize,
}

impl B32Packed {
    /// Repacks `blocks` (`[rows][per_row]`, the file's order). `None` when the lengths do not
    /// agree.
    pub fn new<W: Block32Pack>(blocks: &[W], rows: usize, per_row: usize) -> Option<B32Packed> {
        B32Packed::new_with(blocks, rows, per_row, &mut |_| {})
    }

    /// [`B32Packed::new`], calling `rows_done(n)` once the first `n` rows are copied (after
    /// every row), so that a caller can release the source as the copy grows.
    pub fn new_with<W: Block32Pack>(blocks: &[W], rows: usize, per_row: usize, rows_done: &mut dyn FnMut(usize)) -> Option<B32Packed> {
        let ty = <W as WeightBlock>::TYPE;
        let lines = B32Layout::of(ty)?.lines();
        if per_row == 0 || rows.checked_mul(per_row) != Some(blocks.len()) {
            return None;
        }
        let slots = rows.div_ceil(LANES) * per_row;
        let mut q = vec![Line::ZERO; slots * lines];
        let mut high = vec![Line::ZERO; if W::HIGH { slots } else { 0 }];
        let mut d = vec![[F16Le([0, 0]); LANES]; slots];
        let mut m = vec![[F16Le([0, 0]); LANES]; if W::HAS_MIN { slots } else { 0 }];
        let mut spare = Line::ZERO;
        for (row, blocks_of_row) in blocks.chunks_exact(per_row).enumerate() {
            let (g, r) = (row / LANES, row % LANES);
            for (b, blk) in blocks_of_row.iter().enumerate() {
                let gb = g * per_row + b;
                let h = if W::HIGH { &mut high[gb] } else { &mut spare };
                blk.put(r, &mut q[gb * lines..(gb + 1) * lines], h);
                d[gb][r] = blk.scale();
                if W::HAS_MIN {
                    m[gb][r] = blk.min();
                }
            }
            rows_done(row + 1);
        }
        Some(B32Packed { ty, q, high, d, m, rows, per_row })
    }

    /// The layout of the quants (from the type; `Bytes` for a type that does not pack, which
    /// [`B32Packed::consistent`] then refuses).
    pub fn layout(&self) -> B32Layout {
        B32Layout::of(self.ty).unwrap_or(B32Layout::Bytes)
    }

    /// Lines of quants per slot.
    pub fn lines(&self) -> usize {
        self.layout().lines()
    }

    /// The layout's [`B32Layout::offset`], for the activations' corrections ([`B32Panel`]).
    pub fn offset(&self) -> i32 {
        self.layout().offset()
    }

    /// Groups of [`LANES`] rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.q.as_slice())
            + std::mem::size_of_val(self.high.as_slice())
            + std::mem::size_of_val(self.d.as_slice())
            + std::mem::size_of_val(self.m.as_slice())
    }

    /// Whether the arrays hold what `rows`, `per_row` and the type say (a kernel checks this
    /// before it reads).
    pub fn consistent(&self) -> bool {
        let slots = self.groups() * self.per_row;
        let Some(layout) = B32Layout::of(self.ty) else { return false };
        let high = if layout == B32Layout::Nibbles5 { slots } else { 0 };
        let mins = if layout == B32Layout::Nibbles4Min { slots } else { 0 };
        self.q.len() == slots * layout.lines()
            && self.high.len() == high
            && self.d.len() == slots
            && self.m.len() == mins
    }

    /// The unsigned quants of value `4k + i` of lane `r` in slot `gb` (the scalar reading of
    /// the layout).
    fn quant(&self, gb: usize, r: usize, k: usize, i: usize) -> u8 {
        let layout = self.layout();
        if layout == B32Layout::Bytes {
            return self.q[gb * 8 + k].0[4 * r + i];
        }
        let byte = self.q[gb * 4 + k % 4].0[4 * r + i];
        let nibble = if k < 4 { byte & 0x0f } else { byte >> 4 };
        if layout == B32Layout::Nibbles4Min {
            return nibble;
        }
        let mask = u64::from_le_bytes(std::array::from_fn(|j| self.high[gb].0[8 * k + j]));
        nibble | ((((mask >> (4 * r + i)) & 1) as u8) << 4)
    }
}

/// The scalar twin of the packed kernels: the 16 rows of group `g` against one token (a
/// one-token [`B32Panel`], with the activations' sums where the type has mins), each in
/// `vec_dot`'s lane integers and float order. `None` where the shapes do not fit.
pub fn b32_packed_scalar(w: &B32Packed, g: usize, panel: &B32Panel) -> Option<[f32; LANES]> {
    let (y, corr, da) = (panel.acts.first()?, panel.corr.first()?, panel.da.first()?);
    let n = w.per_row;
    let min = w.layout() == B32Layout::Nibbles4Min;
    let sa: &[f32] = if min { panel.sa.first()? } else { &[] };
    if !w.consistent() || g >= w.groups() || y.len() != n || corr.len() != n || da.len() != n || (min && sa.len() != n) {
        return None;
    }
    Some(std::array::from_fn(|r| {
        let mut acc = [0.0f32; 8];
        let mut summs = 0.0f32;
        for b in 0..n {
            let gb = g * n + b;
            if min {
                summs = w.m[gb][r].to_f32().mul_add(sa[b], summs);
            }
            let dd = w.d[gb][r].to_f32() * da[b];
            for (k, lane) in acc.iter_mut().enumerate() {
                let isum: i32 = corr[b][k]
                    + (0..4).map(|i| i32::from(w.quant(gb, r, k, i)) * i32::from(y[b].qs[4 * k + i])).sum::<i32>();
                *lane = dd.mul_add(isum as f32, *lane);
            }
        }
        // Added only where there are mins: `x + 0.0` would turn a -0.0 into +0.0.
        if min { hsum_float_8(&acc) + summs } else { hsum_float_8(&acc) }
    }))
}
