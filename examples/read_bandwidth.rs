//! The machine's read bandwidth: the ceiling a memory-bound decode step is measured against
//! (docs/PERFORMANCE.md; issue 19's "weight bytes per token ÷ measured read bandwidth").
//!
//! THREADS threads each stream their own part of one buffer (default 1 GiB, far more than the
//! last-level cache), folding every 64-byte line into an accumulator so no load can be skipped,
//! as a decode step streams the weights once with one part of each matrix per thread. Rounds
//! are timed after one untimed pass (which also faults the pages in); the median and the best
//! are printed in GB/s (10^9 bytes).
//!
//! `cargo run --release --example read_bandwidth -- [THREADS] [MIB] [ROUNDS]` (default 2 1024 7)

use std::time::Instant;

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Folds every 64-byte line of `part` (eight u64 lanes, xor and add so the compiler keeps each
/// load; it vectorises the lanes).
fn fold(part: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for line in part.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(line) {
            *a = a.wrapping_add(*v) ^ (*v >> 7);
        }
    }
    acc.iter().fold(0, |s, a| s ^ a)
}

fn pass(buf: &[u64], threads: usize) -> u64 {
    let per = buf.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf.chunks(per).map(|part| s.spawn(move || fold(part))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, |s, v| s ^ v)
    })
}

fn main() {
    let threads = arg(1, 2).max(1);
    let mib = arg(2, 1024).max(1);
    let rounds = arg(3, 7).max(1);
    let words = mib << 17; // MiB of u64
    let buf: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let bytes = (words * 8) as f64;
    let mut sink = pass(&buf, threads);
    let mut rates = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        sink ^= pass(&buf, threads);
        rates.push(bytes / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    println!(
        "read bandwidth, {threads} threads, {mib} MiB: median {:.1} GB/s, best {:.1} GB/s (sink {:x})",
        rates[rates.len() / 2],
        rates[rates.len() - 1],
        sink & 0xff
    );
}
