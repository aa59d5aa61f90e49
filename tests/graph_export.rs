//! The graph exports against their contract: `docs/minfer-graph.schema.json` enumerates every
//! op and meta kind, a synthetic graph holding all of them validates, the CLI's
//! `--dump-graph-json` of the real models validates, and `--dump-graph`'s DOT renders with
//! Graphviz (`dot -Tsvg`).

mod common;
mod graph_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use graph_support::params;
use minfer::graph::{
    AttnMeta, Backend, CNode, ComputeGraph, DType, EmbedMeta, KvType, KvcacheMeta, MatMulMeta, NodeMeta, NormMeta, Op,
    RoPEMeta, KvShiftMeta, RopeStyle, WeightId};
use minfer::quants::GgmlType;
use serde_json::Value;

fn schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/minfer-graph.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&schema()).expect("the schema compiles")
}

/// The validation errors of `v`, one line each.
fn errors(v: &Value) -> Vec<String> {
    validator().iter_errors(v).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

#[test]
fn the_schema_lists_every_op_and_meta_kind() {
    let s = schema();
    let listed: BTreeSet<String> =
        s["$defs"]["op"]["enum"].as_array().unwrap().iter().map(|o| o.as_str().unwrap().to_string()).collect();
    let ops: BTreeSet<String> = Op::examples().iter().map(|o| o.name().to_string()).collect();
    assert_eq!(listed, ops, "schema op enum vs Op::examples");
    let kinds: BTreeSet<String> = s["$defs"]["meta"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["properties"]["kind"]["const"].as_str().unwrap().to_string())
        .collect();
    let metas: BTreeSet<String> = NodeMeta::KIND_NAMES.iter().map(|k| k.to_string()).collect();
    assert_eq!(kinds, metas, "schema meta kinds vs NodeMeta");
}

/// One meta of every kind.
fn metas() -> Vec<NodeMeta> {
    vec![
        NodeMeta::None,
        NodeMeta::MatMul(MatMulMeta {
            weight: WeightId(3),
            weight_name: "blk.0.attn_q.weight".into(),
            bias: Some(WeightId(4)),
            bias_name: Some("blk.0.attn_q.bias".into()),
            weight_type: GgmlType::Q4K,
            in_dim: 896,
            out_dim: 896,
        }),
        NodeMeta::Norm(NormMeta { weight: None, weight_name: None }),
        NodeMeta::Rope(RoPEMeta { n_head: 14, head_dim: 64, n_rot: 64, freq_base: 1e6 }),
        NodeMeta::Attn(AttnMeta { layer: 0, n_head: 14, n_head_kv: 2, head_dim: 64, scale: 0.125, n_ctx: 16, kv_type: KvType::Q8_0, window: None }),
        NodeMeta::Kvcache(KvcacheMeta { layer: 1, n_embd_kv: 128, n_ctx: 16, kv_type: KvType::F16, head_dim: 64 }),
        NodeMeta::Embed(EmbedMeta { weight: WeightId(0), weight_name: "token_embd.weight".into(), weight_type: GgmlType::Q8_0, n_embd: 896 }),
        NodeMeta::KvShift(KvShiftMeta {
            kv: KvcacheMeta { layer: 2, n_embd_kv: 128, n_ctx: 16, kv_type: KvType::Q8_0, head_dim: 64 },
            rope: RoPEMeta { n_head: 2, head_dim: 64, n_rot: 64, freq_base: 1e6 },
            style: RopeStyle::NonInterleaved,
        }),
    ]
}

/// A graph with a node of every op (each fed by the one before), metas of every kind and
/// every backend (and none).
fn every_op_graph() -> ComputeGraph {
    let backends = [Some(Backend::CPU), Some(Backend::METAL), Some(Backend::CUDA), None];
    let metas = metas();
    let nodes: Vec<CNode> = Op::examples()
        .into_iter()
        .enumerate()
        .map(|(id, op)| CNode {
            id,
            name: format!("{}-{id}", op.name()),
            op,
            src: if id == 0 { vec![] } else { vec![id - 1] },
            out_shape: [8, 2, 1, 1],
            out_dtype: [DType::F32, DType::F16, DType::I32, DType::Q8_0][id % 4],
            layer: (id % 2 == 0).then_some(id / 2),
            backend: backends[id % backends.len()],
            meta: metas[id % metas.len()].clone(),
        })
        .collect();
    let last = nodes.len() - 1;
    ComputeGraph { nodes, inputs: vec![0], outputs: vec![last], uid: 0 }
}

#[test]
fn a_graph_of_every_op_and_meta_validates_and_a_broken_one_does_not() {
    let g = every_op_graph();
    for (p, model) in [(Some(params(5, 16)), Some("synthetic")), (None, None)] {
        let v = g.export_json(p.as_ref(), model);
        assert_eq!(errors(&v), Vec::<String>::new());
    }
    // The schema can fail: an unknown op, a meta missing a field, a stray field.
    let v = g.export_json(Some(&params(1, 16)), Some("synthetic"));
    let broken = |path: &str, edit: &dyn Fn(&mut Value)| {
        let mut w = v.clone();
        edit(&mut w);
        assert!(!errors(&w).is_empty(), "{path}: accepted");
    };
    broken("op", &|w| w["nodes"][3]["op"] = "mystery".into());
    broken("meta", &|w| {
        let i = w["nodes"].as_array().unwrap().iter().position(|n| n["meta"]["kind"] == "matmul").unwrap();
        w["nodes"][i]["meta"].as_object_mut().unwrap().remove("weight");
    });
    broken("extra", &|w| w["nodes"][0]["colour"] = "red".into());
    broken("backend", &|w| w["nodes"][0]["backend"] = "tpu".into());
    broken("format", &|w| w["format"] = "other".into());
}

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minfer-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `--dump-graph-json` and `--dump-graph` of a real model: the JSON validates and agrees with
/// the DOT, which Graphviz renders with one SVG node per graph node.
fn export_and_render(model: &str, prompt: &str, kind: &str) {
    let m = common::model_path(model);
    let stem = format!("{}-{kind}", model.trim_end_matches(".gguf"));
    let (json, dot, svg) = (tmp(&format!("{stem}.json")), tmp(&format!("{stem}.dot")), tmp(&format!("{stem}.svg")));
    let out = minfer(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--raw",
        "-p",
        prompt,
        "--dump-graph-json",
        json.to_str().unwrap(),
        "--dump-graph",
        dot.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(errors(&v), Vec::<String>::new(), "{stem}");
    assert_eq!(v["kind"], kind, "{stem}");
    assert!(v["model"].as_str().is_some_and(|s| !s.is_empty()), "{stem}");
    let nodes = v["nodes"].as_array().unwrap();
    for n in nodes {
        for s in n["src"].as_array().unwrap() {
            assert!(s.as_u64().unwrap() < n["id"].as_u64().unwrap(), "{stem}: sources come first");
        }
    }
    let status = Command::new("dot").args(["-Tsvg", dot.to_str().unwrap(), "-o", svg.to_str().unwrap()]).status();
    let status = status.expect("Graphviz's dot is installed (scripts/test.sh installs the Debian package)");
    assert!(status.success(), "{stem}: dot -Tsvg failed");
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg"), "{stem}");
    assert_eq!(svg_text.matches("class=\"node\"").count(), nodes.len(), "{stem}: one SVG node per graph node");
    println!("{stem}: {} nodes, SVG of {} bytes", nodes.len(), svg_text.len());
}

#[test]
fn cli_exports_of_the_real_models_validate_and_render() {
    export_and_render(common::QWEN2_05B, "Hello there, how are you?", "prefill");
    export_and_render(common::QWEN2_05B, "Hi", "decode");
    export_and_render(common::QWEN3_TINY, "Hello there", "prefill");
}

/// The export is the graph the run executes: after evaluating a prompt, the engine's cached
/// graph exports to the same JSON as `preview_graph` (what `--dump-graph-json` writes), uid
/// aside; for a prefill and for a decode step.
#[test]
fn the_export_is_the_graph_the_run_executes() {
    use std::sync::Arc;
    for name in [common::QWEN2_05B, common::QWEN3_TINY] {
        let f = Arc::new(minfer::gguf::GgufFile::open(common::model_path(name)).unwrap());
        let model = Arc::new(minfer::models::load_model(f).unwrap());
        let p = minfer::generate::EngineParams { n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 64, n_threads: 2, ..Default::default() };
        let mut e = minfer::generate::Engine::new(model, &p).unwrap();
        for (tokens, kind) in [(&[1u32, 2, 3, 4, 5][..], "prefill"), (&[6u32][..], "decode")] {
            let (preview, pp) = e.preview_graph(tokens.len(), 1).unwrap();
            e.eval(tokens, 1).unwrap();
            let (live, lp) = e.live_graph().unwrap();
            let strip = |mut v: Value| {
                v["uid"] = Value::Null;
                v
            };
            let a = strip(preview.export_json(Some(&pp), Some("m")));
            let b = strip(live.export_json(Some(&lp), Some("m")));
            assert_eq!(a["kind"], kind);
            assert_eq!(a, b, "{name} {kind}: the preview differs from the executed graph");
        }
    }
}
