//! Quantized matrix × activations, as llama.cpp's CPU backend computes `ggml_mul_mat` for one
//! token (`ggml_compute_forward_mul_mat`, without the llamafile sgemm).
//!
//! Each token's activation row is quantized once to the weight's `vec_dot_type` with the x86
//! quantizers ([`ActRow::for_weight`]); every output element is then one dot of (weight row,
//! activation row) by the kernel of the chosen ISA ([`Kernels::dot`]), plus the bias in f32
//! (llama.cpp adds biases as a separate `ggml_add`: `out = dot + bias`, one rounding).
//!
//! Except for the matrices llama.cpp's x86 CPU backend repacks (Q4_0 and Q4_K with a multiple
//! of 8 rows, [`SimdDot::REPACK_ROWS`]): those it multiplies with its repacked gemv, whose
//! per-row arithmetic [`Kernels::gemv`] reproduces (see [`crate::quants::gemv`]).
//!
//! # Invariance
//!
//! Work is split by output rows (ownership split, see [`Pool`]): a worker owns a tile of
//! [`ROW_TILE`] weight rows (the pair kernels of up to [`PAIR_TOKENS`] tokens: a larger
//! item, see `pair_tile_rows`) and computes all their outputs, for every token, reusing each
//! weight row from cache across the tokens. Every output element is computed by the same dot
//! routine on the same two rows whatever the thread count, the tiling or the number of tokens,
//! so results are bit-identical for any thread count, and prefill (many tokens) equals decode
//! (one token at a time) bit for bit. llama.cpp itself does not have the second property: with
//! two or more tokens it switches to the llamafile sgemm, which sums in another order.

use crate::quants::gemm::{B32Panel, B32Tile, Block32Gemm, RowLaneTile, split_q8_1};
use crate::quants::gemm_k::{K4Tile, K6Tile, K8Panel, LANES};
use crate::quants::gemm_pairs::{B32Pairs, K8Pairs, PAIR_TOKENS};
use crate::quants::packed::PackedMatrix;
use crate::quants::packed_b32::B32Packed;
use crate::quants::packed_k4::K8Row;
use crate::quants::packed_k6::K6Packed;
use crate::quants::simd::{Isa, Kernels, SimdDot, SimdError};
use crate::quants::{
    ActBlock, ActRow, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8_0, BlockQ8_1, GgmlType, QuantError, VecDot,
    WeightBlock, blocks_of, vec_dot_type,
};

use super::Pool;

/// Weight rows per parallel work item.
pub const ROW_TILE: usize = 16;

/// A weight matrix as a GGUF tensor of shape `[cols, rows]` (ggml's `ne = [in, out]`) stores
/// it: `rows` rows of `cols` values each, row-major, each row a whole number of `ty` blocks.
#[derive(Debug, Clone, Copy)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    /// `[rows][cols / block_size]` blocks of `ty`, any alignment.
    pub data: &'a [u8],
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The matrix repacked for the one-token product ([`PackedMatrix`]), where the backend
    /// made a copy; the products of several tokens read `data`.
    pub packed: Option<&'a PackedMatrix>,
}

impl WeightMatrix<'_> {
    /// Bytes of one row (`cols` must be a multiple of the block size for this to be exact).
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }
}

