//! The IR, the builder and the exporters.

mod graph_support;

use graph_support::{Qwen2Shape, count_op, iquant_tensor, params, tensor};
use minfer::graph::{
    AttnMeta, Backend, CNode, ComputeGraph, DType, GraphBuilder, GraphError, NodeMeta,
    NodeSpec, Op, OpKind, RoPEMeta, RopeStyle,
};
use minfer::quants::GgmlType;

fn raw_node(id: usize, op: Op, src: &[usize]) -> CNode {
    CNode {
        id,
        name: format!("n{id}"),
        op,
        src: src.to_vec(),
        out_shape: [4, 1, 1, 1],
        out_dtype: DType::F32,
        layer: None,
        backend: None,
        meta: NodeMeta::None,
    }
}

fn chain() -> ComputeGraph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let s = b.silu(x).unwrap();
    let m = b.mul(s, x).unwrap();
    let a = b.add(m, x).unwrap();
    b.output(a).unwrap();
    b.build()
}

#[test]
fn topo_order_validates_chain() {
    let g = chain();
    assert_eq!(g.topo_order().unwrap(), vec![0, 1, 2, 3]);
    g.validate().unwrap();
}

#[test]
fn topo_order_detects_cycle() {
    let g = ComputeGraph {
        nodes: vec![
            raw_node(0, Op::Input, &[]),
            raw_node(1, Op::Add, &[0, 2]),
            raw_node(2, Op::Silu, &[1]),
        ],
        inputs: vec![0],
        outputs: vec![2],
        uid: 0,
    };
    match g.topo_order() {
        Err(GraphError::Cycle { node, .. }) => assert!(node == 1 || node == 2),
        other => panic!("expected a cycle, got {other:?}"),
    }
}

#[test]
fn topo_order_detects_dangling_ids() {
    let g = ComputeGraph {
        nodes: vec![raw_node(0, Op::Input, &[]), raw_node(1, Op::Silu, &[7])],
        inputs: vec![0],
        outputs: vec![1],
        uid: 0,
    };
    match g.topo_order() {
        Err(GraphError::DanglingSrc {
            node,
            src: 7,
            n_nodes: 2,
        }) => assert_eq!(node, "n1"),
        other => panic!("expected a dangling src, got {other:?}"),
    }
    let mut g = chain();
    g.outputs.push(99);
    assert!(matches!(
        g.validate(),
        Err(GraphError::DanglingId { id: 99, .. })
    ));
}

#[test]
fn validate_rejects_a_source_built_after_its_consumer() {
    // Acyclic, so topo_order accepts it, but build-order execution would read node 2 early.
    let g = ComputeGraph {
        nodes: vec![
            raw_node(0, Op::Input, &[]),
            raw_node(1, Op::Silu, &[2]),
            raw_node(2, Op::Silu, &[0]),
        ],
        inputs: vec![0],
        outputs: vec![1],
        uid: 0,
    };
    assert_eq!(g.topo_order().unwrap(), vec![0, 2, 1]);
    assert!(matches!(
        g.validate(),
        Err(GraphError::ForwardEdge { id: 1, src: 2, .. })
    ));
}

#[test]
fn op_partial_eq_compares_payloads() {
    assert_ne!(Op::RmsNorm { eps: 1e-5 }, Op::RmsNorm { eps: 1e-6 });
    assert_eq!(Op::RmsNorm { eps: 1e-6 }, Op::RmsNorm { eps: 1e-6 });
    assert_ne!(Op::KvcacheLoad { layer: 2 }, Op::KvcacheLoad { layer: 3 });
    assert_ne!(Op::KvcacheStore { layer: 2 }, Op::KvcacheLoad { layer: 2 });
    assert_ne!(
        Op::RoPE {
            style: RopeStyle::Interleaved
        },
        Op::RoPE {
            style: RopeStyle::NonInterleaved
        }
    );
    assert_ne!(Op::KvShift { layer: 1 }, Op::KvShift { layer: 2 });
    assert_ne!(
        Op::QkNorm {
            hd: 128,
            nh: 16,
            eps: 1e-6
        },
        Op::QkNorm {
            hd: 128,
            nh: 8,
            eps: 1e-6
        }
    );
    assert_ne!(Op::RmsNorm { eps: 1e-6 }, Op::RmsNorm { eps: 1e-5 });
}

