//! The GGUF parser proper: a bounds-checked cursor over the file bytes.
//!
//! Every length, count, product and offset read from the file is checked before it is used:
//! counts against the bytes left (each item takes at least a known number of bytes), sizes with
//! `checked_*` arithmetic, ranges by subtraction. A malformed file is therefore a typed
//! [`GgufError`], never a panic, an abort, a hang or an allocation larger than the file.

use std::collections::HashMap;

use super::error::GgufError;
use super::str_array::StrArray;
use super::tensor::TensorInfo;
use super::value::{MetaArray, MetaValue, ValueType};
use crate::quants::{GgmlType, ggml_block_geometry, ggml_type_name};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Deepest array nesting accepted (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 3;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: u32 = 4;

/// The parsed header: metadata in file order, tensor infos, where the data section starts.
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let have = self.remaining();
        if n > have {
            return Err(GgufError::Truncated { what, offset: self.pos as u64, need: n, have });
        }
        let n = n as usize; // n <= remaining <= usize::MAX
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &'static str) -> Result<(), GgufError> {
        let remaining = self.remaining();
        match count.checked_mul(min_size) {
            Some(need) if need <= remaining => Ok(()),
            _ => Err(GgufError::CountTooLarge { what, count, offset: self.pos as u64, remaining }),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        self.str(what).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the file bytes.
    fn str(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what, offset })
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType { key: key.to_string(), type_id: id })
    }

    fn value(&mut self, key: &str, ty: ValueType, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(u8::from_le_bytes(self.array("u8 value")?)),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.array("i8 value")?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array("u16 value")?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array("i16 value")?)),
            ValueType::U32 => MetaValue::U32(self.u32("u32 value")?),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array("i32 value")?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array("f32 value")?)),
            ValueType::Bool => MetaValue::Bool(self.array::<1>("bool value")?[0] != 0),
            ValueType::String => MetaValue::String(self.string("string value")?),
            ValueType::Array => MetaValue::Array(self.meta_array(key, depth + 1)?),
            ValueType::U64 => MetaValue::U64(self.u64("u64 value")?),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array("i64 value")?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array("f64 value")?)),
        })
    }

    fn meta_array(&mut self, key: &str, depth: usize) -> Result<MetaArray, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::ArrayTooDeep { key: key.to_string(), depth, limit: MAX_ARRAY_DEPTH });
        }
        let elem = self.value_type(key)?;
        let count = self.u64("array length")?;
        self.check_count(count, elem.min_size(), "array element")?;
        let n = count as usize; // bounded by the bytes left
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take(count * std::mem::size_of::<$t>() as u64, "array data")?;
                MetaArray::$variant(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of the element size")))
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => MetaArray::U8(self.take(count, "array data")?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => MetaArray::Bool(self.take(count, "array data")?.iter().map(|b| *b != 0).collect()),
            ValueType::String => {
                let mut v = StrArray::with_capacity(n);
                for _ in 0..n {
                    let s = self.str("array string")?;
                    v.push(s).map_err(|full| GgufError::StringArrayTooLarge { key: key.to_string(), bytes: full.bytes })?;
                }
                v.shrink_to_fit();
                MetaArray::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(key, depth + 1)?);
                }
                MetaArray::Array(v)
            }
        })
    }

    fn tensor_info(&mut self) -> Result<RawTensor, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { tensor: name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dimension")?);
        }
        let type_id = self.u32("tensor type")?;
        let offset = self.u64("tensor offset")?;
        Ok(RawTensor { name, dims, type_id, offset })
    }
}

struct RawTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
}