/// Why a matrix product was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MatmulError {
    /// A weight type minfer has no dot product for (the activation-only Q8_1 and Q8_K).
    #[error("{ty} is not a weight type minfer can multiply with")]
    UnsupportedType { ty: GgmlType },
    /// A matrix with rows of no values.
    #[error("weight matrix has 0 columns")]
    NoColumns,
    /// Rows that are not a whole number of blocks.
    #[error("rows of {cols} values are not a multiple of the {ty} block size {block}")]
    RaggedRow {
        ty: GgmlType,
        cols: usize,
        block: usize,
    },
    /// Weight data of the wrong size.
    #[error("{ty} weight matrix {rows}x{cols} needs {expected} bytes, got {got}")]
    WeightBytes {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    /// A matrix whose byte size overflows `usize`.
    #[error("weight matrix {rows}x{cols} of {ty} is too large to address")]
    TooLarge {
        ty: GgmlType,
        rows: usize,
        cols: usize,
    },
    /// Input that is not a whole number of rows of `cols` values.
    #[error("input of {got} values is not a whole number of rows of {cols}")]
    InputLength { cols: usize, got: usize },
    /// Output of the wrong size for `tokens` rows of `rows` values.
    #[error("output of {got} values, expected {expected} ({tokens} tokens x {rows} rows)")]
    OutputLength {
        rows: usize,
        tokens: usize,
        expected: usize,
        got: usize,
    },
    /// A bias that is not one value per output row.
    #[error("bias of {got} values for {rows} output rows")]
    BiasLength { rows: usize, got: usize },
    /// The ISA asked for cannot run here.
    #[error(transparent)]
    Simd(#[from] SimdError),
    /// A failure of the quant layer (not expected once the shapes are checked).
    #[error(transparent)]
    Quant(#[from] QuantError),
}

/// `out[t][r] = dot(w[r], x[t]) + bias[r]` with the active ISA's kernels ([`Kernels::active`]).
///
/// * `x`: `[nt][cols]` token-major activations (`nt = x.len() / cols`, may be 0);
/// * `bias`: `[rows]`, added after the dot;
/// * `out`: `[nt][rows]` token-major.
///
/// Errors: a [`MatmulError`] for every length or type mismatch; nothing panics on bad input.
pub fn matmul(
    pool: &Pool,
    w: &WeightMatrix,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), MatmulError> {
    matmul_with(pool, Kernels::active(), w, x, bias, out)
}

/// [`matmul`] with the kernels of an explicit ISA (`Isa::Scalar` runs the reference dots).
/// Errors with [`MatmulError::Simd`] if this CPU cannot run `isa`.
pub fn matmul_with_isa(
    pool: &Pool,
    w: &WeightMatrix,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    isa: Isa,
) -> Result<(), MatmulError> {
    matmul_with(pool, Kernels::for_isa(isa)?, w, x, bias, out)
}

/// Checks every length; returns the number of tokens.
fn check_shapes(
    w: &WeightMatrix,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &[f32],
) -> Result<usize, MatmulError> {
    let (ty, rows, cols) = (w.ty, w.rows, w.cols);
    if !ty.is_weight_type() {
        return Err(MatmulError::UnsupportedType { ty });
    }
    if cols == 0 {
        return Err(MatmulError::NoColumns);
    }
    let block = ty.block_size();
    if !cols.is_multiple_of(block) {
        return Err(MatmulError::RaggedRow { ty, cols, block });
    }
    let expected = rows
        .checked_mul(w.row_bytes())
        .ok_or(MatmulError::TooLarge { ty, rows, cols })?;
    if w.data.len() != expected {
        return Err(MatmulError::WeightBytes {
            ty,
            rows,
            cols,
            expected,
            got: w.data.len(),
        });
    }
    if !x.len().is_multiple_of(cols) {
        return Err(MatmulError::InputLength { cols, got: x.len() });
    }
    let tokens = x.len() / cols;
    // tokens * rows <= x.len() * rows / cols; compute it checked all the same.
    let expected = tokens
        .checked_mul(rows)
        .ok_or(MatmulError::TooLarge { ty, rows, cols })?;
    if out.len() != expected {
        return Err(MatmulError::OutputLength {
            rows,
            tokens,
            expected,
            got: out.len(),
        });
    }
    if let Some(b) = bias
        && b.len() != rows
    {
        return Err(MatmulError::BiasLength { rows, got: b.len() });
    }
    Ok(tokens)
}

/// Fewest tokens a row-lane tile product is used for. Filling a tile unpacks its weight rows
/// once per call, which only pays off over several tokens: below this each weight row meets
/// the tokens through [`Kernels::dot_rows`] (the same bits either way). Measured on the 0.5B
/// with 2 threads (`minfer bench --batch`): decode steps of 2 and 4 tokens took 4.9x and 2.5x
/// longer through tiles than through single dots; at 8 tokens the tiles beat `dot_rows` by
/// about 1.1x (a threshold of 16 measured 44 t/s at B = 8 against 48–50). Where the ISA has
/// pair kernels, the types that have one take them first below [`PAIRS_BELOW_TOKENS`].
pub const TILE_MIN_TOKENS: usize = 8;

/// [`TILE_MIN_TOKENS`] where the ISA is AVX2 (no AVX-512): its tiles hold 8 rows per register
/// and lost to `dot_rows` at 8 tokens. Measured with `cargo bench --bench matmul` (2 threads,
/// AMD EPYC Zen 3, 0.5B's ffn_down): Q6_K at 4 / 8 / 16 tokens 0.73 / 1.82 / 2.79 ms through
/// tiles from 8 on, against about 1.46 ms at 8 and 2.9 ms at 16 through `dot_rows` (four
/// tokens per call); Q4_K 0.59 / 1.40 / 2.09 ms against 1.19 and 2.4.
pub const TILE_MIN_TOKENS_AVX2: usize = 16;

/// The fewest tokens the row-lane tiles are used for with `kernels`.
pub fn tile_min_tokens(kernels: Kernels) -> usize {
    if kernels.isa() == Isa::Avx2 { TILE_MIN_TOKENS_AVX2 } else { TILE_MIN_TOKENS }
}

/// Token counts from 2 up to (not including) this go through the pair kernels
/// ([`Kernels::b32_pairs`] for Q5_0 and Q8_0, [`Kernels::k4_gemv_pairs`] for repacked Q4_K,
/// [`Kernels::k6_pairs`] for Q6_K) where the ISA has them: each weight block is
/// unpacked into a register once for up to [`PAIR_TOKENS`] tokens (two per register on
/// AVX-512, one on AVX2), with nothing written to memory per call. The same bits as every
/// other path. AVX2 (Zen 3, same shapes): Q5_0 / Q8_0 at 16 tokens 2.0 / 2.0 ms through pairs
/// against 3.6 / 2.4 through tiles, at 32 3.9 / 5.1 against 4.6 / 3.9. Measured with
/// `cargo bench --bench matmul` (2 threads, AMD EPYC Zen 4, ffn_gate Q5_0 / ffn_up Q8_0 of the
/// 0.5B): at 16 tokens 1.0 / 1.1 ms through pairs against 1.9 / 1.4 ms through tiles, at 32
/// 2.3 / 2.1 against 3.0 / 2.2, at 128 9.0 / 8.3 against 6.1 / 5.8; Q6_K's ffn_down at 8 / 16 /
/// 32 tokens 0.46 / 1.17 / 2.00 ms against 0.79 / 1.19 / 1.86. Q4_K keeps its tiles from
/// [`TILE_MIN_TOKENS`].
pub const PAIRS_BELOW_TOKENS: usize = 33;

fn matmul_with(
    pool: &Pool,
    kernels: Kernels,
    w: &WeightMatrix,
    x: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), MatmulError> {
    let tokens = check_shapes(w, x, bias, out)?;
    if tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    let acts = quantize_tokens(pool, kernels, w.ty, x, w.cols)?; // [tokens]
    if let (1, Some(packed)) = (tokens, w.packed)
        && multiply_packed(pool, kernels, w, packed, &acts[0], bias, out)?
    {
        return Ok(());
    }
    if (2..PAIRS_BELOW_TOKENS).contains(&tokens) && kernels.has_pairs() {
        let paired = match w.ty {
            GgmlType::Q5_0 => multiply_b32_pairs::<BlockQ5_0>(pool, kernels, w, &acts, bias, out)?,
            GgmlType::Q8_0 => multiply_b32_pairs::<BlockQ8_0>(pool, kernels, w, &acts, bias, out)?,
            // Q4_K's pair kernel follows the repacked gemv order only (see `multiply`), and
            // its tiles are faster from 8 tokens (ffn_down 896 x 4864, 2 threads: 523 / 817 /
            // 1190 µs at 8 / 16 / 32 tokens against 574 / 924 / 1954 through pairs).
            GgmlType::Q4K
                if tokens < tile_min_tokens(kernels) && BlockQ4K::REPACK_ROWS.is_some_and(|n| w.rows.is_multiple_of(n)) =>
            {
                multiply_pairs(pool, w, &acts, bias, out, K8Pairs::new, |b, n, g, o| kernels.k4_gemv_pairs(b, n, g, o))?
            }
            GgmlType::Q6K => multiply_pairs(pool, w, &acts, bias, out, K8Pairs::new, |b, n, g, o| kernels.k6_pairs(b, n, g, o))?,
            _ => false,
        };
        if paired {
            return Ok(());
        }
    }
    let tiled = tokens >= tile_min_tokens(kernels)
        && kernels.has_tiles()
        && w.rows.is_multiple_of(LANES)
        && match w.ty {
            GgmlType::Q5_0 => gemm_b32::<BlockQ5_0>(pool, kernels, w, &acts, bias, out)?,
            GgmlType::Q8_0 => gemm_b32::<BlockQ8_0>(pool, kernels, w, &acts, bias, out)?,
            GgmlType::Q4_1 => gemm_b32::<BlockQ4_1>(pool, kernels, w, &acts, bias, out)?,
            // Q4_0 of 16k rows is repacked by llama.cpp (its gemv order): element by element.
            GgmlType::Q4K => {
                let lanes = RowLanes { panel: K8Panel::new, fill: |t: &mut K4Tile, b: &[BlockQ4K], n, _| kernels.k4_fill(t, b, n) };
                gemm_row_lanes(pool, w, &acts, bias, out, lanes, |t, p, o| kernels.k4_tile(t, p, o))?
            }
            GgmlType::Q6K => {
                let lanes = RowLanes { panel: K8Panel::new, fill: k6_fill(kernels, w) };
                gemm_row_lanes(pool, w, &acts, bias, out, lanes, |t, p, o| kernels.k6_tile(t, p, o))?
            }
            _ => false,
        };
    if !tiled {
        crate::with_weight_block!(w.ty, B => multiply::<B>(pool, kernels, w, &acts, bias, out))?;
    }
    Ok(())
}

/// Up to this many activation values are quantized on the calling thread: a batched decode
/// step's few rows (4 tokens of 896 take about a microsecond) cost less than handing them to
/// the pool, which [`quantize_tokens`] would do before every matrix of the step.
const SERIAL_QUANT_VALUES: usize = 1 << 15;

/// Each token's row of `x` (`[tokens][cols]`) as `ty`'s activation type: on the calling thread
/// up to [`SERIAL_QUANT_VALUES`] values, in parallel over tokens past that (each row by one
/// worker with the same code either way, so the result depends on neither the thread count nor
/// the path).
fn quantize_tokens(
    pool: &Pool,
    kernels: Kernels,
    ty: GgmlType,
    x: &[f32],
    cols: usize,
) -> Result<Vec<ActRow>, QuantError> {
    let tokens = x.len() / cols;
    if x.len() <= SERIAL_QUANT_VALUES {
        return x.chunks_exact(cols).map(|row| kernels.act_row(ty, row)).collect();
    }
    let mut slots: Vec<Option<Result<ActRow, QuantError>>> = (0..tokens).map(|_| None).collect();
    pool.for_each_item_mut(&mut slots, 1, |t, slot| {
        slot[0] = Some(kernels.act_row(ty, &x[t * cols..(t + 1) * cols]));
    });
    slots
        .into_iter()
        .map(|s| s.unwrap_or(Err(QuantError::NotActType { ty })))
        .collect()
}

/// `out[t]` split into `[row tile][token]` pieces of `tile_rows` rows: disjoint, so a worker
/// owns every output of its rows.
fn row_tiles(out: &mut [f32], rows: usize, tokens: usize, tile_rows: usize) -> Vec<Vec<&mut [f32]>> {
    let mut tiles: Vec<Vec<&mut [f32]>> = (0..rows.div_ceil(tile_rows))
        .map(|_| Vec::with_capacity(tokens))
        .collect();
    for token_out in out.chunks_mut(rows) {
        for (tile, piece) in tiles.iter_mut().zip(token_out.chunks_mut(tile_rows)) {
            tile.push(piece);
        }
    }
    tiles
}

/// Adds `bias[first + j]` to element `j` of every token's piece.
fn add_bias(pieces: &mut [&mut [f32]], bias: Option<&[f32]>, first: usize) {
    if let Some(b) = bias {
        for piece in pieces.iter_mut() {
            for (o, b) in piece.iter_mut().zip(&b[first..]) {
                *o += b;
            }
        }
    }
}

/// Rows per work item of the row-lane tiles: two registers of rows.
const ROW_LANE_TILE: usize = 2 * LANES;

/// How a row-lane product prepares its operands: `panel` makes the kernel's panel of the tokens'
/// `A` rows, `fill` unpacks a work item's rows into a tile `T` (`fill(tile, blocks, per_row,
/// first)`: `blocks` are the rows from row `first` on).
struct RowLanes<P, F> {
    panel: P,
    fill: F,
}

/// The many-token product of a matrix of `B` blocks (rows a multiple of 16) by a row-lane
/// kernel: the tokens' `A` rows become the kernel's `panel`, each worker `fill`s 32 rows into
/// a `T` once and `run`s it against every token ([`Kernels::b32_tile`], [`Kernels::k4_tile`],
/// [`Kernels::k6_tile`]). Same bits per element as [`multiply`]. `Ok(false)`: not run (an ISA
/// without the kernel, or activations of another type).
fn gemm_row_lanes<'a, B, A, T, P>(
    pool: &Pool,
    w: &WeightMatrix,
    acts: &'a [ActRow],
    bias: Option<&[f32]>,
    out: &mut [f32],
    lanes: RowLanes<impl FnOnce(Vec<&'a [A]>) -> P, impl Fn(&mut T, &[B], usize, usize) + Sync>,
    run: impl Fn(&T, &P, &mut [&mut [f32]]) -> bool + Sync,
) -> Result<bool, QuantError>
where
    B: WeightBlock + Sync,
    A: ActBlock + 'a,
    T: Default,
    P: Sync,
{
    let per_row = w.cols / B::N;
    let blocks: &[B] = blocks_of::<B>(w.data, w.rows * w.cols)?; // [rows][per_row]
    let rows: Option<Vec<&[A]>> = acts
        .iter()
        .map(|a| A::blocks_in(a).filter(|b| b.len() == per_row))
        .collect();
    let Some(rows) = rows else { return Ok(false) };
    let panel = (lanes.panel)(rows);
    Ok(run_row_tiles(pool, out, w.rows, acts.len(), ROW_LANE_TILE, bias, T::default, |unpacked, first, pieces| {
        let n_rows = pieces.first().map_or(0, |p| p.len());
        (lanes.fill)(unpacked, &blocks[first * per_row..(first + n_rows) * per_row], per_row, first);
        run(unpacked, &panel, pieces)
    }))
}

/// `out` (`[tokens][rows]`) in tiles of `tile_rows` rows, in parallel: `work(scratch, first,
/// pieces)` computes the tile starting at row `first` (`pieces[t]`: token `t`'s outputs for
/// those rows), then the bias is added. `scratch` comes from `init`, one per run of tiles a
/// worker takes. `false` if any `work` returned `false` (it wrote nothing then, or the caller
/// recomputes every element).
#[allow(clippy::too_many_arguments)] // the tile geometry, then what runs on it
fn run_row_tiles<S>(
    pool: &Pool,
    out: &mut [f32],
    rows: usize,
    tokens: usize,
    tile_rows: usize,
    bias: Option<&[f32]>,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize, &mut [&mut [f32]]) -> bool + Sync,
) -> bool {
    let mut tiles = row_tiles(out, rows, tokens, tile_rows);
    let ok = std::sync::atomic::AtomicBool::new(true);
    pool.for_each_item_mut_with(&mut tiles, 1, init, |scratch, i, tile| {
        let pieces = &mut tile[0];
        let first = i * tile_rows;
        if !work(scratch, first, pieces) {
            ok.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        add_bias(pieces, bias, first);
    });
    ok.into_inner()
}

/// A row-lane tile fill that reads the decode's packed copy where there is one
/// (`from_copy(tile, copy, first group, groups)`: no unpacking of the file's blocks per call)
/// and the file's blocks otherwise (`from_blocks`). The same tile either way.
fn fill_from_copy<'w, T, B, P: Sync>(
    copy: Option<&'w P>,
    from_copy: impl Fn(&mut T, &P, usize, usize) -> bool + Sync + 'w,
    from_blocks: impl Fn(&mut T, &[B], usize) + Sync + 'w,
) -> impl Fn(&mut T, &[B], usize, usize) + Sync + 'w {
    move |t: &mut T, b: &[B], n: usize, first: usize| {
        let groups = b.len() / n.max(1) / LANES;
        let copied = first.is_multiple_of(LANES) && copy.is_some_and(|p| from_copy(t, p, first / LANES, groups));
        if !copied {
            from_blocks(t, b, n);
        }
    }
}

