//! Element types of tensors: what a buffer region holds.

/// Element type of a node's output. Activations are F32, token ids and positions I32
/// (4-byte integers in their own typed regions), KV cells F32, F16 or packed Q8_0 rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    I32,
    Q8_0,
}

impl DType {
    /// Bytes needed for `n` values (Q8_0 in whole 32-value blocks of 34 bytes).
    pub const fn bytes_for(self, n: usize) -> usize {
        match self {
            DType::F32 | DType::I32 => 4 * n,
            DType::F16 => 2 * n,
            DType::Q8_0 => n.div_ceil(32) * 34,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
        }
    }
}

