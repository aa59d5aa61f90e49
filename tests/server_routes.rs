//! The server's routes in process, before and after the model loads: `/health` is 503 while
//! loading, every error is in the OpenAI shape, the API key is checked before anything else;
//! and `minfer serve`'s startup errors are one line with a non-zero exit.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;

use minfer::server::routes::router;
use minfer::server::{AppState, ServeConfig};
use serde_json::Value as Json;

fn config(api_key: Option<&str>) -> ServeConfig {
    ServeConfig {
        model: common::model_path(common::QWEN3_TINY),
        host: "127.0.0.1".into(),
        port: 0,
        slots: 2,
        batch: true,
        ctx_total: Some(512),
        threads: 1,
        queue: 4,
        api_key: api_key.map(str::to_string),
        timeout_secs: 0,
        alias: None,
        ubatch: 512,
        backends: None,
        inject_panic: None,
        kv_type: Default::default(),
        draft: None,
        read_timeout_secs: 10,
        idle_timeout_secs: 60,
        max_connections: 64,
        drain_timeout_secs: 30,
        chat_template: None,
        tags: Vec::new(),
        defaults: Default::default(),
        cors: minfer::server::cors::CorsOrigins::parse("*").unwrap(),
        metrics_endpoint: true,
        slots_endpoint: true,
        ui: true,
        pooling: None,
        slot_save_path: None,
    }
}

fn serve(st: Arc<AppState>) -> u16 {
    common::serve_app(router(st))
}

/// One HTTP/1.1 request; returns the status and the body as JSON (or a JSON string).
fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Json) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status: u16 = resp[9..12].parse().unwrap();
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    (status, serde_json::from_str(body).unwrap_or_else(|_| Json::String(body.to_string())))
}

