//! What the load-time Q4_K repack gains in decode (docs/PERFORMANCE.md, "Decode").
//!
//! One token through a Q4_K matrix, weights streamed from memory (copies totalling 256 MiB, more
//! than the last-level cache, unless asked otherwise), two ways that give bit-identical results:
//!
//! * `gemv`: one row at a time from the file's blocks (ggml's repacked gemv order), what decode
//!   runs with `MINFER_REPACK=0`;
//! * `packed`: the same products from the repacked copy ([`K4Packed`], 16 rows interleaved per
//!   super-block, 148 bytes per row and super-block against 144), what decode runs by default.
//!
//! `cargo run --release --example k4_probe -- [ROWS COLS THREADS MIB]` (default 8960 1536 1 256:
//! the 1.5B's `ffn_gate`, copies of it totalling MIB; 1 keeps one copy, in cache). Rounds alternate the two; the medians are printed with the rate at which
//! each reads its own bytes (compare `examples/read_bandwidth.rs`).

use std::time::Instant;

use minfer::quants::packed_k4::K4Packed;
use minfer::quants::{BlockQ4K, F16Le, GgmlType};
use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul};

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
    let (rows, cols, threads) = (arg(1, 8960), arg(2, 1536), arg(3, 1).max(1));
    let stream_bytes = arg(4, 256) << 20;
    let per_row = cols / 256;
    assert!(per_row > 0 && cols % 256 == 0, "COLS must be a multiple of 256");
    assert!(rows % 16 == 0, "ROWS must be a multiple of 16");
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
    let n_copies = stream_bytes.div_ceil(data.len());
    let copies: Vec<Vec<u8>> = (0..n_copies).map(|_| data.clone()).collect();
    let packed: Vec<K4Packed> = copies
        .iter()
        .map(|c| K4Packed::new(bytemuck::cast_slice::<u8, BlockQ4K>(c), rows, per_row).expect("whole super-blocks"))
        .collect();
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let pool = Pool::new(threads).expect("a thread pool");
    let (mut by_gemv, mut by_packed) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let (mut gemv_ms, mut packed_ms) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (use_packed, out, ms) in [(false, &mut by_gemv, &mut gemv_ms), (true, &mut by_packed, &mut packed_ms)] {
            let t0 = Instant::now();
            for i in 0..CALLS {
                let c = i % n_copies;
                let w = WeightMatrix { ty: GgmlType::Q4K, data: &copies[c], rows, cols, packed_k4: use_packed.then(|| &packed[c]) };
                matmul(&pool, &w, &x, None, out).expect("matmul");
            }
            ms.push(t0.elapsed().as_secs_f64() * 1e3 / CALLS as f64);
        }
    }
    let same = by_gemv.iter().zip(&by_packed).all(|(a, b)| a.to_bits() == b.to_bits());
    let (g, p) = (median(gemv_ms), median(packed_ms));
    println!("Q4_K {rows}x{cols}, one token, {threads} thread(s), medians of {ROUNDS} rounds of {CALLS} calls:");
    println!("  gemv (file's blocks):  {g:.3} ms, {:.1} GB/s of Q4_K bytes", data.len() as f64 / g / 1e6);
    println!("  packed (K4Packed):     {p:.3} ms, {:.1} GB/s of packed bytes", packed[0].bytes() as f64 / p / 1e6);
    println!("  results bit-identical: {same}");
}
