//! Hostile chat templates: `tokenizer.chat_template` comes from the model file, so a file can
//! carry a template that loops forever, grows a string exponentially, recurses without end,
//! asks for a huge range or repetition, or nests its source past any parser's stack. Each must
//! stop with a [`TemplateError::LimitExceeded`] naming the limit (fuel, recursion or size) in
//! under a second, with the limits the server uses ([`ChatTemplate::new`]'s defaults); and a
//! server whose model carries one answers the chat request with a one-line 4xx in the OpenAI
//! error shape, in under a second, and goes on serving.
//!
//! Each case prints one line (`template-case NAME MS KIND`) for docs/RELIABILITY.md.

mod common;
#[path = "reliability/http.rs"]
mod http;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use minfer::chat::{ChatMessage, ChatTemplate, Limit, RenderOptions, TemplateError};
use minfer::gguf::GgufFile;
use serde_json::Value as Json;

/// The bound every case must meet.
const DEADLINE: Duration = Duration::from_secs(1);

/// How a case must end.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Stopped by this limit.
    Stop(Limit),
    /// Harmless after all: renders this text.
    Renders(&'static str),
}

use Expect::{Renders, Stop};

/// `(name, template source, how it must end)`.
fn cases() -> Vec<(&'static str, String, Expect)> {
    let deep = 100_000;
    vec![
        // MiniJinja refuses ranges over 100 000 items up front.
        ("infinite-loop", "{% for i in range(10**9) %}x{% endfor %}".into(), Stop(Limit::Size)),
        // Within the range cap, 10^10 iterations: only the fuel stops them.
        (
            "nested-loops",
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}".into(),
            Stop(Limit::Fuel),
        ),
        (
            "nested-loops-3-silent",
            "{% for i in range(99999) %}{% for j in range(99999) %}{% for k in range(99999) %}{% endfor %}{% endfor %}{% endfor %}"
                .into(),
            Stop(Limit::Fuel),
        ),
        // As in Jinja2, a `set` in a loop body does not carry over to the next iteration: this
        // doubles the outer 'a' 64 times and throws each result away.
        (
            "exponential-string",
            "{% set s = 'a' %}{% for i in range(64) %}{% set s = s ~ s %}{% endfor %}{{ s }}".into(),
            Renders("a"),
        ),
        // What the above means to do, through a namespace (which does carry over) ...
        (
            "exponential-string-namespace",
            "{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}".into(),
            Stop(Limit::Fuel),
        ),
        // ... and through macro arguments (depth 64 is within the recursion limit).
        (
            "exponential-string-macro",
            "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% else %}{{ s }}{% endif %}{% endmacro %}{{ f('a', 64) }}".into(),
            Stop(Limit::Fuel),
        ),
        ("recursive-macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into(), Stop(Limit::Recursion)),
        (
            "mutually-recursive-macros",
            "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n + 1) }}{% endmacro %}{{ a(0) }}".into(),
            Stop(Limit::Recursion),
        ),
        // Depth 60 is within the recursion limit; 2^60 calls are not within the fuel.
        (
            "binary-tree-macro",
            "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}".into(),
            Stop(Limit::Fuel),
        ),
        (
            "recursive-loop",
            "{% for m in [messages] recursive %}{{ loop([m]) }}{% endfor %}".into(),
            Stop(Limit::Recursion),
        ),
        ("huge-range", "{{ range(10**12) | length }}".into(), Stop(Limit::Size)),
        ("huge-range-step", "{% for i in range(0, 10**18, 3) %}{% endfor %}".into(), Stop(Limit::Size)),
        // The result's size is charged against the fuel before the repeat allocates, which stops
        // this before MiniJinja's own cap (10^8 bytes) is looked at.
        ("huge-string-repeat", "{{ 'x' * 10**12 }}".into(), Stop(Limit::Fuel)),
        ("large-string-repeat", "{{ 'x' * 10**8 }}".into(), Stop(Limit::Fuel)),
        ("huge-list-repeat", "{{ [1, 2] * 10**12 }}".into(), Stop(Limit::Size)),
        // Repeated lists are lazy: iterating them costs fuel item by item.
        ("large-list-repeat-joined", "{{ ([1, 2] * 10**7) | join(',') }}".into(), Stop(Limit::Fuel)),
        ("huge-indent", "{{ 'a\nb' | indent(10**12) }}".into(), Stop(Limit::Fuel)),
        ("huge-format-width", "{{ '{:>10000000000}'.format('x') }}".into(), Stop(Limit::Fuel)),
        // MiniJinja's parser refuses to nest deeper than 150 levels.
        ("deep-if-source", format!("{}x{}", "{% if true %}".repeat(deep), "{% endif %}".repeat(deep)), Stop(Limit::Recursion)),
        ("deep-paren-source", format!("{{{{ {}1{} }}}}", "(".repeat(deep), ")".repeat(deep)), Stop(Limit::Recursion)),
        ("deep-list-source", format!("{{{{ {}{} }}}}", "[".repeat(deep), "]".repeat(deep)), Stop(Limit::Recursion)),
    ]
}

