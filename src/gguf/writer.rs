//! A GGUF v3 writer: metadata values and a tensor table, then each tensor's bytes streamed in
//! order (the data need not fit in memory). Used by `minfer synth`; the reader's own tests
//! build their files with an independent byte builder (`tests/common/gguf_bytes.rs`).
//!
//! Layout: magic, version 3, tensor count, metadata count, the metadata, the tensor infos
//! (offsets relative to the data section, each aligned to [`ALIGNMENT`]), padding to the
//! alignment, the data.

use std::io::{self, Write};

use super::value::{MetaArray, MetaValue};
use crate::quants::GgmlType;

/// Alignment of the data section and of every tensor in it (ggml's default).
pub const ALIGNMENT: u64 = 32;

/// One tensor to write: ggml `ne` dims (`[in, out]` for a weight) and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Bytes of the tensor's data (rows of whole blocks). `None` when the row length is not a
    /// multiple of the type's block.
    pub fn n_bytes(&self) -> Option<u64> {
        let n: u64 = self.dims.iter().product();
        let row = *self.dims.first()?;
        let bs = self.ty.block_size() as u64;
        row.is_multiple_of(bs).then(|| n / bs * self.ty.type_size() as u64)
    }
}

fn put_str(w: &mut dyn Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn put_array(w: &mut dyn Write, a: &MetaArray) -> io::Result<()> {
    w.write_all(&(a.elem_type() as u32).to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    match a {
        MetaArray::U8(v) => w.write_all(v),
        MetaArray::I8(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::U16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::I16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::U32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::I32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::F32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::Bool(v) => v.iter().try_for_each(|x| w.write_all(&[*x as u8])),
        MetaArray::String(v) => v.iter().try_for_each(|s| put_str(w, s)),
        MetaArray::Array(v) => v.iter().try_for_each(|x| put_array(w, x)),
        MetaArray::U64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::I64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        MetaArray::F64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
    }
}

fn put_value(w: &mut dyn Write, v: &MetaValue) -> io::Result<()> {
    w.write_all(&(v.value_type() as u32).to_le_bytes())?;
    match v {
        MetaValue::U8(x) => w.write_all(&[*x]),
        MetaValue::I8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::Bool(x) => w.write_all(&[*x as u8]),
        MetaValue::String(s) => put_str(w, s),
        MetaValue::Array(a) => put_array(w, a),
        MetaValue::U64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

/// Writes a GGUF file of `metadata` and `tensors` to `w`; `fill(i, buf)` fills tensor `i`'s
/// bytes (`buf` is exactly its size). A tensor whose row is not whole blocks is an
/// `InvalidInput` error before anything is written.
pub fn write_gguf(w: &mut dyn Write, metadata: &[(String, MetaValue)], tensors: &[TensorSpec], mut fill: impl FnMut(usize, &mut [u8])) -> io::Result<()> {
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        let n = t.n_bytes().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("tensor {}: rows of {:?} are not whole {} blocks", t.name, t.dims, t.ty.name())))?;
        sizes.push(n);
    }
    let mut header: Vec<u8> = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut header, k)?;
        put_value(&mut header, v)?;
    }
    let mut offset = 0u64;
    for (t, &n) in tensors.iter().zip(&sizes) {
        put_str(&mut header, &t.name)?;
        header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            header.extend_from_slice(&d.to_le_bytes());
        }
        header.extend_from_slice(&t.ty.id().to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + n).next_multiple_of(ALIGNMENT);
    }
    header.resize((header.len() as u64).next_multiple_of(ALIGNMENT) as usize, 0);
    w.write_all(&header)?;
    let mut buf = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        buf.clear();
        buf.resize(n as usize, 0);
        fill(i, &mut buf);
        w.write_all(&buf)?;
        let pad = n.next_multiple_of(ALIGNMENT) - n;
        w.write_all(&vec![0u8; pad as usize])?;
    }
    w.flush()
}
