//! Q6_K matrices repacked at load for the single-token product (decode): 16 rows interleaved
//! per super-block, the 6-bit quants still split into ggml's low nibbles and 2-bit high parts,
//! so that one 512-bit register holds 4 values of each of 16 rows and the gemv streams the
//! weights once, in order, with no horizontal sums inside a block.
//!
//! # Why
//!
//! llama.cpp multiplies a Q6_K matrix by one token row by row through
//! `ggml_vec_dot_q6_K_q8_K` (it does not repack Q6_K). minfer's twin of that kernel unpacks the
//! quants and scales of every 210-byte block for one row and sums 8 lanes per block, and streams
//! about 31 % fewer bytes per second than the packed Q4_K gemv (docs/PERFORMANCE.md). With rows
//! in lanes each of ggml's 8 lanes *is* one register of 16 rows.
//!
//! # Layout ([`K6PackedBlock`], one per 16 rows and super-block)
//!
//! Q6_K keeps the low 4 bits of value `128h + l` (`l < 32`) in `ql[64h + l]`'s low nibble, of
//! `128h + 32 + l` in `ql[64h + 32 + l]`'s low nibble, of `128h + 64 + l` and `128h + 96 + l` in
//! the high nibbles of those two bytes, and the top 2 bits of the four in `qh[32h + l]`, bits
//! `0-1, 2-3, 4-5, 6-7`. Here, for each row `r` at bytes `4r..4r + 4` of a register:
//!
//! * `ql[16h + k]` holds that row's `ql[64h + 4k..+4]` and `ql[16h + 8 + k]` its
//!   `ql[64h + 32 + 4k..+4]` (`k < 8`);
//! * `qh[8h + k]` holds its `qh[32h + 4k..+4]`;
//!
//! so the registers `(h, k)` give values `32j + 4k..+4` of chunks `j = 4h..4h + 4`: exactly
//! ggml's lane `k` of each 32-value chunk. `sp[k][2r], sp[k][2r + 1]` are the row's scales
//! `sc_{2k}, sc_{2k+1}` (as bytes: `vpmovsxbw` makes the `(sc_{2k}, sc_{2k+1})` i16 pairs of
//! `vpdpwssd`), `d` the row's super-block scale as f32 (f16 widens exactly). 3392 bytes per 16
//! rows and super-block: 212 per row against Q6_K's 210.
//!
//! # Same bits
//!
//! ggml's lane `k` of a block is the exact integer
//! `Σ_j sc_{2j + [k ≥ 4]} (q · a)_{j,k} - 32 (sc_{2k} bsum_{2k} + sc_{2k+1} bsum_{2k+1})` (`q`
//! unsigned 0..63, `(q · a)_{j,k}` the 4 values `32j + 4k..+4`); the float steps per row are
//! `acc_k = fma(d_a·d_w, f32(lane_k), acc_k)` per block and `hsum_float_8` at the end. The packed
//! kernel computes the same integers (in another order: integer sums are exact) and the same
//! float steps, so its product equals [`q6k_cell_scalar`](super::gemm_k::q6k_cell_scalar) and
//! the x86 `vec_dot` bit for bit (tests in `tests/matmul_packed_k6.rs`). Rows past the last
//! multiple of 16 are zero (their outputs are never written).

use super::blocks::BlockQ6K;
use super::gemm::LANES;

/// Bytes of one Q6_K super-block row in the file (for the size check below).
const Q6K_BYTES: usize = 210;

/// 16 Q6_K rows × one super-block, rows in lanes (see the module docs).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct K6PackedBlock {
    /// `ql[16h + 8·half + k][4r..4r + 4]` = row `r`'s `ql[64h + 32·half + 4k..+4]`.
    pub ql: [[u8; 64]; 32],
    /// `qh[8h + k][4r..4r + 4]` = row `r`'s `qh[32h + 4k..+4]`.
    pub qh: [[u8; 64]; 16],
    /// `sp[k][2r]`, `sp[k][2r + 1]`: row `r`'s scales `sc_{2k}`, `sc_{2k+1}`.
    pub sp: [[i8; 2 * LANES]; 8],
    /// The super-block scale of each row, as f32.
    pub d: [f32; LANES],
}