fn conversation() -> Vec<ChatMessage> {
    vec![ChatMessage::system("You are helpful."), ChatMessage::user("Hello!")]
}

/// Compiles and renders `source` as the server does; returns the outcome and the time taken.
fn compile_and_render(source: &str) -> (Result<String, TemplateError>, Duration) {
    let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let start = Instant::now();
    let out = ChatTemplate::new("tokenizer.chat_template", source).and_then(|t| t.render(&conversation(), &opts));
    (out, start.elapsed())
}

#[test]
fn hostile_templates_stop_at_a_named_limit_within_a_second() {
    let mut failures = Vec::new();
    for (name, source, want) in cases() {
        let (out, took) = compile_and_render(&source);
        let ms = took.as_secs_f64() * 1e3;
        let got = match &out {
            Err(e @ TemplateError::LimitExceeded { limit, template, .. }) => {
                println!("template-case {name:<30} {ms:>8.1} ms  {limit:<9} {e}");
                assert_eq!(template, "tokenizer.chat_template");
                assert!(e.to_string().contains(&format!("{limit} limit exceeded")), "{e}");
                Some(Stop(*limit))
            }
            Ok(text) => {
                println!("template-case {name:<30} {ms:>8.1} ms  renders   {} bytes", text.len());
                matches!(want, Renders(t) if t == text).then_some(want)
            }
            Err(e) => {
                println!("template-case {name:<30} {ms:>8.1} ms  OTHER     {e}");
                None
            }
        };
        if got != Some(want) {
            let out = out.map(|t| t.chars().take(80).collect::<String>());
            failures.push(format!("{name}: expected {want:?}, got {out:?}"));
        }
        if took >= DEADLINE {
            failures.push(format!("{name}: took {ms:.0} ms"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The limits leave room for real templates: the tiny model's own (Qwen's) template renders a
/// 200-message conversation with tools.
#[test]
fn a_real_template_still_renders_under_the_same_limits() {
    let f = GgufFile::open(common::model_path(common::QWEN3_TINY)).unwrap();
    let t = ChatTemplate::new("tokenizer.chat_template", f.get_str("tokenizer.chat_template").unwrap()).unwrap();
    let mut messages = vec![ChatMessage::system("You are helpful.")];
    for i in 0..100 {
        messages.push(ChatMessage::user(format!("question {i}")));
        messages.push(ChatMessage::assistant(format!("answer {i}")));
    }
    let tools = serde_json::json!([{"type": "function", "function": {"name": "w", "description": "weather", "parameters": {"type": "object"}}}]);
    let opts = RenderOptions { add_generation_prompt: true, tools: Some(tools), ..RenderOptions::default() };
    let start = Instant::now();
    let text = t.render(&messages, &opts).unwrap();
    println!("real template, 201 messages: {} bytes in {:.1} ms", text.len(), start.elapsed().as_secs_f64() * 1e3);
    assert!(text.contains("question 99") && text.contains("answer 99") && text.contains("\"name\": \"w\""), "{text}");
}

/// A copy of `model` whose `tokenizer.chat_template` is `template`, written to `out`. The new
/// value is padded with trailing spaces so that the header grows by a multiple of the
/// alignment: the tensor data then moves by whole alignment units and its offsets stay valid.
fn with_template(model: &Path, template: &str, out: &Path) {
    let bytes = std::fs::read(model).unwrap();
    let f = GgufFile::open(model).unwrap();
    let old = f.get_str("tokenizer.chat_template").unwrap();
    let key = b"tokenizer.chat_template";
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key);
    needle.extend_from_slice(&8u32.to_le_bytes()); // GGUF string type
    needle.extend_from_slice(&(old.len() as u64).to_le_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("the template key in the header") + needle.len();
    assert_eq!(&bytes[at..at + old.len()], old.as_bytes());
    let align = f.alignment() as i64;
    let mut new = template.to_string();
    while (new.len() as i64 - old.len() as i64).rem_euclid(align) != 0 {
        new.push(' ');
    }
    let mut v = bytes[..at - 8].to_vec();
    v.extend_from_slice(&(new.len() as u64).to_le_bytes());
    v.extend_from_slice(new.as_bytes());
    v.extend_from_slice(&bytes[at + old.len()..]);
    std::fs::write(out, &v).unwrap();

    let g = GgufFile::open(out).unwrap();
    assert_eq!(g.get_str("tokenizer.chat_template").unwrap(), new);
    assert_eq!(g.data_offset() as i64 - f.data_offset() as i64, new.len() as i64 - old.len() as i64);
    assert_eq!(g.tensors().len(), f.tensors().len());
    for (a, b) in f.tensors().iter().zip(g.tensors()) {
        assert_eq!(f.tensor_data(a).unwrap(), g.tensor_data(b).unwrap(), "{}", a.name);
    }
}

/// One request; the status and the body as JSON.
fn request(port: u16, method: &str, path: &str, body: &str) -> (u16, Json) {
    let r = http::request(port, method, path, &[("Content-Type", "application/json")], body.as_bytes(), Duration::from_secs(30)).unwrap();
    (r.status, r.json())
}

#[test]
fn a_server_whose_model_has_a_hostile_template_refuses_chat_quickly_and_keeps_serving() {
    let dir = std::env::temp_dir().join(format!("minfer-hostile-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model: PathBuf = dir.join("qwen3-tiny-hostile.gguf");
    let (name, source, _) = cases().into_iter().find(|c| c.0 == "nested-loops").unwrap();
    with_template(&common::model_path(common::QWEN3_TINY), &source, &model);
    let server = http::Server::start(&model, &["-t", "1", "--slots", "1", "--ctx", "512"]);
    let chat = r#"{"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello!"}], "max_tokens": 4}"#;
    for attempt in 0..2 {
        let start = Instant::now();
        let (status, v) = request(server.port, "POST", "/v1/chat/completions", chat);
        let took = start.elapsed();
        let e = &v["error"];
        let message = e["message"].as_str().unwrap_or_default();
        println!("server-case {name} (request {attempt}): HTTP {status} in {:.1} ms: {message}", took.as_secs_f64() * 1e3);
        assert!((400..500).contains(&status), "{status}: {v}");
        assert_eq!(e["type"], "invalid_request_error", "{v}");
        assert_eq!(e["param"], "messages", "{v}");
        assert!(e.get("code").is_some(), "{v}");
        assert!(message.contains("fuel limit exceeded") && !message.contains('\n'), "{message:?}");
        assert!(took < DEADLINE, "the refusal took {took:?}");
    }
    assert_eq!(request(server.port, "GET", "/health", ""), (200, serde_json::json!({"status": "ok"})));
    let (status, v) = request(server.port, "POST", "/v1/completions", r#"{"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 3, "{v}");
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    drop(server);
    std::fs::remove_dir_all(dir).ok();
}
