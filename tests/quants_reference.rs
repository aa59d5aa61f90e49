//! Bit-exactness of every dequantizer against ggml's reference values
//! (`tests/data/quant-blocks.jsonl`, a copy of `shared/reference/quant-blocks.jsonl`: raw blocks
//! from real models and their dequantized f32 bit patterns).

use std::collections::BTreeMap;

use minfer::quants::{GgmlType, dequantize_row, weight_type};

struct RefBlock {
    tensor: String,
    ty: GgmlType,
    bytes: Vec<u8>,
    values: Vec<u32>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn load() -> Vec<RefBlock> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/quant-blocks.jsonl"
    ))
    .unwrap();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let tensor = v["tensor"].as_str().unwrap().to_string();
            let id = v["ggml_type_id"].as_u64().unwrap() as u32;
            let ty = weight_type(&tensor, id).unwrap();
            assert_eq!(ty.name(), v["type"].as_str().unwrap());
            let values = hex(v["values_f32_bits_hex"].as_str().unwrap())
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            RefBlock {
                tensor,
                ty,
                bytes: hex(v["block_bytes_hex"].as_str().unwrap()),
                values,
            }
        })
        .collect()
}

#[test]
fn every_reference_block_is_bit_exact() {
    let blocks = load();
    assert_eq!(blocks.len(), 384);
    let mut per_type: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut exact = 0;
    for b in &blocks {
        let mut out = vec![f32::NAN; b.values.len()];
        dequantize_row(b.ty, &b.bytes, &mut out).unwrap();
        let ok = out.iter().zip(&b.values).all(|(o, &v)| o.to_bits() == v);
        let e = per_type.entry(b.ty.name()).or_default();
        e.1 += 1;
        if ok {
            e.0 += 1;
            exact += 1;
        } else {
            let (i, (o, v)) = out
                .iter()
                .zip(&b.values)
                .enumerate()
                .find(|(_, (o, v))| o.to_bits() != **v)
                .unwrap();
            eprintln!(
                "{} block of {}: value {i} is {o:e} ({:08x}), expected {:e} ({v:08x})",
                b.ty,
                b.tensor,
                o.to_bits(),
                f32::from_bits(*v)
            );
        }
    }
    for (ty, (ok, n)) in &per_type {
        println!("{ty:>5}: {ok}/{n} bit-exact");
    }
    // Written past libtest's capture (which only takes `print!`), so that a plain
    // `cargo test --release` shows the count.
    let summary = format!("{exact}/{} reference blocks bit-exact\n", blocks.len());
    std::io::Write::write_all(&mut std::io::stdout(), summary.as_bytes()).unwrap();
    assert_eq!(exact, blocks.len());
}

/// The same blocks, concatenated per type and placed at every byte offset 0..4 of a buffer:
/// weight blocks have alignment 1, so a row can start anywhere in a memory map.
#[test]
fn rows_dequantize_at_any_byte_offset() {
    let blocks = load();
    let mut by_type: BTreeMap<&str, Vec<&RefBlock>> = BTreeMap::new();
    for b in &blocks {
        by_type.entry(b.ty.name()).or_default().push(b);
    }
    for group in by_type.values() {
        let ty = group[0].ty;
        let row: Vec<u8> = group.iter().flat_map(|b| b.bytes.iter().copied()).collect();
        let expected: Vec<u32> = group
            .iter()
            .flat_map(|b| b.values.iter().copied())
            .collect();
        for off in 0..4 {
            let mut buf = vec![0xeeu8; off];
            buf.extend_from_slice(&row);
            let mut out = vec![0.0f32; expected.len()];
            dequantize_row(ty, &buf[off..], &mut out).unwrap();
            assert!(
                out.iter().zip(&expected).all(|(o, &v)| o.to_bits() == v),
                "{ty} at +{off}"
            );
        }
    }
}
