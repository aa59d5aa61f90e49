//! The GGUF reader on hand-built files: a valid one read back exactly, and one test per
//! malformed case, each expecting its own typed error.

mod common;

use common::gguf_bytes::*;
use minfer::gguf::{GgufError, GgufFile, MetaArray, MetaValue};

fn parse(b: &GgufBytes) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(b.build())
}

fn err(b: &GgufBytes) -> GgufError {
    match parse(b) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => e,
    }
}

#[test]
fn valid_file_reads_back() {
    let f = parse(&valid()).expect("valid file");
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.get_str("general.architecture").unwrap(), "qwen2");
    assert_eq!(f.get_u32("qwen2.block_count").unwrap(), 2);
    assert_eq!(f.get_f32("qwen2.rope.freq_base").unwrap(), 10000.0);
    assert!(f.get_bool("general.flag").unwrap());
    assert_eq!(f.get_u64("general.big").unwrap(), 7);
    assert_eq!(f.get_u32("general.big").unwrap(), 7, "integers that fit convert");
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap(), &["a", "b", "c"]);
    assert_eq!(f.get_i32_array("tokenizer.ggml.token_type").unwrap(), vec![1, 1, 3]);
    let (t, data) = f.tensor_by_name("w.f32").unwrap();
    assert_eq!(t.dims, vec![4, 2]);
    assert_eq!(t.n_elements, 8);
    assert_eq!(data.len(), 32);
    assert_eq!(f32::from_le_bytes(data[28..32].try_into().unwrap()), 7.0);
    let (t, data) = f.tensor_by_name("w.q8").unwrap();
    assert_eq!((t.n_bytes, data.len()), (34, 34));
    assert_eq!(data[2..6], [0, 1, 2, 3]);
}

