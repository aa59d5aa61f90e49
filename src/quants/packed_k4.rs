//! Q4_K matrices repacked at load for the single-token product (decode): 16 rows interleaved
//! per super-block, the nibbles still packed, so that one 512-bit register holds 4 values of
//! each of 16 rows and the gemv streams the weights once, in order, with no horizontal sums.
//!
//! # Why
//!
//! llama.cpp repacks a Q4_K matrix of 8k rows at load (`block_q4_Kx8`) and multiplies a single
//! token through `ggml_gemv_q4_K_8x8_q8_K`. minfer's per-row kernel
//! ([`gemv_q4_k`](super::gemv::gemv_q4_k)'s SIMD twins) computes the same integers and float
//! steps one row at a time: it unpacks the 6-bit scales of every block with scalar code and
//! ends each block with a horizontal sum, so it consumes about half the bytes per second a core
//! can read (docs/PERFORMANCE.md). With rows in lanes each lane *is* one row's integer.
//!
//! # Layout ([`K4PackedBlock`], one per 16 rows and super-block)
//!
//! Q4_K stores a super-block's 256 values in 4 chunks of 32 bytes: byte `i` of chunk `c` holds
//! value `64c + i` in its low nibble (sub-block `2c`) and value `64c + 32 + i` in its high one
//! (sub-block `2c + 1`). Here register `8c + t` holds, for each row `r` of the group, the 4
//! bytes `32c + 4t .. 32c + 4t + 4` of that row's `qs` at bytes `4r..4r+4`: its low nibbles
//! are values `64c + 4t ..+4` and its high nibbles values `64c + 32 + 4t ..+4` of every row.
//! The 6-bit scales and mins are unpacked to bytes (`sc[j][r]`; `m[k][2r], m[k][2r + 1]` =
//! `m_{2k}, m_{2k+1}`, pairs for `vpdpwssd`), `d` and `dmin` stay f16. 2368 bytes per 16 rows
//! and super-block: 148 per row against Q4_K's 144.
//!
//! # Same bits
//!
//! Every integer of ggml's gemv (`dot = Σ_j sc_j Σ q·a`, `min = Σ_j m_j bsum_j`) is exact in
//! any order, and the float steps per row are unchanged (`acc = fma(dot, d_w·d_a, acc)`,
//! `acc_min = fma(min, dmin_w·d_a, acc_min)`, `acc - acc_min`), so a packed product equals
//! [`gemv_q4_k`](super::gemv::gemv_q4_k) bit for bit (tests in `tests/matmul_packed.rs`).
//! Rows past the last multiple of 16 are zero (their outputs are never written).

use super::F16Le;
use super::blocks::{BlockQ4K, BlockQ8K};
use super::gemm::LANES;

/// Bytes of one Q4_K super-block row in the file (for the size check below).
const Q4K_BYTES: usize = 144;

/// 16 Q4_K rows × one super-block, rows in lanes (see the module docs).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct K4PackedBlock {
    /// `q[8c + t][4r..4r + 4]` = row `r`'s `qs[32c + 4t..32c + 4t + 4]`.
    pub q: [[u8; 64]; 32],
    /// `sc[j][r]`: sub-block `j`'s 6-bit scale of row `r`.
    pub sc: [[u8; LANES]; 8],
    /// `m[k][2r]`, `m[k][2r + 1]`: the mins of sub-blocks `2k` and `2k + 1` of row `r`.
    pub m: [[u8; 2 * LANES]; 4],
    /// The super-block scales of each row.
    pub d: [F16Le; LANES],
    pub dmin: [F16Le; LANES],
}

const _: () = assert!(std::mem::size_of::<K4PackedBlock>() == 2368);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == Q4K_BYTES);