/// Parses the header of a GGUF file held in `buf` and checks every tensor against the data section.
pub fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.take(4, "magic").map_err(|_| GgufError::BadMagic { found: buf[..buf.len().min(4)].to_vec() })?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic.to_vec() });
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // A key-value pair takes at least a key length (8) and a value type (4) plus one byte.
    c.check_count(n_kv, 13, "metadata")?;

    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(n_kv as usize);
    let mut keys: HashMap<String, usize> = HashMap::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        if keys.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        let ty = c.value_type(&key)?;
        let value = c.value(&key, ty, 0)?;
        keys.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match keys.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) => {
            let a = *a;
            if a == 0 || !a.is_power_of_two() || u64::from(a) > MAX_ALIGNMENT {
                return Err(GgufError::BadAlignment { value: a });
            }
            u64::from(a)
        }
        Some(other) => return Err(GgufError::AlignmentType { found: other.value_type().name() }),
    };

    // A tensor info takes at least name length (8), n_dims (4), type (4) and offset (8).
    c.check_count(n_tensors, 24, "tensor")?;
    let mut raw = Vec::with_capacity(n_tensors as usize);
    let mut names: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let t = c.tensor_info()?;
        if names.insert(t.name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor { name: t.name });
        }
        raw.push(t);
    }

    let header_end = c.pos as u64;
    // header_end <= buf.len() and alignment <= 1 MiB, so this cannot overflow a u64.
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let data_len = (buf.len() as u64).saturating_sub(data_offset);

    let tensors = raw
        .into_iter()
        .enumerate()
        .map(|(index, t)| check_tensor(index as u32, t, alignment, data_len))
        .collect::<Result<Vec<_>, _>>()?;

    let header = Header { version, metadata, tensors, alignment, data_offset };
    check_special_tokens(&header)?;
    Ok(header)
}

fn check_tensor(index: u32, t: RawTensor, alignment: u64, data_len: u64) -> Result<TensorInfo, GgufError> {
    let RawTensor { name, dims, type_id, offset } = t;
    let (block, type_size) = ggml_block_geometry(type_id)
        .ok_or_else(|| GgufError::UnknownTensorType { tensor: name.clone(), type_id })?;
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim { tensor: name, dims });
    }
    let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let Some(n_elements) = n_elements.filter(|&n| n <= i64::MAX as u64) else {
        return Err(GgufError::SizeOverflow { tensor: name, dims });
    };
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block != 0 {
        let type_name = ggml_type_name(type_id).unwrap_or("?");
        return Err(GgufError::RaggedRow { tensor: name, ne0, type_name, block });
    }
    let Some(n_bytes) = (n_elements / block).checked_mul(type_size) else {
        return Err(GgufError::SizeOverflow { tensor: name, dims });
    };
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor { tensor: name, offset, alignment });
    }
    if offset > data_len || n_bytes > data_len - offset {
        let end = offset.saturating_add(n_bytes);
        return Err(GgufError::TensorOutOfBounds { tensor: name, start: offset, end, data_len });
    }
    Ok(TensorInfo { index, name, dims, type_id, ty: GgmlType::from_id(type_id), offset, n_elements, n_bytes })
}

/// Every `tokenizer.ggml.*_token_id` must name a token of the vocabulary.
fn check_special_tokens(h: &Header) -> Result<(), GgufError> {
    let n_vocab = h.metadata.iter().find_map(|(k, v)| match (k.as_str(), v) {
        ("tokenizer.ggml.tokens", MetaValue::Array(a)) => Some(a.len() as u64),
        _ => None,
    });
    for (key, value) in &h.metadata {
        if !(key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
            continue;
        }
        let Some(id) = value.as_i128() else {
            return Err(GgufError::WrongType {
                key: key.clone(),
                expected: "an integer token id",
                found: value.type_description(),
            });
        };
        // llama.cpp writes -1 for "no such token"; anything else must be in the vocabulary.
        if id == -1 {
            continue;
        }
        let limit = n_vocab.unwrap_or(0);
        if id < 0 || id >= i128::from(limit) {
            let id = u64::try_from(id).unwrap_or(u64::MAX);
            return Err(GgufError::SpecialTokenOutOfRange { key: key.clone(), id, n_vocab: limit });
        }
    }
    Ok(())
}