#[test]
fn tensor_data_is_zero_copy() {
    let path = std::env::temp_dir().join(format!("minfer-zc-{}.gguf", std::process::id()));
    std::fs::write(&path, valid().build()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let (_, a) = f.tensor_by_name("w.f32").unwrap();
    let (_, b) = f.tensor_by_name("w.f32").unwrap();
    assert_eq!(a.as_ptr(), b.as_ptr(), "both borrows point into the same map");
    assert_eq!(a.as_ptr() as usize % 32, 0, "data section is aligned in the page-aligned map");
    drop(f);
    std::fs::remove_file(path).ok();
}

#[test]
fn typed_accessors_name_key_and_type() {
    let f = parse(&valid()).unwrap();
    match f.get_u32("general.architecture") {
        Err(GgufError::WrongType { key, expected, found }) => {
            assert_eq!((key.as_str(), expected, found.as_str()), ("general.architecture", "u32", "string"));
        }
        other => panic!("{other:?}"),
    }
    let e = f.get_str("tokenizer.ggml.tokens").unwrap_err();
    assert!(e.to_string().contains("array of string"), "{e}");
    assert!(matches!(f.get_u32("nope"), Err(GgufError::MissingKey { key }) if key == "nope"));
    assert!(matches!(f.get_str_array("qwen2.block_count"), Err(GgufError::WrongType { .. })));
}

#[test]
fn version_2_is_read() {
    let mut b = valid();
    b.version = 2;
    assert_eq!(parse(&b).unwrap().version(), 2);
}

#[test]
fn bad_magic() {
    let mut b = valid();
    b.magic = *b"GGML";
    assert!(matches!(err(&b), GgufError::BadMagic { found } if found == b"GGML"));
    assert!(matches!(GgufFile::from_bytes(b"GG".to_vec()), Err(GgufError::BadMagic { .. })));
    assert!(matches!(GgufFile::from_bytes(vec![]), Err(GgufError::BadMagic { .. })));
}

#[test]
fn unsupported_version() {
    for v in [0, 1, 4, u32::MAX] {
        let mut b = valid();
        b.version = v;
        assert!(matches!(err(&b), GgufError::UnsupportedVersion { version } if version == v));
    }
}

#[test]
fn truncated_everywhere_is_an_error() {
    let bytes = valid().build();
    for cut in 0..bytes.len() {
        assert!(GgufFile::from_bytes(bytes[..cut].to_vec()).is_err(), "prefix of {cut} bytes accepted");
    }
}

#[test]
fn metadata_count_larger_than_file() {
    let mut b = valid();
    b.n_kv_override = Some(u64::MAX / 2);
    assert!(matches!(err(&b), GgufError::CountTooLarge { what: "metadata", .. }));
}

#[test]
fn tensor_count_larger_than_file() {
    let mut b = valid();
    b.n_tensors_override = Some(1 << 40);
    assert!(matches!(err(&b), GgufError::CountTooLarge { what: "tensor", .. }));
}

#[test]
fn string_length_larger_than_file() {
    let mut payload = (u64::MAX - 3).to_le_bytes().to_vec();
    payload.extend_from_slice(b"abc");
    let b = GgufBytes::default().kv("k", T_STRING, payload);
    assert!(matches!(err(&b), GgufError::Truncated { what: "string value", .. }));
    // A key whose length prefix is huge.
    let mut b = GgufBytes::default().kv_u32("k", 1);
    b.kvs[0].0 = vec![];
    let mut bytes = b.build();
    bytes[24..32].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(matches!(GgufFile::from_bytes(bytes), Err(GgufError::Truncated { what: "metadata key", .. })));
}

#[test]
fn array_length_larger_than_file() {
    let mut p = T_U32.to_le_bytes().to_vec();
    p.extend_from_slice(&(1u64 << 61).to_le_bytes());
    let b = GgufBytes::default().kv("k", T_ARRAY, p);
    assert!(matches!(err(&b), GgufError::CountTooLarge { what: "array element", count, .. } if count == 1 << 61));
    // Strings take at least 8 bytes each: a count of 2 strings with 9 bytes left is impossible.
    let mut p = T_STRING.to_le_bytes().to_vec();
    p.extend_from_slice(&2u64.to_le_bytes());
    p.extend_from_slice(&[0; 9]);
    let b = GgufBytes::default().kv("k", T_ARRAY, p);
    assert!(matches!(err(&b), GgufError::CountTooLarge { .. }));
}

#[test]
fn arrays_nested_too_deep() {
    // depth d: array of array of ... of u32 (one element each level)
    fn nested(depth: usize) -> Vec<u8> {
        if depth == 1 {
            let mut p = T_U32.to_le_bytes().to_vec();
            p.extend_from_slice(&1u64.to_le_bytes());
            p.extend_from_slice(&5u32.to_le_bytes());
            return p;
        }
        let mut p = T_ARRAY.to_le_bytes().to_vec();
        p.extend_from_slice(&1u64.to_le_bytes());
        p.extend(nested(depth - 1));
        p
    }
    let ok = GgufBytes::default().kv("k", T_ARRAY, nested(minfer::gguf::MAX_ARRAY_DEPTH));
    let f = parse(&ok).unwrap();
    assert!(matches!(f.get("k"), Some(MetaValue::Array(MetaArray::Array(_)))));
    let deep = GgufBytes::default().kv("k", T_ARRAY, nested(minfer::gguf::MAX_ARRAY_DEPTH + 1));
    assert!(matches!(err(&deep), GgufError::ArrayTooDeep { key, .. } if key == "k"));
    // A hostile file nesting thousands deep must not overflow the stack.
    let b = GgufBytes::default().kv("k", T_ARRAY, nested(5000));
    assert!(matches!(err(&b), GgufError::ArrayTooDeep { .. }));
}

#[test]
fn unknown_value_type() {
    let b = GgufBytes::default().kv("k", 13, vec![0; 8]);
    assert!(matches!(err(&b), GgufError::UnknownValueType { key, type_id: 13 } if key == "k"));
    let mut p = 99u32.to_le_bytes().to_vec();
    p.extend_from_slice(&0u64.to_le_bytes());
    let b = GgufBytes::default().kv("arr", T_ARRAY, p);
    assert!(matches!(err(&b), GgufError::UnknownValueType { type_id: 99, .. }));
}

#[test]
fn unknown_ggml_type() {
    for id in [4u32, 5, 31, 36, 43, 1000] {
        let b = GgufBytes::default().tensor("t", &[32], id, 0).data(vec![0; 64]);
        assert!(matches!(err(&b), GgufError::UnknownTensorType { tensor, type_id } if tensor == "t" && type_id == id), "id {id}");
    }
}

#[test]
fn unsupported_but_defined_type_is_read_and_refused_on_use() {
    // IQ2_XS (17): defined by ggml, so the file is valid; using it as a weight names tensor and type.
    let b = GgufBytes::default().tensor("blk.0.attn_q.weight", &[256], 17, 0).data(vec![0; 74]);
    let f = parse(&b).unwrap();
    let t = f.tensor("blk.0.attn_q.weight").unwrap();
    let e = t.weight_type().unwrap_err().to_string();
    assert!(e.contains("blk.0.attn_q.weight") && e.contains("IQ2_XS"), "{e}");
}

#[test]
fn too_many_dims() {
    let b = GgufBytes::default().tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(vec![0; 4]);
    assert!(matches!(err(&b), GgufError::TooManyDims { n_dims: 5, .. }));
    let mut b = GgufBytes::default().tensor("t", &[1], 0, 0).data(vec![0; 4]);
    b.tensors[0].n_dims = Some(u32::MAX);
    assert!(matches!(err(&b), GgufError::TooManyDims { .. }));
}

#[test]
fn zero_dimension() {
    let b = GgufBytes::default().tensor("t", &[4, 0], 0, 0).data(vec![0; 16]);
    assert!(matches!(err(&b), GgufError::ZeroDim { tensor, .. } if tensor == "t"));
}

#[test]
fn overflowing_dimensions() {
    let b = GgufBytes::default().tensor("t", &[1 << 32, 1 << 32, 4], 0, 0).data(vec![0; 16]);
    assert!(matches!(err(&b), GgufError::SizeOverflow { .. }));
    // Elements fit in u64 but bytes do not.
    let b = GgufBytes::default().tensor("t", &[1 << 31, 1 << 31], 0, 0).data(vec![0; 16]);
    assert!(matches!(err(&b), GgufError::SizeOverflow { .. } | GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn ragged_rows() {
    let b = GgufBytes::default().tensor("t", &[33, 2], 8, 0).data(vec![0; 128]);
    assert!(matches!(err(&b), GgufError::RaggedRow { ne0: 33, block: 32, .. }));
}

#[test]
fn tensor_data_past_end() {
    let b = GgufBytes::default().tensor("t", &[16], 0, 0).data(vec![0; 60]);
    assert!(matches!(err(&b), GgufError::TensorOutOfBounds { start: 0, end: 64, data_len: 60, .. }));
    let b = GgufBytes::default().tensor("t", &[1], 0, u64::MAX - 31).data(vec![0; 64]);
    assert!(matches!(err(&b), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn misaligned_tensor() {
    let b = GgufBytes::default().tensor("t", &[1], 0, 4).data(vec![0; 64]);
    assert!(matches!(err(&b), GgufError::MisalignedTensor { offset: 4, alignment: 32, .. }));
}

#[test]
fn bad_alignment_values() {
    for a in [0u32, 3, 24, 2 << 20] {
        let b = GgufBytes::default().kv_u32("general.alignment", a);
        assert!(matches!(err(&b), GgufError::BadAlignment { value } if value == a), "alignment {a}");
    }
    let b = GgufBytes::default().kv("general.alignment", T_U64, 32u64.to_le_bytes().to_vec());
    assert!(matches!(err(&b), GgufError::AlignmentType { found: "u64" }));
    let b = GgufBytes::default().kv_str("general.alignment", "32");
    assert!(matches!(err(&b), GgufError::AlignmentType { found: "string" }));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut b = GgufBytes::default().kv_u32("general.alignment", 64).tensor("t", &[2], 0, 64).data(vec![0; 72]);
    b.alignment = 64;
    let f = parse(&b).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
}

#[test]
fn duplicate_keys() {
    let b = GgufBytes::default().kv_u32("a", 1).kv_u32("a", 2);
    assert!(matches!(err(&b), GgufError::DuplicateKey { key } if key == "a"));
}

#[test]
fn duplicate_tensor_names() {
    let b = GgufBytes::default().tensor("t", &[1], 0, 0).tensor("t", &[1], 0, 32).data(vec![0; 64]);
    assert!(matches!(err(&b), GgufError::DuplicateTensor { name } if name == "t"));
}

#[test]
fn special_token_out_of_vocabulary() {
    let b = valid().kv_u32("tokenizer.ggml.bos_token_id", 3);
    assert!(matches!(err(&b), GgufError::SpecialTokenOutOfRange { key, id: 3, n_vocab: 3 } if key == "tokenizer.ggml.bos_token_id"));
    // -1 means "none" in llama.cpp files; other negative ids are out of range.
    let ok = valid().kv("tokenizer.ggml.padding_token_id", T_I32, (-1i32).to_le_bytes().to_vec());
    assert!(parse(&ok).is_ok());
    let bad = valid().kv("tokenizer.ggml.padding_token_id", T_I32, (-2i32).to_le_bytes().to_vec());
    assert!(matches!(err(&bad), GgufError::SpecialTokenOutOfRange { .. }));
    // Without a vocabulary every special id is out of range.
    let b = GgufBytes::default().kv_u32("tokenizer.ggml.eos_token_id", 0);
    assert!(matches!(err(&b), GgufError::SpecialTokenOutOfRange { n_vocab: 0, .. }));
}

#[test]
fn invalid_utf8_strings() {
    let mut b = GgufBytes::default().kv_u32("k", 1);
    b.kvs[0].0 = vec![0xff, 0xfe];
    assert!(matches!(err(&b), GgufError::InvalidUtf8 { what: "metadata key", .. }));
    let b = GgufBytes::default().kv("k", T_STRING, str_bytes(&[b'a', 0xc3]));
    assert!(matches!(err(&b), GgufError::InvalidUtf8 { what: "string value", .. }));
}

#[test]
fn every_error_is_one_line() {
    let mut b = valid();
    b.magic = *b"\n\n\n\n";
    let e = err(&b).to_string();
    assert!(!e.contains('\n'), "{e}");
}

/// Releasing a tensor's pages (`release_tensor_pages`, what the CPU backend does once it holds
/// a repacked copy) never changes a byte: not the tensor's, not a neighbour's sharing its edge
/// pages (read back from the file after the pages are dropped), and not a file held in memory
/// (`from_bytes`, where dropping pages would zero heap memory, so nothing is done).
#[test]
fn released_tensor_pages_read_back_unchanged() {
    let big: Vec<u8> = (0..256 * 1024 + 96u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) as f32).to_le_bytes()).collect();
    let n = big.len() as u64 / 4;
    let mut data = vec![7u8; 64]; // "small": 16 f32 before the big tensor, sharing its page
    data.extend_from_slice(&big);
    data.extend(vec![9u8; 64]); // "tail": after it, sharing its last page
    let bytes = common::gguf_bytes::GgufBytes::default()
        .kv_str("general.architecture", "qwen2")
        .tensor("small", &[16], 0, 0)
        .tensor("big", &[n], 0, 64)
        .tensor("tail", &[16], 0, 64 + big.len() as u64)
        .data(data.clone())
        .build();
    let path = std::env::temp_dir().join(format!("minfer-release-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let held = GgufFile::from_bytes(bytes).unwrap();
    for f in [&mapped, &held] {
        let snapshot = |f: &GgufFile| ["small", "big", "tail"].map(|t| f.tensor_by_name(t).unwrap().1.to_vec());
        let before = snapshot(f);
        assert_eq!(before[1], big);
        let resident = mapped_rss_kib(&path);
        for t in f.tensors() {
            f.release_tensor_pages(t);
        }
        if std::ptr::eq(f, &mapped) {
            // The map's resident pages go (Linux: its `Rss` in /proc/self/smaps).
            if let (Some(before), Some(after)) = (resident, mapped_rss_kib(&path)) {
                assert!(before >= 1024 && after < before / 4, "resident {before} KiB -> {after} KiB after release");
            }
        }
        assert_eq!(snapshot(f), before, "bytes changed after release");
    }
    drop(mapped);
    std::fs::remove_file(path).ok();
}

/// The resident KiB of this process's mapping of `path` (`Rss` in /proc/self/smaps), where the
/// OS reports it.
fn mapped_rss_kib(path: &std::path::Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let name = path.to_str()?;
    let mut lines = smaps.lines().skip_while(|l| !l.ends_with(name));
    lines.next()?;
    let rss = lines.find(|l| l.starts_with("Rss:"))?;
    rss.split_whitespace().nth(1)?.parse().ok()
}
