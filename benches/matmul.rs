//! Decode and prefill shapes of qwen2.5-coder-0.5b through `kernels::matmul` with the active
//! ISA, on random weights (speed does not depend on the values).
//!
//! Throughput is weight bytes read per second (decimal GB/s): at nt = 1 every weight byte is read
//! once per call, so this is the figure to hold against the memory bandwidth (~10.9 GB/s on
//! one core of the development machine, ~23 GB/s on two). At nt = 32 the same bytes serve 32
//! tokens. Successive calls rotate through copies of the matrix totalling at least
//! [`STREAM_BYTES`], more than the last-level cache, so the weights come from memory as they do
//! in a real decode step (a whole model does not fit in cache).
//!
//! `cargo bench --bench matmul` (all), or e.g. `cargo bench --bench matmul -- 'nt1/'`.
//! `MINFER_NO_AVX512=1` / `MINFER_NO_AVX2=1` bench the AVX2 / scalar kernels.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use minfer::quants::simd::active_isa;
use minfer::quants::{F16Le, GgmlType};
use minfer::backends::cpu::kernels::Pool;
use minfer::backends::cpu::kernels::matmul::{WeightMatrix, matmul};

/// Random bytes with every block's f16 fields set to a small finite scale.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let size = ty.type_size();
    let n = rows * cols / ty.block_size() * size;
    let mut state = 0x9e37_79b9u32;
    let mut data: Vec<u8> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let scale = F16Le::from_f32(0.01).0;
    let fields: &[usize] = match ty {
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q6K => &[208],
        GgmlType::Q3K => &[108],
        GgmlType::Q2K => &[80, 82],
        _ => &[],
    };
    for block in data.chunks_exact_mut(size) {
        for &at in fields {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    data
}

/// Bytes of weight copies a benchmark rotates through (3x a 32 MiB L3).
const STREAM_BYTES: usize = 96 << 20;

/// (label, type, rows = out, cols = in)
const SHAPES: &[(&str, GgmlType, usize, usize)] = &[
    ("ffn_down", GgmlType::Q6K, 896, 4864),
    ("ffn_down", GgmlType::Q4K, 896, 4864),
    ("ffn_gate", GgmlType::Q5_0, 4864, 896),
    ("ffn_up", GgmlType::Q8_0, 4864, 896),
    ("output", GgmlType::Q8_0, 151_936, 896),
];

fn bench(c: &mut Criterion) {
    println!("active ISA: {}", active_isa());
    let pools: Vec<Pool> = [1, 2].map(|n| Pool::new(n).expect("pool")).into();
    for &(label, ty, rows, cols) in SHAPES {
        let data = weights(ty, rows, cols);
        let copies: Vec<Vec<u8>> = (0..STREAM_BYTES.div_ceil(data.len()))
            .map(|_| data.clone())
            .collect();
        let ws: Vec<WeightMatrix> = copies
            .iter()
            .map(|d| WeightMatrix {
                packed: None,
                ty,
                data: d,
                rows,
                cols,
            })
            .collect();
        for nt in [1usize, 2, 4, 8, 16, 32] {
            let x: Vec<f32> = (0..nt * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0.0f32; nt * rows];
            let mut group = c.benchmark_group(format!("nt{nt}/{label}_{ty}_{rows}x{cols}"));
            group.throughput(Throughput::BytesDecimal(data.len() as u64));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(500));
            group.measurement_time(Duration::from_secs(2));
            for pool in &pools {
                let mut next = 0;
                group.bench_function(BenchmarkId::new("threads", pool.n_threads()), |b| {
                    b.iter(|| {
                        next = (next + 1) % ws.len();
                        matmul(pool, &ws[next], black_box(&x), None, &mut out).expect("matmul")
                    })
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
