//! Typed errors of the GGUF reader: every malformed-file case has its own variant carrying the
//! values that were wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {version} (minfer reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error("file truncated: {what} at byte {offset} needs {need} bytes, {have} left")]
    Truncated { what: &'static str, offset: u64, need: u64, have: u64 },
    #[error("{what} count {count} is impossible: only {remaining} bytes left at byte {offset}")]
    CountTooLarge { what: &'static str, count: u64, offset: u64, remaining: u64 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    #[error("metadata key '{key}' has unknown value type id {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key '{key}' holds {bytes} bytes of strings (at most 4 GiB)")]
    StringArrayTooLarge { key: String, bytes: u64 },
    #[error("metadata key '{key}' nests arrays {depth} deep (limit {limit})")]
    ArrayTooDeep { key: String, depth: usize, limit: usize },
    #[error("duplicate metadata key '{key}'")]
    DuplicateKey { key: String },
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor { name: String },
    #[error("general.alignment must be a u32, found {found}")]
    AlignmentType { found: &'static str },
    #[error("general.alignment {value} is invalid (must be a power of two between 1 and 1 MiB)")]
    BadAlignment { value: u32 },
    #[error("tensor '{tensor}' has unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor '{tensor}' has {n_dims} dimensions (at most 4 are allowed)")]
    TooManyDims { tensor: String, n_dims: u32 },
    #[error("tensor '{tensor}' has a zero dimension: {dims:?}")]
    ZeroDim { tensor: String, dims: Vec<u64> },
    #[error("tensor '{tensor}' size overflows: dims {dims:?}")]
    SizeOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor '{tensor}' row of {ne0} values is not a multiple of its {type_name} block size {block}")]
    RaggedRow { tensor: String, ne0: u64, type_name: &'static str, block: u64 },
    #[error("tensor '{tensor}' data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor { tensor: String, offset: u64, alignment: u64 },
    #[error("tensor '{tensor}' data [{start}, {end}) lies past the end of the data section ({data_len} bytes)")]
    TensorOutOfBounds { tensor: String, start: u64, end: u64, data_len: u64 },
    #[error("{key} = {id} is not a token id (vocabulary has {n_vocab} tokens)")]
    SpecialTokenOutOfRange { key: String, id: u64, n_vocab: u64 },
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' is {found}, expected {expected}")]
    WrongType { key: String, expected: &'static str, found: String },
    #[error("metadata key '{key}' value {value} does not fit in {expected}")]
    OutOfRange { key: String, value: String, expected: &'static str },
    #[error("no tensor named '{name}'")]
    MissingTensor { name: String },
}