#[test]
fn op_groups_are_declared_once() {
    let all = Op::examples();
    assert_eq!(all.len(), 17, "one example per Op variant");
    let names = |f: fn(&Op) -> bool| {
        all.iter()
            .filter(|o| f(o))
            .map(Op::name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(Op::in_place_safe), ["silu", "rope", "swiglu", "scale", "gelu", "geglu"]);
    assert_eq!(
        names(Op::is_elementwise),
        ["add", "mul", "silu", "swiglu", "scale", "gelu", "geglu"]
    );
    assert_eq!(names(Op::binds_kv_region), ["kv_store", "kv_load", "kv_shift"]);
    assert_eq!(names(Op::has_side_effect), ["kv_store", "kv_shift"]);
    assert_eq!(Op::KvShift { layer: 0 }.kind(), OpKind::Kv);
    let mut unique: Vec<&str> = all.iter().map(Op::name).collect();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "op names are unique");
}

#[test]
fn builder_creates_topo_sorted_graph() {
    let g = Qwen2Shape::tiny().build(&params(5, 16)).unwrap();
    assert_eq!(g.topo_order().unwrap().len(), g.nodes.len());
    g.validate().unwrap();
    for (i, n) in g.nodes.iter().enumerate() {
        assert_eq!(n.id, i);
        assert!(
            n.src.iter().all(|&s| s < i),
            "{} reads a later node",
            n.name
        );
        assert!(n.backend.is_none(), "the builder assigns no backend");
    }
    assert_eq!(g.inputs, vec![0, 1, 2]);
    assert_eq!(g.outputs, vec![g.nodes.len() - 1]);
    let names: Vec<&str> = g.inputs.iter().map(|&i| g.nodes[i].name.as_str()).collect();
    assert_eq!(names, ["token_ids", "positions", "tail_ids"]);
    // Shape propagation: logits [n_vocab, n_out].
    assert_eq!(g.nodes[g.outputs[0]].out_shape, [10, 1, 1, 1]);
}

#[test]
fn kv_nodes_carry_layer_only() {
    let shape = Qwen2Shape::tiny();
    let a = shape.build(&params(5, 16)).unwrap();
    let b = shape.build(&params(5, 16)).unwrap();
    for g in [&a, &b] {
        let kv: Vec<&CNode> = g.nodes.iter().filter(|n| n.op.binds_kv_region()).collect();
        assert_eq!(kv.len(), 2 * shape.n_layer);
        for n in kv {
            let layer = n.op.kv_layer().unwrap();
            assert!(
                matches!(n.op, Op::KvcacheStore { layer: l } | Op::KvcacheLoad { layer: l } if l == layer)
            );
            assert_eq!(n.layer, Some(layer));
            // The region shape is [n_embd_kv, n_ctx], whatever the step's positions.
            assert_eq!(n.out_shape, [shape.n_embd_kv(), 16, 1, 1]);
        }
    }
    // Positions are data: the same params build the same payloads.
    assert_eq!(a, b);
    let load = a.nodes.iter().find(|n| n.name == "kv_load-1").unwrap();
    assert!(load.src.is_empty());
    let store = a.nodes.iter().find(|n| n.name == "kv_store-1").unwrap();
    assert_eq!(store.src[2], 1, "the store reads the positions input");
}

#[test]
fn node_names_carry_the_layer() {
    let g = Qwen2Shape::tiny().build(&params(5, 16)).unwrap();
    let has = |name: &str| g.nodes.iter().any(|n| n.name == name);
    for name in [
        "token_embd",
        "attn_norm-0",
        "attn_q-0",
        "attn_k-1",
        "attn_q_rope-0",
        "attn_k_rope-1",
        "kv_store-0",
        "kv_load-1",
        "attn-1",
        "attn_output-1",
        "ffn_inp-0",
        "ffn_norm-1",
        "ffn_gate_silu-0",
        "mul-0",
        "ffn_down-1",
        "l_out-1",
        "attn_output_rows-1",
        "output_norm",
        "output",
    ] {
        assert!(has(name), "no node named {name}");
    }
    let mut names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), g.nodes.len(), "names are unique");
}

