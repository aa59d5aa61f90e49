//! ggml tensor types: ids as stored in GGUF, block geometry, names.

use std::fmt;

/// The ggml type id of a tensor, as stored in a GGUF tensor info.
///
/// Only the types minfer can read have a variant; every other id (I-quants, TQ, MXFP4, …) is
/// [`QuantError::UnsupportedType`](super::QuantError::UnsupportedType) when a tensor needs it, and
/// an unknown id is rejected by the GGUF reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    BF16 = 30,
}

/// Every ggml type id that ggml itself defines (0..=42 minus the removed 4, 5, 31..=33 and
/// 36..=38), kept as a table of names so that errors can name a type minfer does not implement.
const GGML_NAMES: &[(u32, &str)] = &[
    (0, "F32"), (1, "F16"), (2, "Q4_0"), (3, "Q4_1"), (6, "Q5_0"), (7, "Q5_1"), (8, "Q8_0"),
    (9, "Q8_1"), (10, "Q2_K"), (11, "Q3_K"), (12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K"),
    (15, "Q8_K"), (16, "IQ2_XXS"), (17, "IQ2_XS"), (18, "IQ3_XXS"), (19, "IQ1_S"),
    (20, "IQ4_NL"), (21, "IQ3_S"), (22, "IQ2_S"), (23, "IQ4_XS"), (24, "I8"), (25, "I16"),
    (26, "I32"), (27, "I64"), (28, "F64"), (29, "IQ1_M"), (30, "BF16"), (34, "TQ1_0"),
    (35, "TQ2_0"), (39, "MXFP4"), (40, "NVFP4"), (41, "Q1_0"), (42, "Q2_0"),
];

/// The name ggml gives a type id, if ggml defines that id at all.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    GGML_NAMES.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
}

/// ggml's block geometry for the types that are defined but that minfer does not compute
/// with: (values per block, bytes per block). Needed so the GGUF reader can size and bound
/// such tensors (and report them as unsupported by name only when they are used).
const FOREIGN_GEOMETRY: &[(u32, u64, u64)] = &[
    (16, 256, 66), (17, 256, 74), (18, 256, 98), (19, 256, 50), (20, 32, 18), (21, 256, 110),
    (22, 256, 82), (23, 256, 136), (24, 1, 1), (25, 1, 2), (26, 1, 4), (27, 1, 8), (28, 1, 8),
    (29, 256, 56), (34, 256, 54), (35, 256, 66), (39, 32, 17), (40, 64, 36), (41, 128, 18),
    (42, 64, 18),
];

/// Geometry of any ggml-defined type id: (values per block, bytes per block).
pub fn ggml_block_geometry(id: u32) -> Option<(u64, u64)> {
    if let Some(t) = GgmlType::from_id(id) {
        return Some((t.block_size() as u64, t.type_size() as u64));
    }
    FOREIGN_GEOMETRY.iter().find(|(i, _, _)| *i == id).map(|(_, b, s)| (*b, *s))
}

impl GgmlType {
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
        GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q2K, GgmlType::Q3K,
        GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Q8K, GgmlType::BF16,
    ];

    /// Every type minfer stores weights in (everything but the activation-only Q8_1 and Q8_K).
    pub const WEIGHT_TYPES: [GgmlType; 13] = [
        GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
        GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2K, GgmlType::Q3K,
        GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K,
    ];

    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K => 256,
            GgmlType::Q6K | GgmlType::Q8K => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q8K => 292,
        }
    }

    /// ggml's name for the type (`"Q4_K"`, `"BF16"`).
    pub fn name(self) -> &'static str {
        ggml_type_name(self as u32).unwrap_or("?")
    }

    /// Whether this is a weight storage type minfer dequantizes and multiplies with (Q8_1 and
    /// Q8_K exist only as activation formats).
    pub const fn is_weight_type(self) -> bool {
        !matches!(self, GgmlType::Q8_1 | GgmlType::Q8K)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