/// The tile fill of a 32-value-block matrix ([`Kernels::b32_fill_packed`] from the copy, else
/// the scalar fill).
fn b32_fill<'w, W: Block32Gemm>(kernels: Kernels, w: &WeightMatrix<'w>) -> impl Fn(&mut B32Tile, &[W], usize, usize) + Sync + 'w {
    fill_from_copy(b32_copy(w), move |t, p, g, n| kernels.b32_fill_packed(t, p, g, n), |t: &mut B32Tile, b: &[W], n| t.fill(b, n))
}

/// The tile fill of a Q6_K matrix ([`Kernels::k6_fill_packed`] from the copy, else
/// [`Kernels::k6_fill`] from the file's blocks).
fn k6_fill<'w>(kernels: Kernels, w: &WeightMatrix<'w>) -> impl Fn(&mut K6Tile, &[BlockQ6K], usize, usize) + Sync + 'w {
    fill_from_copy(k6_copy(w), move |t, p, g, n| kernels.k6_fill_packed(t, p, g, n), move |t, b, n| kernels.k6_fill(t, b, n))
}

/// Whether a packed copy of `rows` rows and `per_row` blocks each is `w`'s shape.
fn copy_shape(w: &WeightMatrix, rows: usize, per_row: usize) -> bool {
    rows == w.rows && per_row * w.ty.block_size() == w.cols
}

