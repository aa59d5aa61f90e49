//! `minfer viz`'s routes in process, on the tiny Qwen3: the page and its assets, a run's
//! server-sent events in order and equal to the finished trace (which validates against the
//! schema), every bad request a JSON error naming what was wrong, one run at a time, saved
//! traces confined to their directory. The page itself is tested in a browser
//! (`tests/viz_browser.rs`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use minfer::viz::routes::router;
use minfer::viz::{VizConfig, VizState};
use serde_json::{Value, json};

fn config(trace_dir: Option<PathBuf>) -> VizConfig {
    VizConfig {
        model: common::model_path(common::QWEN3_TINY),
        host: "127.0.0.1".into(),
        port: 0,
        threads: 1,
        n_ctx: 128,
        backends: None,
        kv_type: Default::default(),
        max_values: 8,
        trace_dir,
        chat_template: None,
    }
}

fn serve(st: Arc<VizState>) -> u16 {
    common::serve_app(router(st))
}

fn send(port: u16, method: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Status, content type and body (JSON, or a JSON string when it is not JSON).
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, String, Value) {
    let mut resp = String::new();
    send(port, method, path, body).read_to_string(&mut resp).unwrap();
    let status: u16 = resp[9..12].parse().unwrap();
    let (head, body) = resp.split_at(resp.find("\r\n\r\n").unwrap() + 4);
    let ctype = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string)).unwrap_or_default();
    (status, ctype, serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string())))
}

fn error_message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_else(|| panic!("not an error body: {v}"))
}

/// Reads server-sent events until one named in `until`: `(event, data)` in order.
fn read_events(stream: &mut BufReader<TcpStream>, until: &[&str]) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut event = String::new();
    for line in stream.lines() {
        let line = line.unwrap();
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            events.push((event.clone(), serde_json::from_str(d).unwrap()));
            if until.contains(&event.as_str()) {
                break;
            }
        }
    }
    events
}

fn trace_validator() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/minfer-trace.schema.json");
    jsonschema::validator_for(&serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()).unwrap()
}

#[test]
fn a_run_streams_its_nodes_in_order_and_equals_the_finished_trace() {
    let st = VizState::load(config(None)).unwrap();
    let port = serve(st.clone());
    let (status, ctype, page) = request(port, "GET", "/", "");
    assert!(status == 200 && ctype.starts_with("text/html") && page.as_str().unwrap().contains("/viz/viz.js"));
    for (path, kind) in [("/viz/viz.js", "text/javascript"), ("/viz/viz.css", "text/css")] {
        let (status, ctype, _) = request(port, "GET", path, "");
        assert!(status == 200 && ctype.starts_with(kind), "{path}: {status} {ctype}");
    }
    assert_eq!(request(port, "GET", "/viz/trace", "").0, 404, "no trace before a run");

    let mut events = BufReader::new(send(port, "GET", "/viz/events", ""));
    // The stream is subscribed once `hello` arrived.
    let hello = read_events(&mut events, &["hello"]);
    assert_eq!(hello[0].1["model"], "minfer qwen3-tiny test model (random weights)", "{hello:?}");
    let (status, _, v) = request(port, "POST", "/viz/run", r#"{"prompt": "Hello there", "max_tokens": 4}"#);
    assert_eq!(status, 202, "{v}");
    let run = v["run"].clone();
    let evs = read_events(&mut events, &["done", "run_error"]);
    let names: Vec<&str> = evs.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names.last(), Some(&"done"), "{names:?}");
    assert!(evs.iter().skip_while(|(e, _)| e == "hello").all(|(_, d)| d["run"] == run), "every event names the run");
    // run, then per step: (phase when new) step, nodes, step_end; text as it comes.
    let order: Vec<&str> = names.iter().copied().filter(|e| !matches!(*e, "node" | "text" | "hello")).collect();
    assert_eq!(order, ["run", "phase", "step", "step_end", "phase", "step", "step_end", "step", "step_end", "step", "step_end", "done"]);
    let done = &evs.last().unwrap().1;
    assert_eq!(done["generated_ids"].as_array().unwrap().len(), 4);
    assert_eq!(done["stop"], "length");

    let (status, _, trace) = request(port, "GET", "/viz/trace", "");
    assert_eq!(status, 200);
    let errors: Vec<String> = trace_validator().iter_errors(&trace).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert_eq!(errors, Vec::<String>::new());
    // The streamed nodes are the trace's, step by step.
    let streamed: Vec<Value> = evs.iter().filter(|(e, _)| e == "node").map(|(_, d)| d["node"].clone()).collect();
    let saved: Vec<Value> = trace["phases"].as_array().unwrap().iter().flat_map(|p| p["steps"].as_array().unwrap().iter()).flat_map(|s| s["nodes"].as_array().unwrap().clone()).collect();
    assert_eq!(streamed, saved);
    let tops: Vec<Value> = evs.iter().filter(|(e, _)| e == "step_end").map(|(_, d)| d["logits_top"][0]["id"].clone()).collect();
    assert_eq!(tops, done["generated_ids"].as_array().unwrap().clone(), "greedy: each step's best logit is the next token");
    let (status, _, g) = request(port, "GET", "/viz/graph?n_tokens=3", "");
    assert_eq!((status, g["kind"].as_str(), g["params"]["n_tokens"].as_u64()), (200, Some("prefill"), Some(3)));
}

