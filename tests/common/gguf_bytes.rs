//! A hand-rolled GGUF byte builder for tests: writes exactly what it is told, including the
//! malformed things a real writer refuses to produce.

pub const T_U8: u32 = 0;
pub const T_U32: u32 = 4;
pub const T_I32: u32 = 5;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;

pub fn str_bytes(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

pub struct Tensor {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    pub n_dims: Option<u32>,
    pub type_id: u32,
    pub offset: u64,
}

pub struct GgufBytes {
    pub magic: [u8; 4],
    pub version: u32,
    /// (key bytes, value type, value payload)
    pub kvs: Vec<(Vec<u8>, u32, Vec<u8>)>,
    pub tensors: Vec<Tensor>,
    /// Overrides of the counts written in the header.
    pub n_kv_override: Option<u64>,
    pub n_tensors_override: Option<u64>,
    pub alignment: u64,
    pub data: Vec<u8>,
}

impl Default for GgufBytes {
    fn default() -> Self {
        GgufBytes {
            magic: *b"GGUF",
            version: 3,
            kvs: vec![],
            tensors: vec![],
            n_kv_override: None,
            n_tensors_override: None,
            alignment: 32,
            data: vec![],
        }
    }
}

impl GgufBytes {
    pub fn kv(mut self, key: &str, ty: u32, payload: Vec<u8>) -> Self {
        self.kvs.push((key.as_bytes().to_vec(), ty, payload));
        self
    }
    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv(key, T_U32, v.to_le_bytes().to_vec())
    }
    pub fn kv_f32(self, key: &str, v: f32) -> Self {
        self.kv(key, T_F32, v.to_le_bytes().to_vec())
    }
    pub fn kv_str(self, key: &str, v: &str) -> Self {
        self.kv(key, T_STRING, str_bytes(v.as_bytes()))
    }
    pub fn kv_str_array(self, key: &str, items: &[&str]) -> Self {
        let mut p = T_STRING.to_le_bytes().to_vec();
        p.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            p.extend(str_bytes(s.as_bytes()));
        }
        self.kv(key, T_ARRAY, p)
    }
    pub fn kv_i32_array(self, key: &str, items: &[i32]) -> Self {
        let mut p = T_I32.to_le_bytes().to_vec();
        p.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for x in items {
            p.extend_from_slice(&x.to_le_bytes());
        }
        self.kv(key, T_ARRAY, p)
    }
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        self.tensors.push(Tensor { name: name.as_bytes().to_vec(), dims: dims.to_vec(), n_dims: None, type_id, offset });
        self
    }
    pub fn data(mut self, bytes: Vec<u8>) -> Self {
        self.data = bytes;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut b = self.magic.to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.n_tensors_override.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv_override.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, payload) in &self.kvs {
            b.extend(str_bytes(k));
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(payload);
        }
        for t in &self.tensors {
            b.extend(str_bytes(&t.name));
            b.extend_from_slice(&t.n_dims.unwrap_or(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.type_id.to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        while !(b.len() as u64).is_multiple_of(self.alignment) {
            b.push(0);
        }
        b.extend_from_slice(&self.data);
        b
    }
}

/// A small valid file: a few metadata values of several types, a tokenizer vocabulary, and two
/// tensors (F32 [4, 2] and Q8_0 [32, 1]).
pub fn valid() -> GgufBytes {
    let mut data = Vec::new();
    for i in 0..8 {
        data.extend_from_slice(&(i as f32).to_le_bytes());
    }
    // Q8_0 block at offset 32: f16 scale 1.0 (0x3c00) then 32 int8 values 0..31
    data.extend_from_slice(&0x3c00u16.to_le_bytes());
    data.extend(0..32u8);
    GgufBytes::default()
        .kv_str("general.architecture", "qwen2")
        .kv_u32("qwen2.block_count", 2)
        .kv_f32("qwen2.rope.freq_base", 10000.0)
        .kv("general.flag", T_BOOL, vec![1])
        .kv("general.big", T_U64, 7u64.to_le_bytes().to_vec())
        .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "c"])
        .kv_i32_array("tokenizer.ggml.token_type", &[1, 1, 3])
        .kv_u32("tokenizer.ggml.eos_token_id", 2)
        .tensor("w.f32", &[4, 2], 0, 0)
        .tensor("w.q8", &[32, 1], 8, 32)
        .data(data)
}
