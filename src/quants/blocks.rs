//! ggml's packed block layouts (`ggml-common.h`) as `#[repr(C)]` structs, and the bit unpacking
//! that turns a block's packed fields into plain integers.
//!
//! Every weight block has alignment 1 (f16 fields are [`F16Le`]), so `bytemuck::cast_slice`
//! views any byte slice of a memory-mapped GGUF file as blocks, at any offset, without copying
//! and without `unsafe`. The activation-only [`BlockQ8K`] holds a native `f32` and `i16`s and
//! has alignment 4: it only ever lives in buffers this crate allocates.
//!
//! Notation in the layout notes: a block holds `N` values `x[0..N]`; "nibble lo/hi" is bits
//! 0..4 / 4..8 of a byte. The unpack helpers return integers in value order (`q[i]` belongs
//! to `x[i]`), so dequantizers and dot products share one description of each layout.

use bytemuck::{Pod, Zeroable};

use super::scalars::F16Le;

/// Values per super-block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Values per block of the 32-value formats (`QK4_0` … `QK8_1`).
pub const QK32: usize = 32;

/// `Q4_0`, 18 bytes, 32 values: `x[i] = d * (q[i] - 8)`.
///
/// `qs[j]` nibble lo is `q[j]`, nibble hi is `q[j + 16]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; 16],
}

/// `Q4_1`, 20 bytes, 32 values: `x[i] = d * q[i] + m`, nibbles as in [`BlockQ4_0`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; 16],
}

/// `Q5_0`, 22 bytes, 32 values: `x[i] = d * (q[i] - 16)`, `q` 5 bits.
///
/// Low 4 bits as in [`BlockQ4_0`]; bit 4 of `q[i]` is bit `i` of the little-endian u32 `qh`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `Q5_1`, 24 bytes, 32 values: `x[i] = d * q[i] + m`, `q` 5 bits packed as in [`BlockQ5_0`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `Q8_0`, 34 bytes, 32 values: `x[i] = d * qs[i]`. Both a weight format and the activation
/// format paired with Q4_0, Q5_0 and Q8_0 weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; 32],
}

/// `Q8_1`, 36 bytes, 32 values: `x[i] = d * qs[i]`, plus `s = d * Σ qs` (as ggml rounds it,
/// see [`quantize_row_q8_1`](super::quantize_row_q8_1)). Activation format for Q4_1 and Q5_1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Le,
    pub s: F16Le,
    pub qs: [i8; 32],
}

/// `Q2_K`, 84 bytes, 256 values in 16 sub-blocks of 16:
/// `x[i] = d * sc[i/16] * q[i] - dmin * m[i/16]`, `q` 2 bits.
///
/// `scales[k]`: nibble lo `sc[k]`, nibble hi `m[k]`. The quants come in two halves of 128
/// values; in half `h`, value `128h + 32j + l` (`j` 0..4, `l` 0..32) is bits `2j..2j+2` of
/// `qs[32h + l]`.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: F16Le,
    pub dmin: F16Le,
}

/// `Q3_K`, 110 bytes, 256 values in 16 sub-blocks of 16: `x[i] = d * (sc[i/16] - 32) * q[i]`,
/// `q` in -4..=3.
///
/// Low 2 bits of `q` are packed as in [`BlockQ2K`]. For value `128h + 32j + l`, the "high" bit
/// is bit `4h + j` of `hmask[l]`; when it is *clear*, 4 is subtracted. The 16 six-bit scales
/// `sc[k]`: low 4 bits are nibble lo of `scales[k]` for `k < 8`, nibble hi of `scales[k - 8]`
/// otherwise; high 2 bits are bits `2(k/4)..2(k/4)+2` of `scales[8 + k%4]`.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: F16Le,
}