#[test]
fn bad_requests_are_json_errors_naming_the_problem() {
    let st = VizState::load(config(None)).unwrap();
    let port = serve(st.clone());
    for (body, says) in [
        ("{", "not valid JSON"),
        (r#"{"max_tokens": 3}"#, "\"prompt\" is required"),
        (r#"{"prompt": "a", "max_tokens": 9999}"#, "\"max_tokens\""),
        (r#"{"prompt": "a", "stream": true}"#, "unknown field \"stream\""),
        (&format!(r#"{{"prompt": "{}"}}"#, "word ".repeat(200)), "the context holds 128"),
    ] {
        let (status, ctype, v) = request(port, "POST", "/viz/run", body);
        assert_eq!((status, ctype.as_str()), (400, "application/json"), "{body}: {v}");
        assert!(error_message(&v).contains(says), "{body}: {v}");
    }
    for (path, status, says) in [
        ("/viz/graph?n_tokens=0", 400, "n_tokens must be from 1 to 128"),
        ("/viz/graph?layers=2", 400, "unknown parameter \"layers\""),
        ("/nowhere", 404, "no such route"),
        ("/viz/samples/x.json", 404, "no trace named"),
    ] {
        let (got, _, v) = request(port, "GET", path, "");
        assert_eq!(got, status, "{path}: {v}");
        assert!(error_message(&v).contains(says), "{path}: {v}");
    }
    // One run at a time: while one holds the engine, another is refused and /stop says so.
    let guard = st.try_start().unwrap();
    let (status, _, v) = request(port, "POST", "/viz/run", r#"{"prompt": "a"}"#);
    assert!(status == 409 && error_message(&v).contains("a run is in progress"), "{v}");
    assert_eq!(request(port, "GET", "/viz/graph", "").0, 409);
    assert_eq!(request(port, "POST", "/viz/stop", "").2, json!({"stopping": true}));
    assert_eq!(request(port, "GET", "/viz/info", "").2["busy"], true);
    // A page that connects now learns which run is going on.
    let hello = read_events(&mut BufReader::new(send(port, "GET", "/viz/events", "")), &["hello"]);
    assert_eq!((hello[0].1["busy"].clone(), hello[0].1["run"].clone()), (json!(true), json!(guard.id)));
    drop(guard);
    assert_eq!(request(port, "POST", "/viz/stop", "").2, json!({"stopping": false}));
    let (status, _, v) = request(port, "POST", "/viz/run", r#"{"prompt": "a", "max_tokens": 1}"#);
    assert_eq!(status, 202, "the engine is free again: {v}");
}

#[test]
fn saved_traces_are_listed_and_confined_to_their_directory() {
    let dir = std::env::temp_dir().join(format!("minfer-viz-samples-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("b.json"), r#"{"format": "minfer-trace", "version": 1, "phases": []}"#).unwrap();
    std::fs::write(dir.join("a.json"), r#"{"format": "minfer-graph"}"#).unwrap();
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    std::fs::write(dir.join("sub/c.json"), "{}").unwrap();
    let outside = dir.parent().unwrap().join(format!("minfer-viz-outside-{}.json", std::process::id()));
    std::fs::write(&outside, r#"{"format": "minfer-trace"}"#).unwrap();
    let st = VizState::load(config(Some(dir.clone()))).unwrap();
    let port = serve(st);
    let (_, _, v) = request(port, "GET", "/viz/samples", "");
    assert_eq!(v["traces"], json!(["a.json", "b.json"]));
    assert_eq!(request(port, "GET", "/viz/samples/b.json", "").2["format"], "minfer-trace");
    let (status, _, v) = request(port, "GET", "/viz/samples/a.json", "");
    assert!(status == 422 && error_message(&v).contains("not a minfer-trace"), "{v}");
    let escape = format!("/viz/samples/..%2F{}", outside.file_name().unwrap().to_str().unwrap());
    for path in [escape.as_str(), "/viz/samples/sub%2Fc.json", "/viz/samples/notes.txt"] {
        let (status, _, v) = request(port, "GET", path, "");
        assert!(status == 404 && error_message(&v).contains("no trace named"), "{path}: the samples route refuses it: {v}");
    }
    let _ = std::fs::remove_file(outside);
}

#[test]
fn startup_errors_are_one_line_and_a_nonzero_exit() {
    let tiny = common::model_path(common::QWEN3_TINY);
    for (args, says) in [
        (vec!["viz", "-m", "/nonexistent/m.gguf"], "cannot load /nonexistent/m.gguf"),
        (vec!["viz", "-m", tiny.to_str().unwrap(), "--trace-dir", "/nonexistent-dir"], "--trace-dir /nonexistent-dir: not a directory"),
        (vec!["viz", "-m", tiny.to_str().unwrap(), "--values", "0"], "--values"),
        (vec!["viz", "-m", tiny.to_str().unwrap(), "--values", "4097"], "--values"),
        (vec!["viz", "-m", tiny.to_str().unwrap(), "--host", "256.0.0.1"], "cannot listen on 256.0.0.1"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer")).args(&args).env_remove("MINFER_TRACE").env_remove("MINFER_TRACE_VALUES").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("minfer: "), "{args:?}: {err}");
    }
}