/// `w`'s packed Q5_0/Q8_0/Q4_1 copy, where it has one that matches it.
fn b32_copy<'w>(w: &WeightMatrix<'w>) -> Option<&'w B32Packed> {
    match w.packed {
        Some(PackedMatrix::B32(p)) if p.ty == w.ty && copy_shape(w, p.rows, p.per_row) => Some(p),
        _ => None,
    }
}

/// `w`'s packed Q6_K copy, where it has one that matches it.
fn k6_copy<'w>(w: &WeightMatrix<'w>) -> Option<&'w K6Packed> {
    match w.packed {
        Some(PackedMatrix::K6(p)) if w.ty == GgmlType::Q6K && copy_shape(w, p.rows, p.per_row) => Some(p),
        _ => None,
    }
}

/// The many-token product of a Q5_0, Q8_0 or Q4_1 matrix through [`Kernels::b32_tile`]. Q4_1's
/// Q8_1 tokens become a panel of their Q8_0 quants and scales plus their sums, only where the
/// tiles take mins (AVX-512, [`Kernels::has_packed`]; elsewhere `Ok(false)`).
fn gemm_b32<W: Block32Gemm + WeightBlock + Sync>(
    pool: &Pool,
    kernels: Kernels,
    w: &WeightMatrix,
    acts: &[ActRow],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<bool, QuantError> {
    let fill = b32_fill::<W>(kernels, w);
    let run = |t: &B32Tile, p: &B32Panel, o: &mut [&mut [f32]]| kernels.b32_tile(t, p, o);
    if !W::HAS_MIN {
        let lanes = RowLanes { panel: |rows| B32Panel::new(rows, W::OFFSET), fill };
        return gemm_row_lanes::<W, BlockQ8_0, B32Tile, _>(pool, w, acts, bias, out, lanes, run);
    }
    if !kernels.has_packed() {
        return Ok(false);
    }
    let split: Option<Vec<_>> = acts.iter().map(|a| BlockQ8_1::blocks_in(a).map(split_q8_1)).collect();
    let Some(split) = split else { return Ok(false) };
    let (y, sa): (Vec<Vec<BlockQ8_0>>, Vec<Vec<f32>>) = split.into_iter().unzip(); // [tokens][per_row]
    let panel = |_: Vec<&[BlockQ8_1]>| B32Panel::with_sums(y.iter().map(Vec::as_slice).collect(), sa);
    gemm_row_lanes::<W, BlockQ8_1, B32Tile, _>(pool, w, acts, bias, out, RowLanes { panel, fill }, run)
}

/// The few-token product through a pair kernel ([`Kernels::b32_pairs`],
/// [`Kernels::k4_gemv_pairs`], [`Kernels::k6_pairs`]): the tokens' `A` rows in groups of up to
/// [`PAIR_TOKENS`] laid out once (`layout`: [`B32Pairs`], [`K8Pairs`]), each worker running
/// its item's rows of `W` ([`pair_tile_rows`]) against every group (`run(blocks, n_rows,
/// group, outs)`). Same bits per element as [`multiply`]. `Ok(false)`: not run (no pair
/// kernel for this ISA or type, or activations of another type).
fn multiply_pairs<W, A, G>(
    pool: &Pool,
    w: &WeightMatrix,
    acts: &[ActRow],
    bias: Option<&[f32]>,
    out: &mut [f32],
    layout: impl Fn(&[&[A]]) -> Option<G>,
    run: impl Fn(&[W], usize, &G, &mut [&mut [f32]]) -> bool + Sync,
) -> Result<bool, QuantError>
where
    W: WeightBlock + Sync,
    A: ActBlock,
    G: Sync,
{
    let per_row = w.cols / W::N;
    let blocks: &[W] = blocks_of::<W>(w.data, w.rows * w.cols)?; // [rows][per_row]
    let rows: Option<Vec<&[A]>> = acts.iter().map(A::blocks_in).collect();
    let Some(rows) = rows else { return Ok(false) }; // [tokens][per_row]
    let groups: Option<Vec<G>> = rows.chunks(PAIR_TOKENS).map(&layout).collect();
    let Some(groups) = groups else { return Ok(false) };
    let tile_rows = pair_tile_rows(w.rows, pool.n_threads(), groups.len());
    Ok(run_row_tiles(pool, out, w.rows, acts.len(), tile_rows, bias, || (), |_, first, pieces| {
        let n_rows = pieces.first().map_or(0, |p| p.len());
        let tile_blocks = &blocks[first * per_row..(first + n_rows) * per_row];
        groups
            .iter()
            .zip(pieces.chunks_mut(PAIR_TOKENS))
            .all(|(g, outs)| run(tile_blocks, n_rows, g, outs))
    }))
}

/// Rows per work item of [`multiply_pairs`] for `groups` groups of tokens. One group (up to
/// [`PAIR_TOKENS`] tokens, a batched decode step): about 16 items per thread, in whole
/// [`ROW_TILE`]s. An item costs the pool a hand-off and the kernel an entry (its checks, its
/// registers set up) and its output pieces; at 16 rows the 151936-row output matrix of a
/// 0.5B model was 9496 items a step. Several groups: [`ROW_TILE`] rows, whose weights stay in
/// L1 from one group to the next (a large item would read them from memory once per group).
/// Each row is computed whole by the same kernel whatever item it falls in, so the bits do
/// not depend on this.
fn pair_tile_rows(rows: usize, threads: usize, groups: usize) -> usize {
    if groups > 1 {
        return ROW_TILE;
    }
    (rows / (16 * threads.max(1)) / ROW_TILE * ROW_TILE).max(ROW_TILE)
}

/// [`multiply_pairs`] for a 32-value-block type (Q5_0, Q8_0).
fn multiply_b32_pairs<W: Block32Gemm + WeightBlock + Sync>(
    pool: &Pool,
    kernels: Kernels,
    w: &WeightMatrix,
    acts: &[ActRow],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<bool, QuantError> {
    let layout = |g: &[&[BlockQ8_0]]| B32Pairs::new(g, W::OFFSET);
    multiply_pairs(pool, w, acts, bias, out, layout, |b: &[W], n, g, o| kernels.b32_pairs(b, n, g, o))
}

/// One token's product with a repacked copy, each worker a group of 16 rows at a time:
/// Q4_K through [`Kernels::k4_packed_gemv`] (the bits of [`Kernels::gemv`] per row), Q6_K
/// through [`Kernels::k6_packed_gemv`] (the bits of [`Kernels::dot`]), Q5_0,
/// Q8_0 and Q4_1 through [`Kernels::b32_packed_gemv`] (the bits of [`Kernels::dot`]). `false`, writing
/// nothing, where the ISA has no packed kernels or the copy does not match the matrix.
fn multiply_packed(
    pool: &Pool,
    kernels: Kernels,
    w: &WeightMatrix,
    packed: &PackedMatrix,
    act: &ActRow,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<bool, QuantError> {
    if !kernels.has_packed() {
        return Ok(false);
    }
    // Q4_K only where llama.cpp multiplies in its gemv order (the packed kernel's order).
    let gemv_order = BlockQ4K::REPACK_ROWS.is_some_and(|n| w.rows.is_multiple_of(n));
    let ran = match (packed, act) {
        (PackedMatrix::K4(p), ActRow::Q8K(y)) if gemv_order && w.ty == GgmlType::Q4K && copy_shape(w, p.rows, p.per_row) => {
            let row = K8Row::new(y);
            each_group(pool, out, |g, piece| kernels.k4_packed_gemv(p, g, &row, piece))
        }
        (PackedMatrix::K6(_), ActRow::Q8K(y)) if let Some(p) = k6_copy(w) => {
            each_group(pool, out, |g, piece| kernels.k6_packed_gemv(p, g, y, piece))
        }
        (PackedMatrix::B32(_), ActRow::Q8_0(y)) if let Some(p) = b32_copy(w) => {
            let panel = B32Panel::new(vec![y.as_slice()], p.offset());
            each_group(pool, out, |g, piece| kernels.b32_packed_gemv(p, g, &panel, piece))
        }
        (PackedMatrix::B32(_), ActRow::Q8_1(y)) if let Some(p) = b32_copy(w) => {
            // Q4_1: the Q8_1 blocks' quants and scales as Q8_0's, and their sums beside.
            let (y, sa) = split_q8_1(y);
            let panel = B32Panel::with_sums(vec![y.as_slice()], vec![sa]);
            each_group(pool, out, |g, piece| kernels.b32_packed_gemv(p, g, &panel, piece))
        }
        _ => return Ok(false),
    };
    if !ran {
        return Err(QuantError::ActMismatch { weight: w.ty, expected: vec_dot_type(w.ty)?, got: act.act_type() });
    }
    add_bias(&mut [out], bias, 0);
    Ok(true)
}

/// Runs `gemv(g, piece)` on the pool for every 16-row group `g` of `out` (`piece` its rows);
/// whether every call took its piece.
fn each_group(pool: &Pool, out: &mut [f32], gemv: impl Fn(usize, &mut [f32]) -> bool + Sync) -> bool {
    let done = std::sync::atomic::AtomicBool::new(true);
    pool.for_each_item_mut(out, LANES, |g, piece| {
        if !gemv(g, piece) {
            done.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    });
    done.into_inner()
}

/// The product for weight blocks `W`, shapes already checked: `acts` is `[tokens]`, `out`
/// `[tokens][rows]`.
fn multiply<W>(
    pool: &Pool,
    kernels: Kernels,
    w: &WeightMatrix,
    acts: &[ActRow],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), QuantError>
where
    W: SimdDot + Sync,
    <W as VecDot>::Act: Sync,
{
    let per_row = w.cols / W::N;
    let blocks: &[W] = blocks_of::<W>(w.data, w.rows * w.cols)?; // [rows][per_row]
    let acts: Vec<&[W::Act]> = acts
        .iter()
        .map(|a| {
            <W as VecDot>::Act::blocks_in(a).ok_or(QuantError::ActMismatch {
                weight: w.ty,
                expected: <<W as VecDot>::Act as ActBlock>::TYPE,
                got: a.act_type(),
            })
        })
        .collect::<Result<_, _>>()?; // [tokens][per_row]
    // llama.cpp multiplies a Q4_0 / Q4_K matrix of 8k rows through its repacked gemv, whose
    // per-row float order is not vec_dot's (see `quants::gemv`).
    let repacked = W::REPACK_ROWS.is_some_and(|n| w.rows.is_multiple_of(n));
    // The one routine every output element goes through.
    let element = |r: usize, t: usize| {
        let (row, act) = (&blocks[r * per_row..(r + 1) * per_row], acts[t]);
        let dot = if repacked { kernels.gemv(row, act) } else { kernels.dot(row, act) };
        bias.map_or(dot, |b| dot + b[r])
    };
    let rows = w.rows;
    if acts.len() == 1 {
        pool.for_each_item_mut(out, ROW_TILE, |tile, piece| {
            for (j, o) in piece.iter_mut().enumerate() {
                *o = element(tile * ROW_TILE + j, 0);
            }
        });
        return Ok(());
    }
    // tiles[i][t]: token t's outputs for rows i*ROW_TILE..
    let mut tiles = row_tiles(out, rows, acts.len(), ROW_TILE);
    pool.for_each_item_mut(&mut tiles, 1, |i, tile| {
        let tile = &mut tile[0];
        let n_rows = tile.first().map_or(0, |p| p.len());
        // One weight row against every token at once (`Kernels::dot_rows` / `gemv_rows`: the
        // same dot per element, each weight block unpacked once for several tokens where the
        // ISA can).
        let mut dots = vec![0.0f32; acts.len()];
        for j in 0..n_rows {
            let r = i * ROW_TILE + j;
            let row = &blocks[r * per_row..(r + 1) * per_row];
            if repacked {
                kernels.gemv_rows(row, &acts, &mut dots);
            } else {
                kernels.dot_rows(row, &acts, &mut dots);
            }
            for (piece, &dot) in tile.iter_mut().zip(&dots) {
                piece[j] = bias.map_or(dot, |b| dot + b[r]);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quants::{F16Le, vec_dot_row};

    /// A Q8_0 matrix whose row `r` has scale `(r + 1) / 64` and quants `(r + i) % 7 - 3`.
    fn q8_matrix(rows: usize, cols: usize) -> Vec<u8> {
        let mut data = Vec::new();
        for r in 0..rows {
            for b in 0..cols / 32 {
                data.extend(F16Le::from_f32((r + 1) as f32 / 64.0).0);
                data.extend(
                    (0..32)
                        .map(|i| ((r + b + i) % 7) as i8 as u8)
                        .map(|q| q.wrapping_sub(3)),
                );
            }
        }
        data
    }

    #[test]
    fn every_row_of_every_tile_is_its_own_dot() {
        let pool = Pool::new(2).unwrap();
        let cols = 64;
        for rows in [1, ROW_TILE - 1, ROW_TILE, ROW_TILE + 1, 3 * ROW_TILE + 5] {
            let data = q8_matrix(rows, cols);
            let w = WeightMatrix {
                packed: None,
                ty: GgmlType::Q8_0,
                data: &data,
                rows,
                cols,
            };
            let x: Vec<f32> = (0..2 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut out = vec![f32::NAN; 2 * rows]; // [2][rows]
            matmul_with_isa(&pool, &w, &x, None, &mut out, Isa::Scalar).unwrap();
            for (t, xt) in x.chunks(cols).enumerate() {
                let act = ActRow::for_weight(GgmlType::Q8_0, xt).unwrap();
                for r in 0..rows {
                    let row = &data[r * w.row_bytes()..(r + 1) * w.row_bytes()];
                    let dot = vec_dot_row(GgmlType::Q8_0, row, &act).unwrap();
                    assert_eq!(
                        out[t * rows + r].to_bits(),
                        dot.to_bits(),
                        "rows {rows} t {t} r {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_shapes_are_fine_and_bad_ones_are_errors() {
        let pool = Pool::new(1).unwrap();
        let w = WeightMatrix {
            packed: None,
            ty: GgmlType::F32,
            data: &[],
            rows: 0,
            cols: 4,
        };
        matmul(&pool, &w, &[1.0; 8], None, &mut []).unwrap();
        matmul(&pool, &w, &[1.0; 8], Some(&[]), &mut []).unwrap();
        let err = matmul(&pool, &w, &[1.0; 8], Some(&[1.0]), &mut []).unwrap_err();
        assert_eq!(err, MatmulError::BiasLength { rows: 0, got: 1 });
        let w = WeightMatrix {
            packed: None,
            ty: GgmlType::F32,
            data: &[0; 16],
            rows: 1,
            cols: 4,
        };
        assert_eq!(check_shapes(&w, &[0.0; 12], None, &[0.0; 3]), Ok(3));
    }
}
