//! Model profiles: a real model's shape without its weights — its hyper-parameter metadata and
//! every tensor's name, dims and type — and the synthetic GGUF written from one (`minfer
//! synth`): the same tensors with random but valid blocks, for speed measurement where the
//! real file cannot travel (a GPU machine reached through a 64 MiB bundle).
//!
//! A profile is JSON (`profiles/*.json`, made by `minfer synth --like FILE --print-profile`):
//!
//! ```text
//! {"name": ..., "source": ..., "n_vocab": 151936,
//!  "metadata": [[key, type, value], ...],        // every key but the tokenizer's arrays
//!  "tensors": [[name, [dims], "Q4_K"], ...]}
//! ```
//!
//! The synthetic file's tokenizer keeps the profile's scalar tokenizer keys (model, pre,
//! special ids) and has `n_vocab` tokens: the 256 byte-level symbols, then placeholder tokens,
//! no merges (text tokenizes byte by byte). Its blocks are random bytes with every f16 scale
//! set to a small positive value, so no value is NaN or infinite; norm weights are 1 and other
//! float tensors small. Its answers are noise; its speed is the real model's.

use std::io::Write;

use serde_json::{Value as J, json};

use crate::gguf::writer::{TensorSpec, write_gguf};
use crate::gguf::{GgufFile, MetaArray, MetaValue, StrArray};
use crate::quants::GgmlType;

/// Profiles built in, by name.
pub const BUILTIN: &[(&str, &str)] = &[
    ("qwen2.5-0.5b-q4_k_m", include_str!("profiles/qwen2.5-0.5b-q4_k_m.json")),
    ("qwen2.5-1.5b-q4_k_m", include_str!("profiles/qwen2.5-1.5b-q4_k_m.json")),
];

/// Why a profile could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no built-in profile '{name}' (have: {have}); or give a .gguf file to copy the shape of")]
    Unknown { name: String, have: String },
    #[error("profile: {0}")]
    Malformed(String),
    #[error("metadata key {key}: {why}")]
    Value { key: String, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub source: String,
    pub n_vocab: usize,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorSpec>,
}

/// The tokenizer arrays a profile leaves out (synthesized instead).
const TOKENIZER_ARRAYS: [&str; 4] = ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores"];

fn scalar_json(v: &MetaValue) -> Option<(&'static str, J)> {
    Some(match v {
        MetaValue::U8(x) => ("u8", json!(x)),
        MetaValue::I8(x) => ("i8", json!(x)),
        MetaValue::U16(x) => ("u16", json!(x)),
        MetaValue::I16(x) => ("i16", json!(x)),
        MetaValue::U32(x) => ("u32", json!(x)),
        MetaValue::I32(x) => ("i32", json!(x)),
        MetaValue::U64(x) => ("u64", json!(x)),
        MetaValue::I64(x) => ("i64", json!(x)),
        MetaValue::F32(x) => ("f32", json!(x)),
        MetaValue::F64(x) => ("f64", json!(x)),
        MetaValue::Bool(x) => ("bool", json!(x)),
        MetaValue::String(x) => ("string", json!(x)),
        MetaValue::Array(MetaArray::String(a)) => ("[string]", json!(a.to_vec())),
        MetaValue::Array(MetaArray::I32(a)) => ("[i32]", json!(a)),
        MetaValue::Array(MetaArray::U32(a)) => ("[u32]", json!(a)),
        MetaValue::Array(MetaArray::F32(a)) => ("[f32]", json!(a)),
        MetaValue::Array(_) => return None,
    })
}