/// `Q4_K`, 144 bytes, 256 values in 8 sub-blocks of 32:
/// `x[i] = d * sc[i/32] * q[i] - dmin * m[i/32]`, `q` 4 bits, `sc`/`m` 6 bits.
///
/// Value `64c + l` (`c` 0..4, `l` 0..32) is nibble lo of `qs[32c + l]`, value `64c + 32 + l`
/// its nibble hi. Scales and mins are packed in 12 bytes, see [`k4_scales_mins`].
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// `Q5_K`, 176 bytes, 256 values: like [`BlockQ4K`] with a fifth bit: bit 4 of value
/// `32s + l` (sub-block `s`, `l` 0..32) is bit `s` of `qh[l]`.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// `Q6_K`, 210 bytes, 256 values in 16 sub-blocks of 16: `x[i] = d * scales[i/16] * (q[i] - 32)`,
/// `q` 6 bits, `scales` signed 8 bits.
///
/// In half `h` (values `128h..128h+128`), for `l` 0..32, with `L = ql[64h..]`, `H = qh[32h..]`:
/// value `+l` is `L[l]` lo | `H[l]` bits 0..2 << 4; `+32+l` is `L[l+32]` lo | bits 2..4;
/// `+64+l` is `L[l]` hi | bits 4..6; `+96+l` is `L[l+32]` hi | bits 6..8.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: F16Le,
}

/// `Q8_K`, 292 bytes, 256 values: `x[i] = d * qs[i]`, `bsums[k] = Σ qs[16k..16k+16]`.
/// Activation format of the K-quants; `d` is a full f32, so this block is aligned 4 and never
/// read from a file.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ2K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ3K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ4K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ5K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ6K>() == 1);

impl Default for BlockQ8K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

/// The 16 low nibbles then the 16 high nibbles of `qs`: the 4-bit quants of a 32-value block
/// in value order.
#[inline]
fn nibbles32(qs: &[u8; 16]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = b & 0x0f;
        q[j + 16] = b >> 4;
    }
    q
}

/// 5-bit quants: [`nibbles32`] plus bit `i` of the little-endian `qh` as bit 4 of `q[i]`.
#[inline]
fn quints32(qh: &[u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let h = u32::from_le_bytes(*qh);
    let mut q = nibbles32(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

impl BlockQ4_0 {
    /// Quants in value order, already offset: -8..=7.
    #[inline]
    pub fn quants(&self) -> [i8; 32] {
        nibbles32(&self.qs).map(|q| q as i8 - 8)
    }
}

impl BlockQ4_1 {
    /// Quants in value order: 0..=15.
    #[inline]
    pub fn quants(&self) -> [u8; 32] {
        nibbles32(&self.qs)
    }
}

impl BlockQ5_0 {
    /// Quants in value order, already offset: -16..=15.
    #[inline]
    pub fn quants(&self) -> [i8; 32] {
        quints32(&self.qh, &self.qs).map(|q| q as i8 - 16)
    }
}

impl BlockQ5_1 {
    /// Quants in value order: 0..=31.
    #[inline]
    pub fn quants(&self) -> [u8; 32] {
        quints32(&self.qh, &self.qs)
    }
}

/// The 2-bit fields of 128 values packed in 32 bytes: value `32j + l` is bits `2j..2j+2` of
/// `qs[l]`.
#[inline]
fn crumbs128(qs: &[u8], out: &mut [u8]) {
    for j in 0..4 {
        for l in 0..32 {
            out[32 * j + l] = (qs[l] >> (2 * j)) & 3;
        }
    }
}

impl BlockQ2K {
    /// Quants in value order: 0..=3.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for h in 0..2 {
            crumbs128(
                &self.qs[32 * h..32 * h + 32],
                &mut q[128 * h..128 * h + 128],
            );
        }
        q
    }

    /// Scale of sub-block `k` (0..16): 0..=15.
    #[inline]
    pub fn scale(&self, k: usize) -> u8 {
        self.scales[k] & 0x0f
    }

    /// Min of sub-block `k` (0..16): 0..=15.
    #[inline]
    pub fn min(&self, k: usize) -> u8 {
        self.scales[k] >> 4
    }
}

impl BlockQ3K {
    /// Quants in value order, high bit applied: -4..=3.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        let mut low = [0u8; QK_K];
        for h in 0..2 {
            crumbs128(
                &self.qs[32 * h..32 * h + 32],
                &mut low[128 * h..128 * h + 128],
            );
        }
        let mut q = [0i8; QK_K];
        for (i, v) in q.iter_mut().enumerate() {
            // value i = 128h + 32j + l uses bit 4h + j = i / 32 of hmask[l].
            let high_set = self.hmask[i % 32] & (1 << (i / 32)) != 0;
            *v = low[i] as i8 - if high_set { 0 } else { 4 };
        }
        q
    }

    /// The 16 sub-block scales, already offset by -32: -32..=31.
    #[inline]
    pub fn scales(&self) -> [i8; 16] {
        let s = &self.scales;
        std::array::from_fn(|k| {
            let lo = if k < 8 { s[k] & 0x0f } else { s[k - 8] >> 4 };
            let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
            (lo | (hi << 4)) as i8 - 32
        })
    }
}

