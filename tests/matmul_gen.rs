//! Deterministic random weights and activations for the `matmul_*` tests (included by them with
//! `#[path]`; as a test target of its own it has no tests).
#![allow(dead_code)]

use minfer::quants::*;

/// xorshift32: deterministic, seedable, no dependency.
pub struct Rng(pub u32);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1 << 24) as f32
    }
    /// Roughly normal, mean 0, deviation ~0.58.
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() - 2.0
    }
    pub fn sign(&mut self) -> f32 {
        if self.next_u32() & 1 == 0 { 1.0 } else { -1.0 }
    }
}

/// What a generated block looks like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Random quants, realistic scales (as in the models: `d` 1e-3..5e-2, mins negative).
    Random,
    /// Every byte zero (scales and quants).
    Zero,
    /// Every quant at its largest code, large scales, Q6_K scales at -128 (the extremes of the
    /// integer paths).
    Max,
}

/// Byte offsets of a block's f16 fields: (scale, second f16 if any).
fn f16_fields(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (0, None),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => (0, Some(2)),
        GgmlType::Q2K => (80, Some(82)),
        GgmlType::Q3K => (108, None),
        GgmlType::Q6K => (208, None),
        _ => unreachable!("{ty} has no f16 fields"),
    }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&F16Le::from_f32(v).0);
}

/// One block of weight type `ty` (a quantized type) of the given kind.
pub fn weight_block(rng: &mut Rng, ty: GgmlType, kind: Kind) -> Vec<u8> {
    let size = ty.type_size();
    let mut b: Vec<u8> = match kind {
        Kind::Random => (0..size).map(|_| rng.next_u32() as u8).collect(),
        Kind::Zero => vec![0; size],
        Kind::Max => vec![0xff; size],
    };
    if kind == Kind::Zero {
        return b;
    }
    let (d_at, m_at) = f16_fields(ty);
    let k_quant = ty.block_size() == 256;
    let (d, m) = match kind {
        Kind::Random if k_quant => (0.0005 + rng.uniform() * 0.02, 0.0005 + rng.uniform() * 0.02),
        Kind::Random => (
            (0.001 + rng.uniform() * 0.05) * rng.sign(),
            -(0.01 + rng.uniform() * 0.3),
        ),
        _ => (0.25, if k_quant { 0.25 } else { -1.0 }),
    };
    put_f16(&mut b, d_at, if ty == GgmlType::Q6K { d * 0.1 } else { d });
    if let Some(at) = m_at {
        put_f16(&mut b, at, m);
    }
    if ty == GgmlType::Q6K && kind == Kind::Max {
        b[192..208].fill(0x80); // scales = -128
    }
    b
}

/// A row of `n` values of weight type `ty`: mostly random blocks, with a zero block and a max
/// block placed by `rng` when the row has at least 3 blocks.
pub fn weight_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float_row(rng, ty, n),
        _ => {
            let nb = n / ty.block_size();
            let (zero, max) = if nb >= 3 {
                let z = rng.next_u32() as usize % nb;
                (
                    Some(z),
                    Some((z + 1 + rng.next_u32() as usize % (nb - 1)) % nb),
                )
            } else {
                (None, None)
            };
            (0..nb)
                .flat_map(|i| {
                    let kind = if Some(i) == zero {
                        Kind::Zero
                    } else if Some(i) == max {
                        Kind::Max
                    } else {
                        Kind::Random
                    };
                    weight_block(rng, ty, kind)
                })
                .collect()
        }
    }
}

/// A float row of `n` values: ~N(0, 0.05), with a run of zeros and a few large values.
fn float_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let big = match ty {
        GgmlType::F16 => 6.0e4,
        GgmlType::BF16 => 1.0e30,
        _ => 1.0e30,
    };
    let vals: Vec<f32> = (0..n)
        .map(|i| match i % 97 {
            5..=12 => 0.0,
            40 => big * rng.sign(),
            _ => rng.normal() * 0.1,
        })
        .collect();
    vals.iter()
        .flat_map(|&v| match ty {
            GgmlType::F16 => F16Le::from_f32(v).0.to_vec(),
            GgmlType::BF16 => Bf16Le::from_f32(v).0.to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect()
}

/// `n` activations: normal at a random scale (1e-3, 1 or 30), one all-zero 32-value block and
/// one block at full magnitude (alternating ±scale*4) when there is room.
pub fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    let scale = [1e-3, 1.0, 30.0][rng.next_u32() as usize % 3];
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
    if n >= 96 {
        let b = n / 32;
        let z = rng.next_u32() as usize % b;
        x[32 * z..32 * z + 32].fill(0.0);
        let m = (z + 1) % b;
        for (i, v) in x[32 * m..32 * m + 32].iter_mut().enumerate() {
            *v = if i % 2 == 0 {
                4.0 * scale
            } else {
                -4.0 * scale
            };
        }
    }
    x
}

/// Σ |w_i a_i| in f64 over the dequantized rows, plus for Q4_1/Q5_1 the magnitude of the
/// `m * s` terms (Σ over blocks of |m| Σ|a_i|), which the kernels add separately.
pub fn magnitude(ty: GgmlType, w: &[u8], act: &ActRow) -> f64 {
    let a = act.dequantize();
    let mut wf = vec![0.0; a.len()];
    dequantize_row(ty, w, &mut wf).expect("dequantize");
    let mut s: f64 = wf
        .iter()
        .zip(&a)
        .map(|(&w, &a)| (f64::from(w) * f64::from(a)).abs())
        .sum();
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        let size = ty.type_size();
        for (blk, av) in w.chunks_exact(size).zip(a.chunks_exact(32)) {
            let m = F16Le([blk[2], blk[3]]).to_f32().abs();
            s += f64::from(m) * av.iter().map(|v| f64::from(v.abs())).sum::<f64>();
        }
    }
    s
}