fn value_of(key: &str, ty: &str, v: &J) -> Result<MetaValue, ProfileError> {
    let bad = |why: &str| ProfileError::Value { key: key.to_string(), why: format!("{why} (type {ty}, value {v})") };
    let int = || v.as_i64().ok_or_else(|| bad("not an integer"));
    let uint = || v.as_u64().ok_or_else(|| bad("not an unsigned integer"));
    let narrow = |e: std::num::TryFromIntError| bad(&e.to_string());
    let arr = || v.as_array().ok_or_else(|| bad("not an array"));
    Ok(match ty {
        "u8" => MetaValue::U8(uint()?.try_into().map_err(narrow)?),
        "i8" => MetaValue::I8(int()?.try_into().map_err(narrow)?),
        "u16" => MetaValue::U16(uint()?.try_into().map_err(narrow)?),
        "i16" => MetaValue::I16(int()?.try_into().map_err(narrow)?),
        "u32" => MetaValue::U32(uint()?.try_into().map_err(narrow)?),
        "i32" => MetaValue::I32(int()?.try_into().map_err(narrow)?),
        "u64" => MetaValue::U64(uint()?),
        "i64" => MetaValue::I64(int()?),
        "f32" => MetaValue::F32(v.as_f64().ok_or_else(|| bad("not a number"))? as f32),
        "f64" => MetaValue::F64(v.as_f64().ok_or_else(|| bad("not a number"))?),
        "bool" => MetaValue::Bool(v.as_bool().ok_or_else(|| bad("not a boolean"))?),
        "string" => MetaValue::String(v.as_str().ok_or_else(|| bad("not a string"))?.to_string()),
        "[string]" => {
            let items: Vec<&str> = arr()?.iter().map(|x| x.as_str().ok_or_else(|| bad("an item is not a string"))).collect::<Result<_, _>>()?;
            MetaValue::Array(MetaArray::String(StrArray::from_strs(items).map_err(|_| bad("the strings exceed 4 GiB"))?))
        }
        "[i32]" => MetaValue::Array(MetaArray::I32(arr()?.iter().map(|x| x.as_i64().and_then(|i| i32::try_from(i).ok()).ok_or_else(|| bad("an item is not an i32"))).collect::<Result<_, _>>()?)),
        "[u32]" => MetaValue::Array(MetaArray::U32(arr()?.iter().map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(|| bad("an item is not a u32"))).collect::<Result<_, _>>()?)),
        "[f32]" => MetaValue::Array(MetaArray::F32(arr()?.iter().map(|x| x.as_f64().map(|f| f as f32).ok_or_else(|| bad("an item is not a number"))).collect::<Result<_, _>>()?)),
        _ => return Err(bad("unknown type")),
    })
}