const _: () = assert!(std::mem::size_of::<K6PackedBlock>() == 3392);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == Q6K_BYTES);

impl K6PackedBlock {
    const ZERO: K6PackedBlock = K6PackedBlock { ql: [[0; 64]; 32], qh: [[0; 64]; 16], sp: [[0; 2 * LANES]; 8], d: [0.0; LANES] };

    /// Puts `b` in lane `r`.
    fn put(&mut self, r: usize, b: &BlockQ6K) {
        for h in 0..2 {
            for k in 0..8 {
                for half in 0..2 {
                    let from = 64 * h + 32 * half + 4 * k;
                    self.ql[16 * h + 8 * half + k][4 * r..4 * r + 4].copy_from_slice(&b.ql[from..from + 4]);
                }
                let from = 32 * h + 4 * k;
                self.qh[8 * h + k][4 * r..4 * r + 4].copy_from_slice(&b.qh[from..from + 4]);
            }
        }
        for (k, pairs) in self.sp.iter_mut().enumerate() {
            pairs[2 * r..2 * r + 2].copy_from_slice(&b.scales[2 * k..2 * k + 2]);
        }
        self.d[r] = b.d.to_f32();
    }
}

/// A whole Q6_K matrix repacked: `groups` groups of [`LANES`] rows, `per_row` super-blocks
/// each, block `g * per_row + s` holding super-block `s` of rows `16g..16g + 16`.
#[derive(Debug, Clone)]
pub struct K6Packed {
    pub blocks: Vec<K6PackedBlock>,
    pub rows: usize,
    pub per_row: usize,
}

impl K6Packed {
    /// Repacks `blocks` (`[rows][per_row]`, the file's order). `None` when the lengths do not
    /// agree.
    pub fn new(blocks: &[BlockQ6K], rows: usize, per_row: usize) -> Option<K6Packed> {
        K6Packed::new_with(blocks, rows, per_row, &mut |_| {})
    }

    /// [`K6Packed::new`], calling `rows_done(n)` once the first `n` rows are copied (after
    /// every row), so that a caller can release the source as the copy grows.
    pub fn new_with(blocks: &[BlockQ6K], rows: usize, per_row: usize, rows_done: &mut dyn FnMut(usize)) -> Option<K6Packed> {
        if per_row == 0 || rows.checked_mul(per_row) != Some(blocks.len()) {
            return None;
        }
        let groups = rows.div_ceil(LANES);
        let mut packed = vec![K6PackedBlock::ZERO; groups * per_row];
        for (row, blocks_of_row) in blocks.chunks_exact(per_row).enumerate() {
            let (g, r) = (row / LANES, row % LANES);
            for (s, b) in blocks_of_row.iter().enumerate() {
                packed[g * per_row + s].put(r, b);
            }
            rows_done(row + 1);
        }
        Some(K6Packed { blocks: packed, rows, per_row })
    }

    /// Groups of [`LANES`] rows.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Whether the blocks are the `groups · per_row` its shape says (the fields are public: a
    /// copy built by hand is checked before a kernel reads it).
    pub fn consistent(&self) -> bool {
        self.per_row > 0 && self.groups().checked_mul(self.per_row) == Some(self.blocks.len())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.blocks.as_slice())
    }

    /// The blocks of groups `first..first + n` (`n · per_row` of them; empty past the end).
    pub fn groups_from(&self, first: usize, n: usize) -> &[K6PackedBlock] {
        let end = first.checked_add(n).and_then(|e| e.checked_mul(self.per_row));
        end.and_then(|end| self.blocks.get(first * self.per_row..end)).unwrap_or(&[])
    }
}
