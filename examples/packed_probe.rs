//! What the load-time repacking gains in decode (docs/PERFORMANCE.md).
//!
//! One token through a Q4_K, Q5_0 or Q8_0 matrix, weights streamed from memory (copies totalling
//! 256 MiB, more than most last-level caches, unless asked otherwise), two ways that give
//! bit-identical results:
//!
//! * `rows`: one row at a time from the file's blocks (Q4_K: ggml's repacked gemv order; Q5_0,
//!   Q8_0: `vec_dot`), what decode runs with `MINFER_REPACK=0`;
//! * `packed`: the same products from the repacked copy ([`PackedMatrix`], 16 rows interleaved
//!   per block), what decode runs by default.
//!
//! `cargo run --release --example packed_probe -- [TYPE ROWS COLS THREADS MIB TOKENS]` (default
//! q4_k 8960 1536 1 256 1: the 1.5B's `ffn_gate`, copies of it totalling MIB, 1 keeping one copy
//! in cache; TOKENS > 1 times a batched decode's product, where both ways run the few-token
//! kernels). TYPE is q4_k, q6_k, q5_0 or q8_0. Rounds alternate the two; the medians are printed with
//! the rate at which each reads its own bytes (compare `examples/read_bandwidth.rs`).

use std::time::Instant;

use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul};
use minfer::quants::packed::PackedMatrix;
use minfer::quants::{F16Le, GgmlType};

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
    let ty = match std::env::args().nth(1).as_deref().unwrap_or("q4_k") {
        "q4_k" => GgmlType::Q4K,
        "q5_0" => GgmlType::Q5_0,
        "q8_0" => GgmlType::Q8_0,
        "q6_k" => GgmlType::Q6K,
        other => panic!("TYPE must be q4_k, q6_k, q5_0 or q8_0, not {other}"),
    };
    let (rows, cols, threads) = (arg(2, 8960), arg(3, 1536), arg(4, 1).max(1));
    let stream_bytes = arg(5, 256) << 20;
    let nt = arg(6, 1).max(1);
    let (block, block_bytes) = (ty.block_size(), ty.type_size());
    assert!(cols > 0 && cols % block == 0, "COLS must be a multiple of {block}");
    assert!(rows % 16 == 0, "ROWS must be a multiple of 16");
    // Random blocks with small finite scales (speed does not depend on the values); the
    // scales (d, and Q4_K's dmin) lead the block, except Q6_K's d, which ends it.
    let mut state = 0x9e37_79b9u32;
    let mut data: Vec<u8> = (0..rows * cols / block * block_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let scale = F16Le::from_f32(0.01).0;
    let scales = if ty == GgmlType::Q4K { 2 } else { 1 };
    let first_scale = if ty == GgmlType::Q6K { block_bytes - 2 } else { 0 };
    for b in data.chunks_exact_mut(block_bytes) {
        for s in 0..scales {
            b[first_scale + 2 * s..first_scale + 2 * s + 2].copy_from_slice(&scale);
        }
    }
    let n_copies = stream_bytes.div_ceil(data.len());
    let copies: Vec<Vec<u8>> = (0..n_copies).map(|_| data.clone()).collect();
    let packed: Vec<PackedMatrix> = copies
        .iter()
        .map(|c| PackedMatrix::for_decode(ty, c, rows, cols).expect("whole blocks").expect("a type that packs"))
        .collect();
    let x: Vec<f32> = (0..nt * cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let pool = Pool::new(threads).expect("a thread pool");
    let (mut by_rows, mut by_packed) = (vec![0.0f32; nt * rows], vec![0.0f32; nt * rows]);
    let (mut rows_ms, mut packed_ms) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (use_packed, out, ms) in [(false, &mut by_rows, &mut rows_ms), (true, &mut by_packed, &mut packed_ms)] {
            // From inside the pool, as a forward pass calls it (`Pool::install`): the other
            // workers spin between the calls instead of sleeping.
            let elapsed = pool.install(|| {
                let t0 = Instant::now();
                for i in 0..CALLS {
                    let c = i % n_copies;
                    let w = WeightMatrix { ty, data: &copies[c], rows, cols, packed: use_packed.then(|| &packed[c]) };
                    matmul(&pool, &w, &x, None, out).expect("matmul");
                }
                t0.elapsed()
            });
            ms.push(elapsed.as_secs_f64() * 1e3 / CALLS as f64);
        }
    }
    let same = by_rows.iter().zip(&by_packed).all(|(a, b)| a.to_bits() == b.to_bits());
    let (r, p) = (median(rows_ms), median(packed_ms));
    println!("{ty:?} {rows}x{cols}, {nt} token(s), {threads} thread(s), {n_copies} copies, medians of {ROUNDS} rounds of {CALLS} calls:");
    println!("  rows (file's blocks): {r:.3} ms, {:.1} GB/s of the file's bytes", data.len() as f64 / r / 1e6);
    println!("  packed:               {p:.3} ms, {:.1} GB/s of packed bytes", packed[0].bytes() as f64 / p / 1e6);
    println!("  results bit-identical: {same}");
}
