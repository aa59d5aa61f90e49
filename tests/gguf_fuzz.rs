//! Stable stand-in for the `cargo fuzz` target `gguf` (fuzz/fuzz_targets/gguf.rs): many
//! thousands of mutated hand-built and real GGUF headers must each parse or fail with a typed
//! error — never panic, hang or allocate past the file size.

mod common;

use std::sync::OnceLock;

use common::gguf_bytes::{GgufBytes, T_ARRAY, T_STRING, T_U32, str_bytes, valid};
use minfer::gguf::GgufFile;
use minfer::models::HParams;
use proptest::prelude::*;

/// Everything a caller may do with a file that opened.
fn exercise(bytes: Vec<u8>) {
    let Ok(f) = GgufFile::from_bytes(bytes) else { return };
    for (_, v) in f.metadata() {
        let _ = v.to_json(8);
        let _ = v.to_string();
    }
    for t in f.tensors() {
        let data = f.tensor_data(t).expect("tensor of this file is in bounds");
        assert_eq!(data.len() as u64, t.n_bytes);
        let _ = t.weight_type();
    }
    let _ = HParams::from_gguf(&f);
    let _ = f.get_str_array("tokenizer.ggml.tokens");
    let _ = f.get_i32_array("tokenizer.ggml.token_type");
}

fn seeds() -> &'static Vec<Vec<u8>> {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut nested = T_ARRAY.to_le_bytes().to_vec();
        nested.extend_from_slice(&2u64.to_le_bytes());
        for _ in 0..2 {
            nested.extend_from_slice(&T_STRING.to_le_bytes());
            nested.extend_from_slice(&1u64.to_le_bytes());
            nested.extend(str_bytes(b"xy"));
        }
        vec![
            valid().build(),
            valid().kv_u32("general.alignment", 64).build(),
            GgufBytes::default().kv("n", T_ARRAY, nested).kv_u32("u", 3).build(),
            GgufBytes { version: 2, ..valid() }.build(),
            GgufBytes::default().tensor("q4k", &[256, 2], 12, 0).data(vec![0x11; 288]).kv("x", T_U32, vec![1, 0, 0, 0]).build(),
        ]
    })
}

/// The header of the real Qwen3-tiny file (vocabulary, merges, template, 46 tensor infos) plus
/// the start of its data.
fn real_header() -> &'static Vec<u8> {
    static REAL: OnceLock<Vec<u8>> = OnceLock::new();
    REAL.get_or_init(|| {
        let path = common::model_path(common::QWEN3_TINY);
        let f = GgufFile::open(&path).expect("real model opens");
        let end = f.data_offset() as usize + 4096;
        let bytes = std::fs::read(&path).expect("read model");
        bytes[..end.min(bytes.len())].to_vec()
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    SetByte(usize, u8),
    FlipBit(usize, u8),
    /// Overwrite 8 bytes with an interesting u64 (lengths and counts are u64).
    SetU64(usize, u64),
    /// Overwrite 4 bytes with an interesting u32 (types, versions, n_dims).
    SetU32(usize, u32),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(u64::MAX / 2), Just(1 << 32), Just(1 << 62), any::<u64>(), 0u64..300]
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX), 0u32..45, Just(1 << 20), Just(1 << 21), any::<u32>()]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        (pos, any::<u8>()).prop_map(|(p, b)| Mutation::SetByte(p, b)),
        (pos, 0u8..8).prop_map(|(p, b)| Mutation::FlipBit(p, b)),
        (pos, interesting_u64()).prop_map(|(p, v)| Mutation::SetU64(p, v)),
        (pos, interesting_u32()).prop_map(|(p, v)| Mutation::SetU32(p, v)),
        pos.prop_map(Mutation::Truncate),
        (pos, prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (pos, 1usize..64).prop_map(|(p, n)| Mutation::Remove(p, n)),
    ]
}

/// Applies mutations at positions taken modulo `limit` (the region worth mutating).
fn apply(mut b: Vec<u8>, muts: &[Mutation], limit: usize) -> Vec<u8> {
    for m in muts {
        let len = b.len().min(limit).max(1);
        match m {
            Mutation::SetByte(p, v) => {
                if let Some(x) = b.get_mut(p % len) {
                    *x = *v;
                }
            }
            Mutation::FlipBit(p, bit) => {
                if let Some(x) = b.get_mut(p % len) {
                    *x ^= 1 << bit;
                }
            }
            Mutation::SetU64(p, v) => {
                let p = p % len;
                if p + 8 <= b.len() {
                    b[p..p + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            Mutation::SetU32(p, v) => {
                let p = p % len;
                if p + 4 <= b.len() {
                    b[p..p + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            Mutation::Truncate(p) => b.truncate(p % (b.len() + 1)),
            Mutation::Insert(p, bytes) => {
                let p = p % (len + 1);
                let p = p.min(b.len());
                b.splice(p..p, bytes.iter().copied());
            }
            Mutation::Remove(p, n) => {
                let p = (p % len).min(b.len());
                let end = (p + n).min(b.len());
                b.drain(p..end);
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn mutated_hand_built_files_never_panic(seed in 0usize..5, muts in prop::collection::vec(mutation(), 1..6)) {
        let base = seeds()[seed].clone();
        let limit = base.len();
        exercise(apply(base, &muts, limit));
    }

    #[test]
    fn random_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..256), valid_prefix in any::<bool>()) {
        if valid_prefix && bytes.len() >= 8 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        exercise(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_500, failure_persistence: None, ..ProptestConfig::default() })]
    /// Mutations aimed at the real file's fixed header, its first keys and its tensor infos.
    #[test]
    fn mutated_real_header_never_panics(region in 0usize..3, muts in prop::collection::vec(mutation(), 1..4)) {
        let real = real_header();
        let f = GgufFile::from_bytes(real.clone());
        prop_assert!(f.is_err(), "the cut real file lacks its tensor data");
        let tensor_infos_start = real.len().saturating_sub(4096 + 46 * 60);
        let (start, limit) = match region {
            0 => (0, 512),
            1 => (tensor_infos_start, real.len() - tensor_infos_start),
            _ => (0, real.len()),
        };
        let mut head = real[..start].to_vec();
        head.extend(apply(real[start..].to_vec(), &muts, limit));
        exercise(head);
    }
}