#[test]
fn qwen2_census_matches_the_walkthrough() {
    let shape = Qwen2Shape::qwen2_05b();
    let prefill = shape.build(&params(30, 4096)).unwrap();
    assert_eq!(prefill.nodes.len(), 440);
    assert_eq!(prefill.inputs, vec![0, 1, 2]);
    assert_eq!(prefill.outputs, vec![439]);
    let decode = shape.build(&params(1, 4096)).unwrap();
    assert_eq!(decode.nodes.len(), 437);
    for (op, n) in [
        ("mul_mat", 24 * 7 + 1),
        ("rope", 48),
        ("attn", 24),
        ("silu", 24),
        ("mul", 24),
        ("kv_store", 24),
    ] {
        assert_eq!(count_op(&prefill, op), n, "{op}");
    }
    assert_eq!(
        count_op(&prefill, "get_rows"),
        3,
        "embedding + two tail gathers"
    );
    assert_eq!(count_op(&decode, "get_rows"), 1);
    // Layer 0 is nodes 4..=21, exactly as the walkthrough numbers them.
    let l0: Vec<&str> = prefill.nodes[4..22].iter().map(|n| n.op.name()).collect();
    assert_eq!(
        l0,
        [
            "rms_norm", "mul_mat", "mul_mat", "mul_mat", "rope", "rope", "kv_store", "kv_load",
            "attn", "mul_mat", "add", "rms_norm", "mul_mat", "mul_mat", "silu", "mul", "mul_mat",
            "add",
        ]
    );
    assert_eq!(prefill.nodes[439].out_shape, [151936, 1, 1, 1]);
}

#[test]
fn matmul_records_weight_bias_and_gguf_layout() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [896, 3, 1, 1], DType::F32);
    b.set_layer(Some(7));
    let w = tensor("blk.7.attn_k.weight", &[896, 128], GgmlType::Q4K);
    let bias = tensor("blk.7.attn_k.bias", &[128], GgmlType::F32);
    let k = b.matmul(x, &w, Some(&bias)).unwrap();
    let g = b.build();
    let node = &g.nodes[k];
    assert_eq!(node.name, "attn_k-7");
    assert_eq!(node.out_shape, [128, 3, 1, 1]);
    match &node.meta {
        NodeMeta::MatMul(m) => {
            assert_eq!(m.weight_name, "blk.7.attn_k.weight");
            assert_eq!(m.bias_name.as_deref(), Some("blk.7.attn_k.bias"));
            assert_eq!(m.weight_type, GgmlType::Q4K);
            assert_eq!((m.in_dim, m.out_dim), (896, 128));
        }
        other => panic!("matmul meta expected, got {other:?}"),
    }
}

#[test]
fn unsupported_weight_type_is_a_typed_build_error_naming_the_tensor() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [8, 1, 1, 1], DType::F32);
    let w = iquant_tensor("blk.0.ffn_up.weight", &[8, 16]);
    let err = b.matmul(x, &w, None).unwrap_err();
    assert!(matches!(&err, GraphError::UnsupportedWeight { node, .. } if node == "ffn_up-0"));
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("IQ2_XS"),
        "{msg}"
    );
    // Q8_K is an activation format, not a weight type.
    let w = tensor("blk.0.ffn_up.weight", &[256, 16], GgmlType::Q8K);
    assert!(matches!(
        b.matmul(x, &w, None),
        Err(GraphError::UnsupportedWeight { .. })
    ));
    assert_eq!(
        b.graph().nodes.len(),
        1,
        "failed constructors append nothing"
    );
}

