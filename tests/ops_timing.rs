//! Rough timings of the non-matmul kernels at Qwen2.5-0.5B sizes, per instruction set.
//! Not a test of anything; run with
//! `cargo test --release --test ops_timing -- --ignored --nocapture`.

mod common;

use std::time::Instant;

use minfer::backends::cpu::kernels::{self, AttnArgs, Isa, Pool, RopeCache};

fn rng(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    common::rng::symmetric(seed, n, scale)
}

/// Best of `reps` runs of `f`, in microseconds.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64() * 1e6);
    }
    best
}

#[test]
#[ignore = "timings, not a test; run with --ignored --nocapture"]
fn timings() {
    let (d, n_ff, hd, nh, nkv) = (896usize, 4864usize, 64usize, 14usize, 2usize);
    let threads = std::env::var("OPS_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = Pool::new(threads).unwrap();
    println!("{threads} threads");
    for isa in Isa::supported() {
        let nt = 128;
        let x = rng(1, nt * d, 2.0);
        let w = rng(2, d, 1.0);
        let mut y = vec![0.0; nt * d];
        let t_norm = time(20, || {
            kernels::rms_norm(&x, Some(&w), d, 1e-6, &mut y).unwrap()
        });
        let (g, u) = (rng(3, nt * n_ff, 8.0), rng(4, nt * n_ff, 2.0));
        let mut o = vec![0.0; nt * n_ff];
        let t_swiglu = time(10, || {
            kernels::swiglu_with(isa, &g, &u, n_ff, &mut o).unwrap()
        });
        let positions: Vec<i32> = (0..nt as i32).collect();
        let mut q = rng(5, nt * nh * hd, 1.0);
        let t_rope = time(10, || {
            let c = RopeCache::new(&positions, hd, 1e6).unwrap();
            c.apply(&mut q, nh).unwrap();
        });
        println!(
            "{:>6}: {nt} tokens: rms_norm {t_norm:8.1} us, swiglu {t_swiglu:8.1} us, rope(cache+q) {t_rope:8.1} us",
            isa.name()
        );

        let n_ctx = 4096;
        let (kc, vc) = (rng(6, n_ctx * nkv * hd, 1.0), rng(7, n_ctx * nkv * hd, 1.0));
        for pos in [10, 500, 4000] {
            let q1 = rng(8, nh * hd, 1.0);
            let p = [pos];
            let a = AttnArgs {
                q: &q1,
                k_cache: &kc,
                v_cache: &vc,
                positions: &p,
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                scale: 0.125,
                window: None,
            };
            let mut out = vec![0.0; nh * hd];
            let t = time(20, || {
                kernels::attention_with(isa, &pool, &a, &mut out).unwrap()
            });
            println!(
                "{:>6}: decode attention at pos {pos:5}: {t:8.1} us",
                isa.name()
            );
        }
        let nt = 512;
        let positions: Vec<i32> = (0..nt as i32).collect();
        let qp = rng(9, nt * nh * hd, 1.0);
        let a = AttnArgs {
            q: &qp,
            k_cache: &kc,
            v_cache: &vc,
            positions: &positions,
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            scale: 0.125,
            window: None,
        };
        let mut out = vec![0.0; qp.len()];
        let t = time(3, || {
            kernels::attention_with(isa, &pool, &a, &mut out).unwrap()
        });
        println!(
            "{:>6}: prefill attention of {nt} tokens: {:8.1} ms",
            isa.name(),
            t / 1e3
        );
    }
}