fn error_type(v: &Json) -> &str {
    let e = &v["error"];
    assert!(e["message"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{v}");
    e["type"].as_str().unwrap()
}

#[test]
fn health_is_503_until_the_model_loads_then_200() {
    let st = AppState::new(config(None));
    let port = serve(st.clone());
    let (status, v) = request(port, "GET", "/health", &[], "");
    assert_eq!((status, error_type(&v)), (503, "unavailable_error"));
    let body = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
    let (status, v) = request(port, "POST", "/v1/chat/completions", &[], body);
    assert_eq!((status, error_type(&v)), (503, "unavailable_error"));
    assert_eq!(request(port, "GET", "/v1/models", &[], "").0, 503);

    st.load(st.open_model().unwrap()).unwrap();
    assert_eq!(request(port, "GET", "/health", &[], ""), (200, serde_json::json!({"status": "ok"})));
    let (status, v) = request(port, "GET", "/v1/models", &[], "");
    assert_eq!(status, 200);
    assert_eq!(v["data"][0]["id"], "qwen3-tiny");
    assert_eq!(v["data"][0]["meta"]["n_ctx_slot"], 256);
    // a token-id prompt on the random-weight model: the usage counts are exact
    let (status, v) = request(port, "POST", "/v1/completions", &[], r#"{"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
    let m = request(port, "GET", "/metrics", &[], "").1;
    let text = m.as_str().unwrap();
    assert!(text.contains("minfer_requests_total{status=\"503\"} 2"), "{text}");
    assert!(text.contains("minfer_requests_total{status=\"200\"} 2"), "{text}");
    assert!(text.contains("minfer_prompt_tokens_total 3\n"), "{text}");
}

#[test]
fn api_key_comes_first_and_errors_have_the_openai_shape() {
    let st = AppState::new(config(Some("s3cret")));
    let port = serve(st.clone());
    // 401 before 503: a client without the key learns nothing else
    let (status, v) = request(port, "GET", "/v1/models", &[], "");
    assert_eq!((status, error_type(&v)), (401, "authentication_error"));
    let (status, _) = request(port, "GET", "/v1/models", &[("Authorization", "Bearer s3cre")], "");
    assert_eq!(status, 401);
    let (status, _) = request(port, "GET", "/v1/models", &[("Authorization", "Bearer s3cret")], "");
    assert_eq!(status, 503);
    // /health and /metrics need no key
    assert_eq!(request(port, "GET", "/health", &[], "").0, 503);
    assert_eq!(request(port, "GET", "/metrics", &[], "").0, 200);
    let (status, v) = request(port, "GET", "/nowhere", &[], "");
    assert_eq!((status, error_type(&v)), (404, "not_found_error"));
    let (status, v) = request(port, "DELETE", "/health", &[], "");
    assert_eq!((status, error_type(&v)), (405, "invalid_request_error"));
    st.load(st.open_model().unwrap()).unwrap();
    let auth = [("Authorization", "Bearer s3cret")];
    let (status, v) = request(port, "POST", "/v1/chat/completions", &auth, "{\"messages\": ");
    assert_eq!((status, error_type(&v)), (400, "invalid_request_error"));
    let big = format!(r#"{{"prompt": "x", "max_tokens": "{}"}}"#, "9".repeat(50_000));
    let (status, v) = request(port, "POST", "/v1/completions", &auth, &big);
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("max_tokens")));
    assert!(v.to_string().len() < 400, "{v}");
    let (status, v) = request(port, "POST", "/detokenize", &auth, r#"{"tokens": [1, 99999999]}"#);
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("tokens[1]")));
}

#[test]
fn startup_errors_are_one_line_and_non_zero() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_minfer")).arg("serve").args(args).output().unwrap();
    let dir = std::env::temp_dir().join(format!("minfer-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    let tiny = common::model_path(common::QWEN3_TINY);
    let missing = dir.join("missing.gguf");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port().to_string();
    let cases: [(&[&str], &str); 6] = [
        (&["-m", missing.to_str().unwrap()], "missing.gguf"),
        (&["-m", tiny.to_str().unwrap(), "--draft", missing.to_str().unwrap()], "missing.gguf"),
        (&["-m", tiny.to_str().unwrap(), "--draft", tiny.to_str().unwrap(), "--draft-n", "0"], "--draft-n must be at least 1"),
        (&["-m", bad.to_str().unwrap()], "not a GGUF file"),
        (&["-m", tiny.to_str().unwrap(), "--slots", "4", "--ctx", "3"], "--ctx"),
        (&["-m", tiny.to_str().unwrap(), "--port", &busy_port], "cannot listen"),
    ];
    for (args, what) in cases {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A server with a draft model answers greedy requests exactly as one without (token ids
/// through `/v1/completions`, streamed and not), and counts the drafts in `/metrics`. The
/// random-weight Qwen3 fixture drafts for the 0.5B (same vocabulary), so most drafts are
/// rejected and both paths of a round are taken.
#[test]
fn speculative_slots_answer_as_plain_slots() {
    let target = common::model_path(common::QWEN2_05B);
    let tiny = common::model_path(common::QWEN3_TINY);
    let cfg = |draft: bool| ServeConfig {
        model: target.clone(),
        draft: draft.then(|| (tiny.clone(), minfer::generate::DraftParams { n_draft: 4, p_min: 0.0 })),
        threads: 2,
        ..config(None)
    };
    let (plain, spec) = (AppState::new(cfg(false)), AppState::new(cfg(true)));
    let (pp, sp) = (serve(plain.clone()), serve(spec.clone()));
    plain.load(plain.open_model().unwrap()).unwrap();
    spec.load(spec.open_model().unwrap()).unwrap();
    // "def fibonacci(n):" and "1, 2, 3, 4, 5," as token ids
    for prompt in ["[750, 75698, 1445, 1648]", "[16, 11, 220, 17, 11, 220, 18, 11, 220, 19, 11, 220, 20, 11]"] {
        let body = format!(r#"{{"prompt": {prompt}, "max_tokens": 24, "temperature": 0}}"#);
        let (s1, a) = request(pp, "POST", "/v1/completions", &[], &body);
        let (s2, b) = request(sp, "POST", "/v1/completions", &[], &body);
        assert_eq!((s1, s2), (200, 200), "{a} {b}");
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{prompt}");
        assert_eq!(a["usage"], b["usage"], "{prompt}");
        assert_eq!(a["choices"][0]["finish_reason"], b["choices"][0]["finish_reason"]);
        let stream = format!(r#"{{"prompt": {prompt}, "max_tokens": 24, "temperature": 0, "stream": true}}"#);
        let (s3, events) = request(sp, "POST", "/v1/completions", &[], &stream);
        assert_eq!(s3, 200);
        let text: String = events
            .as_str()
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<Json>(d).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(Json::String(text), a["choices"][0]["text"], "{prompt} streamed");
    }
    let metric = |st: u16, name: &str| -> u64 {
        let m = request(st, "GET", "/metrics", &[], "").1;
        let line = m.as_str().unwrap().lines().find(|l| l.starts_with(name)).unwrap().to_string();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (drafted, accepted) = (metric(sp, "minfer_draft_tokens_total"), metric(sp, "minfer_draft_accepted_total"));
    println!("drafted {drafted}, accepted {accepted}");
    assert!(drafted > 0 && accepted < drafted, "{drafted} {accepted}");
    assert_eq!(metric(pp, "minfer_draft_tokens_total"), 0);
    assert_eq!(metric(sp, "minfer_generated_tokens_total"), metric(pp, "minfer_generated_tokens_total") * 2);
}
