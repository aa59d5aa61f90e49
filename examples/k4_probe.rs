//! Measures what a load-time Q4_K repack could gain in decode (docs/PERFORMANCE.md, "Decode").
//!
//! One token through a Q4_K matrix on one thread, weights streamed from memory (copies totalling
//! 96 MiB, more than the last-level cache), two ways that give bit-identical results:
//!
//! * `gemv`: `vec_ops::matmul`, what decode runs today (one row at a time, ggml's repacked
//!   gemv order);
//! * `tile`: the prefill row-lane kernel (`Kernels::k4_tile`) on tiles filled beforehand, as a
//!   repack at load would leave them. These tiles are 2.2x the Q4_K bytes (one byte per value);
//!   a compact repack (nibbles, 16 rows interleaved) would be about 1.03x.
//!
//! `cargo run --release --example k4_probe -- [ROWS COLS]` (default 1536 8960, the 1.5B's
//! `ffn_down`). Rounds alternate the two; the medians are printed.

use std::time::Instant;

use bytemuck::Zeroable;
use minfer::quants::gemm_k::{K4Tile, K8Panel};
use minfer::quants::simd::Kernels;
use minfer::quants::{BlockQ4K, BlockQ8K, F16Le, GgmlType, quantize_row_q8_k};
use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul};

const STREAM_BYTES: usize = 96 << 20;
const ROUNDS: usize = 7;
const CALLS: usize = 200;

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (rows, cols) = (arg(1, 1536), arg(2, 8960));
    let per_row = cols / 256;
    assert!(per_row > 0 && cols % 256 == 0, "COLS must be a multiple of 256");
    // Random blocks with small finite scales (speed does not depend on the values).
    let mut state = 0x9e37_79b9u32;
    let mut data: Vec<u8> = (0..rows * per_row * size_of::<BlockQ4K>())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let scale = F16Le::from_f32(0.01).0;
    for b in data.chunks_exact_mut(size_of::<BlockQ4K>()) {
        b[0..2].copy_from_slice(&scale);
        b[2..4].copy_from_slice(&scale);
    }
    let kernels = Kernels::active();
    let copies: Vec<Vec<u8>> = (0..STREAM_BYTES.div_ceil(data.len())).map(|_| data.clone()).collect();
    let mut tiles = Vec::new();
    let mut tile_bytes = 0;
    while tile_bytes < STREAM_BYTES {
        let mut t = K4Tile::default();
        kernels.k4_fill(&mut t, bytemuck::cast_slice::<u8, BlockQ4K>(&data), per_row);
        tile_bytes += t.q.len() * 64 + (t.sc.len() + t.mp.len()) * 64 + (t.d.len() + t.dmin.len()) * 64;
        tiles.push(t);
    }
    let per_tile = tile_bytes / tiles.len();
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut act = vec![BlockQ8K::zeroed(); per_row];
    quantize_row_q8_k(&x, &mut act).expect("a whole number of super-blocks");
    let pool = Pool::new(1).expect("a pool of one thread");
    let (mut by_gemv, mut by_tile) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let (mut gemv_ms, mut tile_ms) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t0 = Instant::now();
        for i in 0..CALLS {
            let w = WeightMatrix { ty: GgmlType::Q4K, data: &copies[i % copies.len()], rows, cols };
            matmul(&pool, &w, &x, None, &mut by_gemv).expect("matmul");
        }
        gemv_ms.push(t0.elapsed().as_secs_f64() * 1e3 / CALLS as f64);
        let t0 = Instant::now();
        for i in 0..CALLS {
            let panel = K8Panel::new(vec![&act[..]]);
            let mut out: Vec<&mut [f32]> = vec![&mut by_tile[..]];
            assert!(kernels.k4_tile(&tiles[i % tiles.len()], &panel, &mut out), "this ISA has no row-lane tiles");
        }
        tile_ms.push(t0.elapsed().as_secs_f64() * 1e3 / CALLS as f64);
    }
    let same = by_gemv.iter().zip(&by_tile).all(|(a, b)| a.to_bits() == b.to_bits());
    let (g, t) = (median(gemv_ms), median(tile_ms));
    println!("Q4_K {rows}x{cols}, one token, one thread, medians of {ROUNDS} rounds of {CALLS} calls:");
    println!("  gemv (per row, today):  {g:.3} ms, {:.1} GB/s of Q4_K bytes", data.len() as f64 / g / 1e6);
    println!("  row-lane tile, filled:  {t:.3} ms, {:.1} GB/s of tile bytes ({:.2}x the Q4_K bytes)", per_tile as f64 / t / 1e6, per_tile as f64 / data.len() as f64);
    println!("  results bit-identical: {same}");
}