#[test]
fn shape_errors_are_typed() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [8, 2, 1, 1], DType::F32);
    let y = b.input("y", [4, 2, 1, 1], DType::F32);
    let w = tensor("blk.0.attn_q.weight", &[4, 8], GgmlType::F32);
    assert!(matches!(
        b.matmul(x, &w, None),
        Err(GraphError::DimMismatch {
            expected: 4,
            got: 8,
            ..
        })
    ));
    let w3 = tensor("blk.0.attn_q.weight", &[8, 8, 2], GgmlType::F32);
    assert!(matches!(
        b.matmul(x, &w3, None),
        Err(GraphError::WeightRank { .. })
    ));
    assert!(matches!(
        b.add(x, y),
        Err(GraphError::ShapeMismatch {
            left: [8, 2, 1, 1],
            right: [4, 2, 1, 1],
            ..
        })
    ));
    assert!(matches!(
        b.silu(42),
        Err(GraphError::DanglingId { id: 42, .. })
    ));
    let meta = RoPEMeta {
        n_head: 3,
        head_dim: 2,
        n_rot: 2,
        freq_base: 1e4,
    };
    let pos = b.input("positions", [2, 1, 1, 1], DType::I32);
    assert!(matches!(
        b.rope(x, pos, RopeStyle::NonInterleaved, meta),
        Err(GraphError::DimMismatch { .. })
    ));
    assert!(matches!(b.output(99), Err(GraphError::DanglingId { .. })));
}

#[test]
fn qk_norm_is_per_head_with_a_head_dim_weight() {
    let mut b = GraphBuilder::new();
    let q = b.input("q", [128 * 16, 3, 1, 1], DType::F32);
    b.set_layer(Some(5));
    let w = tensor("blk.5.attn_q_norm.weight", &[128], GgmlType::F32);
    let n = b.qk_norm(q, Some(&w), 128, 16, 1e-6).unwrap();
    let node = &b.graph().nodes[n];
    assert_eq!(node.name, "attn_q_norm-5");
    assert_eq!(
        node.op,
        Op::QkNorm {
            hd: 128,
            nh: 16,
            eps: 1e-6
        }
    );
    assert_eq!(node.out_shape, [2048, 3, 1, 1]);
    assert!(matches!(
        b.qk_norm(q, Some(&w), 128, 8, 1e-6),
        Err(GraphError::DimMismatch { .. })
    ));
    let wide = tensor("blk.5.attn_q_norm.weight", &[2048], GgmlType::F32);
    assert!(matches!(
        b.qk_norm(q, Some(&wide), 128, 16, 1e-6),
        Err(GraphError::DimMismatch {
            expected: 128,
            got: 2048,
            ..
        })
    ));
}

#[test]
fn attn_takes_its_shape_from_meta_and_its_layers_kv() {
    let mut b = GraphBuilder::new();
    let pos = b.input("positions", [1, 1, 1, 1], DType::I32);
    // A fused q handle wider than n_head * head_dim (q|k|v concat).
    let qkv = b.input("qkv", [8 + 2 * 4, 1, 1, 1], DType::F32);
    let kv0 = b.kvcache_load(0, 4, 32, (Default::default(), 4));
    let kv1 = b.kvcache_load(1, 4, 32, (Default::default(), 4));
    let meta = |layer| AttnMeta {
        layer,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 4,
        scale: 0.5,
        window: None,
        n_ctx: 32,
        kv_type: Default::default(),
    };
    let a = b.attn(qkv, kv0, pos, meta(0)).unwrap();
    assert_eq!(b.graph().nodes[a].out_shape, [8, 1, 1, 1]);
    assert_eq!(b.graph().nodes[a].src, vec![qkv, kv0, pos]);
    assert_eq!(b.graph().nodes[a].kv_layer(), Some(0));
    let err = b.attn(qkv, kv1, pos, meta(0)).unwrap_err();
    assert!(
        matches!(err, GraphError::AttnKvSource { layer: 0, .. }),
        "{err}"
    );
    let err = b.attn(qkv, qkv, pos, meta(0)).unwrap_err();
    assert!(matches!(err, GraphError::AttnKvSource { .. }));
}

