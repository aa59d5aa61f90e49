//! xorshift32: a tiny deterministic generator for test data (no dependency, same stream on
//! every machine).

pub struct Rng(pub u32);

impl Rng {
    pub fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1 << 24) as f32
    }

    /// Roughly normal (Irwin–Hall of 4, mean 0, variance 1/3).
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() - 2.0
    }

    /// Like [`normal`](Self::normal) with occasional ×20 outliers, like LLM activations.
    pub fn activation(&mut self) -> f32 {
        let g = self.normal();
        if self.next().is_multiple_of(64) { g * 20.0 } else { g }
    }
}

/// `n` values uniform in [-scale, scale), from a xorshift32 stream seeded with
/// `seed * 2654435761 + 1` (the stream the ops tests and their ggml oracle hashes were made with).
pub fn symmetric(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s >> 8) as f32 / (1u32 << 23) as f32 - 1.0) * scale
        })
        .collect()
}