/// Unpacks the 12-byte scales field of Q4_K and Q5_K into 8 six-bit scales and 8 six-bit mins
/// (ggml's `get_scale_min_k4`): for `k < 4`, `sc[k]` and `m[k]` are bits 0..6 of `s[k]` and
/// `s[k + 4]`; for `k >= 4` their low nibbles are nibble lo / hi of `s[k + 4]` and their top two
/// bits are bits 6..8 of `s[k - 4]` / `s[k]`.
#[inline]
pub fn k4_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for k in 0..8 {
        if k < 4 {
            sc[k] = s[k] & 63;
            m[k] = s[k + 4] & 63;
        } else {
            sc[k] = (s[k + 4] & 0x0f) | ((s[k - 4] >> 6) << 4);
            m[k] = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
        }
    }
    (sc, m)
}

impl BlockQ4K {
    /// Quants in value order: 0..=15.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * c + l];
                q[64 * c + l] = b & 0x0f;
                q[64 * c + 32 + l] = b >> 4;
            }
        }
        q
    }

    /// The 8 sub-block scales and mins: 0..=63.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        k4_scales_mins(&self.scales)
    }
}

impl BlockQ5K {
    /// Quants in value order: 0..=31.
    #[inline]
    pub fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * c + l];
                let h = self.qh[l];
                q[64 * c + l] = (b & 0x0f) | (((h >> (2 * c)) & 1) << 4);
                q[64 * c + 32 + l] = (b >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
            }
        }
        q
    }

    /// The 8 sub-block scales and mins: 0..=63.
    #[inline]
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        k4_scales_mins(&self.scales)
    }
}

impl BlockQ6K {
    /// Quants in value order, already offset: -32..=31.
    #[inline]
    pub fn quants(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            let ql = &self.ql[64 * h..64 * h + 64];
            let qh = &self.qh[32 * h..32 * h + 32];
            let out = &mut q[128 * h..128 * h + 128];
            for l in 0..32 {
                let six = |lo: u8, shift: u32| (lo | (((qh[l] >> shift) & 3) << 4)) as i8 - 32;
                out[l] = six(ql[l] & 0x0f, 0);
                out[l + 32] = six(ql[l + 32] & 0x0f, 2);
                out[l + 64] = six(ql[l] >> 4, 4);
                out[l + 96] = six(ql[l + 32] >> 4, 6);
            }
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cast_from_any_offset() {
        let buf = vec![0x5au8; 3 + 2 * 144];
        for off in 0..3 {
            let blocks: &[BlockQ4K] = bytemuck::cast_slice(&buf[off..off + 2 * 144]);
            assert_eq!(blocks.len(), 2);
            assert_eq!(blocks[1].qs[127], 0x5a);
        }
    }

    #[test]
    fn q3k_scales_unpack() {
        let mut b: BlockQ3K = Zeroable::zeroed();
        // sc[0] = 0x3f (low nibble of byte 0, bits 0..2 of byte 8), sc[9] = 0x21 (hi nibble of
        // byte 1, bits 4..6 of byte 9), sc[15] = 0x30 (hi nibble of byte 7, bits 6..8 of byte 11).
        b.scales[0] = 0x0f;
        b.scales[8] = 0x03;
        b.scales[1] = 0x10;
        b.scales[9] = 0x20;
        b.scales[11] = 0xc0;
        let s = b.scales();
        assert_eq!(s[0], 0x3f - 32);
        assert_eq!(s[9], 0x21 - 32);
        assert_eq!(s[15], 0x30 - 32);
        assert_eq!(s[1], -32);
    }

    #[test]
    fn k4_scales_unpack() {
        let mut s = [0u8; 12];
        s[0] = 0xc5; // sc[0] = 5, top bits feed sc[4]
        s[4] = 0x80 | 7; // m[0] = 7, top bits feed m[4]
        s[8] = 0x9a; // sc[4] lo = 0xa, m[4] lo = 0x9
        let (sc, m) = k4_scales_mins(&s);
        assert_eq!(sc[0], 5);
        assert_eq!(m[0], 7);
        assert_eq!(sc[4], 0x3a);
        assert_eq!(m[4], 0x29);
    }
}