#[test]
fn custom_nodes_go_through_node_spec() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    b.set_layer(Some(2));
    let s = b
        .node(NodeSpec::new("scaled", Op::Silu, &[x], [4, 1, 1, 1]))
        .unwrap();
    assert_eq!(b.graph().nodes[s].name, "scaled-2");
    assert!(matches!(
        b.node(NodeSpec::new("bad", Op::Silu, &[5], [4, 1, 1, 1])),
        Err(GraphError::DanglingId { id: 5, .. })
    ));
}

fn assigned_tiny() -> ComputeGraph {
    let mut g = Qwen2Shape::tiny().build(&params(5, 16)).unwrap();
    for n in &mut g.nodes {
        n.backend = Some(if n.op.name() == "mul_mat" {
            Backend::CUDA
        } else {
            Backend::CPU
        });
    }
    g.nodes[3].backend = None;
    g
}

#[test]
fn dot_export_round_trips_structurally() {
    let g = assigned_tiny();
    let dot = g.to_dot();
    assert!(dot.starts_with("digraph minfer {"));
    assert!(dot.trim_end().ends_with('}'));
    assert_eq!(dot.matches('{').count(), dot.matches('}').count());
    let node_lines: Vec<&str> = dot
        .lines()
        .filter(|l| l.trim_start().starts_with('n') && l.contains("[label="))
        .collect();
    assert_eq!(node_lines.len(), g.nodes.len());
    let edges = dot.lines().filter(|l| l.contains(" -> ")).count();
    assert_eq!(edges, g.nodes.iter().map(|n| n.src.len()).sum::<usize>());
    let io = g.inputs.len() + g.outputs.len();
    assert_eq!(dot.matches("doublecircle").count(), io);
    assert!(dot.contains("fillcolor=\"lightyellow\""));
    assert!(dot.contains("fillcolor=\"lightgreen\""));
    assert!(dot.contains("fillcolor=\"white\""));
    assert!(!dot.contains("lightblue"), "no node is on Metal");
    // Every edge names declared nodes.
    for line in dot.lines().filter(|l| l.contains(" -> ")) {
        let (a, b) = line
            .trim()
            .trim_end_matches(';')
            .split_once(" -> ")
            .unwrap();
        for end in [a, b] {
            let id: usize = end.trim_start_matches('n').parse().unwrap();
            assert!(id < g.nodes.len());
        }
    }
    // Payloads are readable on the page.
    assert!(dot.contains("KvcacheStore { layer: 1 }"));
}

#[test]
fn json_export_round_trips() {
    let g = assigned_tiny();
    let p = params(5, 16);
    let mut buf = Vec::new();
    g.dump_json(&mut buf, Some(&p), Some("tiny")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v["format"], "minfer-graph");
    assert_eq!(v["version"], 1);
    assert_eq!(v["kind"], "prefill");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["params"]["n_ctx"], 16);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), g.nodes.len());
    let ids = |x: &serde_json::Value| -> Vec<usize> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect()
    };
    assert_eq!(ids(&v["inputs"]), g.inputs);
    assert_eq!(ids(&v["outputs"]), g.outputs);
    for (jn, n) in nodes.iter().zip(&g.nodes) {
        assert_eq!(jn["id"].as_u64().unwrap() as usize, n.id);
        assert_eq!(jn["name"], n.name.as_str());
        assert_eq!(jn["op"], n.op.name());
        assert_eq!(ids(&jn["src"]), n.src);
        assert_eq!(ids(&jn["shape"]).as_slice(), n.out_shape.as_slice());
        assert_eq!(jn["dtype"], n.out_dtype.name());
        match n.backend {
            Some(b) => assert_eq!(jn["backend"], b.name()),
            None => assert!(jn["backend"].is_null()),
        }
        assert_eq!(jn["meta"]["kind"], n.meta.kind_name());
    }
    let q = nodes.iter().find(|n| n["name"] == "attn_q-0").unwrap();
    assert_eq!(q["meta"]["weight"], "blk.0.attn_q.weight");
    assert_eq!(q["meta"]["weight_type"], "Q8_0");
    assert_eq!(q["meta"]["bias"], "blk.0.attn_q.bias");
}
