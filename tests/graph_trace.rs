//! Per-node traces (`MINFER_TRACE`): capture changes no output (logits bit-identical with and
//! without it), what is captured agrees with values computed here independently, and the CLI's
//! trace file validates against `docs/minfer-trace.schema.json` (its graphs against
//! `docs/minfer-graph.schema.json`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use minfer::generate::{Engine, EngineParams, TraceRecorder, argmax};
use minfer::graph::Op;
use serde_json::Value;

fn validator(file: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(file);
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).expect("the schema compiles")
}

fn errors(validator: &jsonschema::Validator, v: &Value) -> Vec<String> {
    validator.iter_errors(v).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

fn engine(name: &str) -> Engine {
    let f = Arc::new(minfer::gguf::GgufFile::open(common::model_path(name)).unwrap());
    let model = Arc::new(minfer::models::load_model(f).unwrap());
    let p = EngineParams { n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 64, n_threads: 2, ..Default::default() };
    Engine::new(model, &p).unwrap()
}

/// A prompt in two chunks (two prefill phases) and four greedy decode steps; the logits of
/// every evaluation.
fn run(e: &mut Engine, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut all = vec![e.eval(&prompt[..5], 1).unwrap(), e.eval(&prompt[5..], 1).unwrap()];
    for _ in 0..4 {
        let next = argmax(all.last().unwrap()).unwrap();
        all.push(e.eval(&[next], 1).unwrap());
    }
    all
}

#[test]
fn trace_capture_leaves_the_logits_bit_identical() {
    let prompt = [9707u32, 11, 1879, 0, 374, 264, 1273, 13];
    for name in [common::QWEN2_05B, common::QWEN3_TINY] {
        let mut plain = engine(name);
        let mut traced = engine(name);
        traced.set_tracer(Some(TraceRecorder::new(16)));
        let (a, b) = (run(&mut plain, &prompt), run(&mut traced, &prompt));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(bits(x) == bits(y), "{name}: evaluation {i}: logits differ with the trace on");
        }
        let rec = traced.take_tracer().unwrap();
        let kinds: Vec<(&str, usize)> = rec.phases().iter().map(|p| (p.kind(), p.steps.len())).collect();
        assert_eq!(kinds, [("prefill", 1), ("prefill", 1), ("decode", 4)], "{name}: prompt chunks of 5 and 3 tokens (two graphs), then decode");
        let (graph, _) = traced.live_graph().unwrap();
        let steps = rec.phases().iter().flat_map(|p| p.steps.iter().map(move |s| (p, s)));
        for ((phase, step), logits) in steps.zip(&b) {
            let nodes = phase.graph["nodes"].as_array().unwrap();
            for t in &step.nodes {
                let op = nodes[t.id]["op"].as_str().unwrap();
                assert!(op != "kv_store" && op != "kv_load", "{name}: KV regions are not captured");
                assert!(t.values.len() <= 16 && t.stride * t.values.len() >= t.n && t.stride * (t.values.len() - 1) < t.n);
            }
            // The token-id input holds the evaluated tokens.
            let ids = step.nodes.iter().find(|t| nodes[t.id]["name"] == "token_ids").expect("the input is captured");
            let want: Vec<f32> = step.input.iter().map(|&t| t as f32).collect();
            assert_eq!(ids.values, want, "{name}");
            // The output node's capture agrees with the logits the engine returned, computed
            // here by plain folds.
            let logits_id = phase.graph["outputs"][0].as_u64().unwrap() as usize;
            let out = step.nodes.iter().find(|t| t.id == logits_id).expect("the logits are captured");
            let (min, max) = logits.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let mean = logits.iter().map(|&v| v as f64).sum::<f64>() / logits.len() as f64;
            assert_eq!((out.stats.min, out.stats.max, out.n), (Some(min), Some(max), logits.len()), "{name}");
            assert!((out.stats.mean - mean).abs() <= 1e-9 * mean.abs().max(1.0), "{name}");
            assert_eq!(out.values[1], logits[out.stride], "{name}: samples are every stride-th value");
            let best = logits.iter().cloned().fold(f32::MIN, f32::max);
            assert_eq!(step.logits_top[0].1, best, "{name}");
            assert_eq!(Some(step.logits_top[0].0), argmax(logits), "{name}");
        }
        // Every live node but the KV regions (inputs included) has data in a decode step.
        let decode = rec.phases().last().unwrap();
        let live_computed = graph
            .nodes
            .iter()
            .filter(|n| decode.graph["nodes"][n.id]["live"] == true)
            .filter(|n| !matches!(n.op, Op::KvcacheLoad { .. } | Op::KvcacheStore { .. }))
            .count();
        assert_eq!(decode.steps[0].nodes.len(), live_computed, "{name}: every other live node is captured");
    }
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minfer-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn minfer_traced(trace: &Path, values: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
    c.env("MINFER_TRACE", trace).env_remove("MINFER_TRACE_VALUES");
    if let Some(v) = values {
        c.env("MINFER_TRACE_VALUES", v);
    }
    c.args(args).output().unwrap()
}

/// A 5-token run's trace validates against the schemas; one prefill step and four decode steps
/// whose tokens are the generated ones.
#[test]
fn cli_trace_of_a_5_token_run_validates() {
    let (trace_v, graph_v) = (validator("minfer-trace.schema.json"), validator("minfer-graph.schema.json"));
    for name in [common::QWEN2_05B, common::QWEN3_TINY] {
        let path = tmp(&format!("{name}.trace.json"));
        let m = common::model_path(name);
        let args = ["run", "-m", m.to_str().unwrap(), "--raw", "-p", "Write a haiku about Rust.", "-n", "5", "--temp", "0", "--json"];
        let out = minfer_traced(&path, Some("32"), &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(errors(&trace_v, &v), Vec::<String>::new(), "{name}");
        for p in v["phases"].as_array().unwrap() {
            assert_eq!(errors(&graph_v, &p["graph"]), Vec::<String>::new(), "{name}: a phase's graph");
            assert_eq!(p["graph"]["kind"], p["kind"]);
        }
        assert_eq!(v["max_values"], 32);
        let steps: Vec<&Value> = v["phases"].as_array().unwrap().iter().flat_map(|p| p["steps"].as_array().unwrap()).collect();
        assert_eq!(steps.len(), 5, "{name}: a prefill and four decode steps");
        let generated: Vec<u64> = run["generated_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        // Step k>0 evaluates generated token k-1; every step's best logit is the next token.
        for (k, s) in steps.iter().enumerate() {
            if k > 0 {
                assert_eq!(s["input"], Value::from(vec![generated[k - 1]]), "{name}: step {k}");
            }
            if let Some(&g) = generated.get(k) {
                assert_eq!(s["logits_top"][0]["id"], g, "{name}: step {k} predicts the generated token");
            }
        }
        assert_eq!(steps[0]["input"], run["prompt_ids"], "{name}");
        println!("{name}: trace of {} bytes", std::fs::metadata(&path).unwrap().len());
    }
}

#[test]
fn bad_trace_settings_are_one_line_errors() {
    let m = common::model_path(common::QWEN3_TINY);
    let args = ["run", "-m", m.to_str().unwrap(), "-p", "Hi", "-n", "2"];
    let out = minfer_traced(&tmp("never.json"), Some("zero"), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("MINFER_TRACE_VALUES"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = minfer_traced(Path::new("/nonexistent-dir/t.json"), None, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot write trace /nonexistent-dir/t.json"), "{err}");
}
