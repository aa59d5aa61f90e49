//! Decode attention over a q8_0 KV cache: the fused packed read against the dequantizing read
//! (`MINFER_NO_FUSED_Q8_KV=1`), at 512 and 2048 cells in use, with Qwen2.5-0.5B's heads
//! (14 query heads, 2 KV heads of 64 values), 2 threads.
//!
//! `cargo bench --bench kv_attention`

use criterion::{Criterion, criterion_group, criterion_main};
use minfer::graph::KvType;
use minfer::backends::cpu::kernels::attention_q8::{PackedKv, attention_q8};
use minfer::backends::cpu::kernels::kv_cache::{attention_dequantized, kv_store_typed};
use minfer::backends::cpu::kernels::{AttnArgs, Pool};

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s >> 8) as f32 / (1u32 << 23) as f32 - 1.0) * 4.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let (n_head, n_head_kv, hd) = (14, 2, 64);
    let width = n_head_kv * hd;
    let pool = Pool::new(2).unwrap();
    for n in [512usize, 2048] {
        let t = KvType::Q8_0;
        let mut kr = vec![0.0f32; t.region_len(width, n)];
        let mut vr = kr.clone();
        let cells: Vec<i32> = (0..n as i32).collect();
        kv_store_typed((t, hd), &data(n * width, 1), &data(n * width, 2), &cells, n, &mut kr, &mut vr).unwrap();
        let q = data(n_head * hd, 3);
        let positions = [n as i32 - 1];
        let args = AttnArgs { q: &q, k_cache: &[], v_cache: &[], positions: &positions, n_head, n_head_kv, head_dim: hd, scale: 0.125, window: None };
        let mut out = vec![0.0f32; n_head * hd];
        let mut g = c.benchmark_group(format!("q8_0 KV decode attention, {n} cells"));
        g.bench_function("fused packed read", |b| {
            b.iter(|| attention_q8(&pool, &args, PackedKv { k: bytemuck::cast_slice(&kr), v: bytemuck::cast_slice(&vr) }, &mut out).unwrap())
        });
        g.bench_function("dequantizing read", |b| b.iter(|| attention_dequantized(&pool, t, &args, (&kr, &vr), &mut out).unwrap()));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
