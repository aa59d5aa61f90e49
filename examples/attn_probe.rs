//! Decode attention over f32 KV regions as a batched decode step runs it: B sequences of one
//! token each (Qwen2.5-0.5B's heads: 14 query heads, 2 KV heads of 64 values), `CELLS` cells in
//! use per sequence, through [`attention_runs`] from inside the pool, as a forward pass calls it.
//!
//! `cargo run --release --example attn_probe -- [B CELLS THREADS]` (default 4 160 2): prints the
//! median time of one call (all B sequences' attention of one layer).

use std::time::Instant;

use minfer::backends::cpu::kernels::{AttnArgs, AttnRun, Pool, attention_runs};

/// `n` values in [-2, 2), a different sequence per `seed` (speed does not depend on them).
fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 + seed as usize * 104_729) % 2000) as f32 / 500.0 - 2.0).collect()
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let (b, cells, threads) = (arg(1, 4).max(1), arg(2, 160).max(1), arg(3, 2).max(1));
    let (n_head, n_head_kv, hd) = (14, 2, 64);
    let width = n_head_kv * hd;
    let pool = Pool::new(threads).expect("a thread pool");
    let kv: Vec<(Vec<f32>, Vec<f32>)> = (0..b as u32).map(|s| (data(cells * width, 2 * s + 1), data(cells * width, 2 * s + 2))).collect();
    let qs: Vec<Vec<f32>> = (0..b as u32).map(|s| data(n_head * hd, 100 + s)).collect();
    let positions = [cells as i32 - 1];
    let mut outs: Vec<Vec<f32>> = (0..b).map(|_| vec![0.0f32; n_head * hd]).collect();
    const CALLS: usize = 2000;
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = pool.install(|| {
            let t0 = Instant::now();
            for _ in 0..CALLS {
                let mut runs: Vec<AttnRun> = kv
                    .iter()
                    .zip(&qs)
                    .zip(outs.iter_mut())
                    .map(|(((k, v), q), out)| AttnRun {
                        args: AttnArgs { q, k_cache: k, v_cache: v, positions: &positions, n_head, n_head_kv, head_dim: hd, scale: 0.125, window: None },
                        out,
                    })
                    .collect();
                attention_runs(&pool, &mut runs).expect("attention");
            }
            t0.elapsed().as_secs_f64() * 1e6 / CALLS as f64
        });
        times.push(t);
    }
    times.sort_by(f64::total_cmp);
    println!("{b} sequence(s) of 1 token, {cells} cells, {threads} thread(s): {:.2} us a call (median of 7 x {CALLS})", times[3]);
}