impl Profile {
    /// The shape of an opened model file.
    pub fn of_file(file: &GgufFile, name: &str) -> Result<Profile, ProfileError> {
        let n_vocab = file.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()).unwrap_or(0);
        let mut metadata = Vec::new();
        for (k, v) in file.metadata() {
            if TOKENIZER_ARRAYS.contains(&k.as_str()) {
                continue;
            }
            if scalar_json(v).is_none() {
                return Err(ProfileError::Value { key: k.clone(), why: format!("{} values are not kept in profiles", v.type_description()) });
            }
            metadata.push((k.clone(), v.clone()));
        }
        let tensors = file
            .tensors()
            .iter()
            .map(|t| match t.ty {
                Some(ty) => Ok(TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ty }),
                None => Err(ProfileError::Malformed(format!("tensor {} has type {}, which minfer cannot write", t.name, t.type_name()))),
            })
            .collect::<Result<_, _>>()?;
        let source = file.path().and_then(|p| p.file_name()).map_or_else(|| "a GGUF file".to_string(), |n| n.to_string_lossy().into_owned());
        Ok(Profile { name: name.to_string(), source, n_vocab, metadata, tensors })
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        match BUILTIN.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => Profile::from_json(text),
            None => Err(ProfileError::Unknown { name: name.to_string(), have: BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ") }),
        }
    }

    pub fn to_json(&self) -> J {
        let metadata: Vec<J> = self.metadata.iter().filter_map(|(k, v)| scalar_json(v).map(|(t, j)| json!([k, t, j]))).collect();
        let tensors: Vec<J> = self.tensors.iter().map(|t| json!([t.name, t.dims, t.ty.name()])).collect();
        json!({"name": self.name, "source": self.source, "n_vocab": self.n_vocab, "metadata": metadata, "tensors": tensors})
    }

    /// [`to_json`](Self::to_json) as text with one metadata entry or tensor per line (the
    /// committed profiles are diffable).
    pub fn to_json_text(&self) -> String {
        let j = self.to_json();
        let lines = |k: &str| j[k].as_array().map(|a| a.iter().map(|x| format!("    {x}")).collect::<Vec<_>>().join(",\n")).unwrap_or_default();
        format!(
            "{{\n  \"name\": {},\n  \"source\": {},\n  \"n_vocab\": {},\n  \"metadata\": [\n{}\n  ],\n  \"tensors\": [\n{}\n  ]\n}}",
            j["name"], j["source"], j["n_vocab"], lines("metadata"), lines("tensors")
        )
    }

    pub fn from_json(text: &str) -> Result<Profile, ProfileError> {
        let bad = |w: &str| ProfileError::Malformed(w.to_string());
        let v: J = serde_json::from_str(text).map_err(|e| ProfileError::Malformed(e.to_string()))?;
        let s = |k: &str| v.get(k).and_then(J::as_str).map(str::to_string).ok_or_else(|| bad(&format!("no string '{k}'")));
        let n_vocab = v.get("n_vocab").and_then(J::as_u64).ok_or_else(|| bad("no 'n_vocab'"))? as usize;
        let mut metadata = Vec::new();
        for m in v.get("metadata").and_then(J::as_array).ok_or_else(|| bad("no 'metadata' array"))? {
            let (Some(k), Some(t), Some(x)) = (m.get(0).and_then(J::as_str), m.get(1).and_then(J::as_str), m.get(2)) else {
                return Err(bad(&format!("metadata entry {m} is not [key, type, value]")));
            };
            metadata.push((k.to_string(), value_of(k, t, x)?));
        }
        let mut tensors = Vec::new();
        for t in v.get("tensors").and_then(J::as_array).ok_or_else(|| bad("no 'tensors' array"))? {
            let (Some(name), Some(dims), Some(ty)) = (t.get(0).and_then(J::as_str), t.get(1).and_then(J::as_array), t.get(2).and_then(J::as_str)) else {
                return Err(bad(&format!("tensor entry {t} is not [name, dims, type]")));
            };
            let dims: Vec<u64> = dims.iter().map(|d| d.as_u64().ok_or_else(|| bad(&format!("tensor {name}: dims must be integers")))).collect::<Result<_, _>>()?;
            let ty = GgmlType::WEIGHT_TYPES.into_iter().find(|g| g.name() == ty).ok_or_else(|| bad(&format!("tensor {name}: unknown type {ty}")))?;
            tensors.push(TensorSpec { name: name.to_string(), dims, ty });
        }
        Ok(Profile { name: s("name")?, source: s("source")?, n_vocab, metadata, tensors })
    }

    /// Bytes of the synthetic file's tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().filter_map(TensorSpec::n_bytes).sum()
    }

    /// Writes the synthetic model to `w` (see the module docs); `seed` picks the random bytes.
    pub fn write_synthetic(&self, w: &mut dyn Write, seed: u64) -> Result<(), ProfileError> {
        let mut metadata = self.metadata.clone();
        let tokens: Vec<String> = (0..self.n_vocab).map(|i| if i < 256 { byte_symbol(i as u8).to_string() } else { format!("<|synth_{i}|>") }).collect();
        let tokens = StrArray::from_strs(&tokens).map_err(|_| ProfileError::Malformed("the token texts exceed 4 GiB".into()))?;
        metadata.push(("tokenizer.ggml.tokens".into(), MetaValue::Array(MetaArray::String(tokens))));
        metadata.push(("tokenizer.ggml.token_type".into(), MetaValue::Array(MetaArray::I32(vec![1; self.n_vocab]))));
        metadata.push(("tokenizer.ggml.merges".into(), MetaValue::Array(MetaArray::String(StrArray::default()))));
        metadata.push(("general.synthetic".into(), MetaValue::String(format!("minfer synth --like {} (random weights, seed {seed})", self.name))));
        let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
        write_gguf(w, &metadata, &self.tensors, |i, buf| fill(&self.tensors[i], buf, &mut rng))?;
        Ok(())
    }
}

/// GPT-2's byte-level symbol for byte `b` (printable Latin-1 stays, the rest moves to U+0100+).
fn byte_symbol(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// xorshift64*: fast, deterministic filler bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A small positive f16 scale, 2^-9 .. 2^-6.
fn scale_bits(rng: &mut Rng) -> [u8; 2] {
    half::f16::from_f32(0.002 + 0.013 * (rng.unit() * 0.5 + 0.5)).to_le_bytes()
}

/// Byte offsets of the f16 scales in one block of `ty`.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

fn fill(t: &TensorSpec, buf: &mut [u8], rng: &mut Rng) {
    match t.ty {
        GgmlType::F32 => {
            let norm = t.name.contains("norm");
            for c in buf.chunks_exact_mut(4) {
                let v = if norm { 1.0 } else { 0.02 * rng.unit() };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => buf.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::f16::from_f32(0.02 * rng.unit()).to_le_bytes())),
        GgmlType::BF16 => buf.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::bf16::from_f32(0.02 * rng.unit()).to_le_bytes())),
        ty => {
            for c in buf.chunks_mut(8) {
                let r = rng.next().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
            let offsets = scale_offsets(ty);
            for block in buf.chunks_exact_mut(ty.type_size()) {
                for &o in offsets {
                    block[o..o + 2].copy_from_slice(&scale_bits(rng));
                }
            }
        }
    }
}
