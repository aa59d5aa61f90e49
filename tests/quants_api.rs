//! Public API contract of the quant layer: typed errors (never panics) on bad input, type ids.

use minfer::quants::*;

#[test]
fn weight_type_names_tensor_and_type_in_errors() {
    assert_eq!(weight_type("blk.0.attn_q.weight", 12), Ok(GgmlType::Q4K));
    assert_eq!(weight_type("token_embd.weight", 30), Ok(GgmlType::BF16));
    let cases = [
        (16, "IQ2_XXS"),
        (20, "IQ4_NL"),
        (23, "IQ4_XS"),
        (29, "IQ1_M"),
        (9, "Q8_1"),
        (15, "Q8_K"),
        (35, "TQ2_0"),
        (39, "MXFP4"),
        (40, "NVFP4"),
        (4, "unknown"),
        (1000, "unknown"),
    ];
    for (id, name) in cases {
        let err = weight_type("blk.3.ffn_up.weight", id).unwrap_err();
        assert_eq!(
            err,
            QuantError::UnsupportedType {
                tensor: "blk.3.ffn_up.weight".into(),
                type_name: name.into(),
                type_id: id
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("blk.3.ffn_up.weight") && msg.contains(name),
            "{msg}"
        );
    }
}

#[test]
fn dequantize_row_checks_lengths() {
    let mut out = vec![0.0f32; 64];
    assert_eq!(
        dequantize_row(GgmlType::Q4K, &[0u8; 144], &mut out),
        Err(QuantError::RaggedRow {
            ty: GgmlType::Q4K,
            n: 64,
            block: 256
        })
    );
    assert_eq!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 35], &mut out),
        Err(QuantError::BadLength {
            ty: GgmlType::Q4_0,
            n: 64,
            got: 35,
            expected: 36
        })
    );
    assert_eq!(
        dequantize_row(GgmlType::Q8_1, &[0u8; 72], &mut out),
        Err(QuantError::NotWeightType { ty: GgmlType::Q8_1 })
    );
    assert_eq!(dequantize_row(GgmlType::F32, &[0u8; 256], &mut out), Ok(()));
    assert_eq!(dequantize_row(GgmlType::Q4_0, &[], &mut []), Ok(()));
}

#[test]
fn float_rows_dequantize_little_endian() {
    let mut out = [0.0f32; 2];
    dequantize_row(GgmlType::F16, &[0x00, 0x3c, 0x00, 0xc0], &mut out).unwrap();
    assert_eq!(out, [1.0, -2.0]);
    dequantize_row(GgmlType::BF16, &[0x80, 0x3f, 0x49, 0x40], &mut out).unwrap();
    assert_eq!(out, [1.0, 3.140625]);
    let bytes: Vec<u8> = [0.1f32, -7.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize_row(GgmlType::F32, &bytes, &mut out).unwrap();
    assert_eq!(out, [0.1, -7.5]);
}

#[test]
fn activation_types_follow_ggml() {
    use GgmlType::*;
    for (w, a) in [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2K, Q8K),
        (Q3K, Q8K),
        (Q4K, Q8K),
        (Q5K, Q8K),
        (Q6K, Q8K),
    ] {
        assert_eq!(vec_dot_type(w), Ok(a), "{w}");
        let row = ActRow::for_weight(w, &[1.0; 256]).unwrap();
        assert_eq!((row.act_type(), row.len()), (a, 256));
    }
    assert_eq!(
        vec_dot_type(Q8K),
        Err(QuantError::NotWeightType { ty: Q8K })
    );
    assert_eq!(
        ActRow::quantize(Q4K, &[0.0; 256]),
        Err(QuantError::NotActType { ty: Q4K })
    );
    assert!(matches!(
        ActRow::quantize(Q8K, &[0.0; 100]),
        Err(QuantError::RaggedRow { .. })
    ));
}

#[test]
fn weight_blocks_report_ggml_geometry() {
    fn geometry<B: WeightBlock>() -> (usize, usize) {
        (B::N, std::mem::size_of::<B>())
    }
    assert_eq!(geometry::<BlockQ4_0>(), (32, 18));
    assert_eq!(geometry::<BlockQ5_1>(), (32, 24));
    assert_eq!(geometry::<BlockQ3K>(), (256, 110));
    assert_eq!(geometry::<BlockQ6K>(), (256, 210));
    assert_eq!(geometry::<F16Le>(), (1, 2));
    assert_eq!(ggml_block_geometry(41), Some((128, 18)));
}