impl K4PackedBlock {
    const ZERO: K4PackedBlock = K4PackedBlock {
        q: [[0; 64]; 32],
        sc: [[0; LANES]; 8],
        m: [[0; 2 * LANES]; 4],
        d: [F16Le([0, 0]); LANES],
        dmin: [F16Le([0, 0]); LANES],
    };

    /// Puts `b` in lane `r`.
    fn put(&mut self, r: usize, b: &BlockQ4K) {
        for (i, word) in b.qs.chunks_exact(4).enumerate() {
            self.q[i][4 * r..4 * r + 4].copy_from_slice(word);
        }
        let (sc, m) = b.scales_mins();
        for (lanes, s) in self.sc.iter_mut().zip(sc) {
            lanes[r] = s;
        }
        for (pairs, mk) in self.m.iter_mut().zip(m.chunks_exact(2)) {
            pairs[2 * r..2 * r + 2].copy_from_slice(mk);
        }
        self.d[r] = b.d;
        self.dmin[r] = b.dmin;
    }
}

/// A whole Q4_K matrix repacked: `groups` groups of [`LANES`] rows, `per_row` super-blocks
/// each, block `g * per_row + s` holding super-block `s` of rows `16g..16g + 16`.
#[derive(Debug, Clone)]
pub struct K4Packed {
    pub blocks: Vec<K4PackedBlock>,
    pub rows: usize,
    pub per_row: usize,
}

impl K4Packed {
    /// Repacks `blocks` (`[rows][per_row]`, the file's order). `None` when the lengths do not
    /// agree.
    pub fn new(blocks: &[BlockQ4K], rows: usize, per_row: usize) -> Option<K4Packed> {
        K4Packed::new_with(blocks, rows, per_row, &mut |_| {})
    }

    /// [`K4Packed::new`], calling `rows_done(n)` once the first `n` rows are copied (after
    /// every row), so that a caller can release the source as the copy grows.
    pub fn new_with(blocks: &[BlockQ4K], rows: usize, per_row: usize, rows_done: &mut dyn FnMut(usize)) -> Option<K4Packed> {
        if per_row == 0 || rows.checked_mul(per_row) != Some(blocks.len()) {
            return None;
        }
        let groups = rows.div_ceil(LANES);
        let mut packed = vec![K4PackedBlock::ZERO; groups * per_row];
        for (row, blocks_of_row) in blocks.chunks_exact(per_row).enumerate() {
            let (g, r) = (row / LANES, row % LANES);
            for (s, b) in blocks_of_row.iter().enumerate() {
                packed[g * per_row + s].put(r, b);
            }
            rows_done(row + 1);
        }
        Some(K4Packed { blocks: packed, rows, per_row })
    }

    /// Groups of [`LANES`] rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.blocks.as_slice())
    }

    /// The blocks of group `g` (`per_row` of them).
    pub fn group(&self, g: usize) -> &[K4PackedBlock] {
        self.blocks.get(g * self.per_row..(g + 1) * self.per_row).unwrap_or(&[])
    }
}

/// One token's Q8_K row as the packed gemv reads it: the blocks, and per super-block the
/// 32-value sums as i16 pairs, `bs[s][k] = bsum_{2k} | bsum_{2k+1} << 16` with
/// `bsum_j = bsums[2j] + bsums[2j + 1]` (at most 32·128 in magnitude: exact in i16).
#[derive(Debug, Clone)]
pub struct K8Row<'a> {
    pub y: &'a [BlockQ8K],
    pub bs: Vec<[u32; 4]>,
}

impl<'a> K8Row<'a> {
    pub fn new(y: &'a [BlockQ8K]) -> K8Row<'a> {
        let bs = y
            .iter()
            .map(|b| {
                let s = |j: usize| (b.bsums[2 * j].wrapping_add(b.bsums[2 * j + 1])) as u16;
                std::array::from_fn(|k| u32::from(s(2 * k)) | u32::from(s(2 * k + 1)) << 16)
            })
            .collect();
        K8Row { y, bs }
    }
}
