//! 64-bit FNV-1a, the CUDA backend's one hash: the module cache's keys and the graph-replay
//! keys are built from it (neither needs more than telling structures apart; no input is
//! adversarial).

/// An FNV-1a state over bytes.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn byte(&mut self, b: u8) {
        self.0 ^= b as u64;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// A number, as its 8 little-endian bytes.
    pub fn u64(&mut self, v: u64) {
        v.to_le_bytes().into_iter().for_each(|b| self.byte(b));
    }

    /// A field: its length, then its bytes (so `("ab", "c")` and `("a", "bc")` differ).
    pub fn field(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        bytes.iter().for_each(|&b| self.byte(b));
    }
}
