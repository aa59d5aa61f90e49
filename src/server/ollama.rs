//! Ollama's API, for the tools that speak it: `POST /api/chat`, `POST /api/generate`,
//! `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.
//!
//! - Requests: `model` (any name: one model is served), `messages` (chat) or `prompt` with
//!   `system` and `raw` (generate; not raw: the prompt is a user turn in the chat template),
//!   `stream` (default **true**, as Ollama's), `format` (`"json"` or a JSON schema: structured
//!   output), `options` (`temperature`, `top_k`, `top_p`, `min_p`, `seed`, `num_predict`, `stop`,
//!   `repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`, and `num_ctx`
//!   up to the slot's context), `keep_alive` (the model stays loaded either way). Anything else
//!   is a 400 naming it; images, tools, `think`, `suffix` and `context` are refused.
//! - Answers: `message` / `response`, `done`, `done_reason` (`stop`, `length`), the counts and
//!   durations in nanoseconds; a stream is one JSON object per line (`application/x-ndjson`),
//!   the last with `done: true`.
//! - Errors are Ollama's `{"error": "message"}` with the status of minfer's error.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json, json};

use super::error::{ApiError, bounded};
use super::fields::{Fields, kind_of, parse_object};
use super::openai::{admit, body_bytes, check_context, prepare_prompt, render_chat, submit_generation};
use super::request::{GenOptions, LogprobsStyle, gen_options};
use super::slot::{Event, Finished};
use super::state::{AppState, Loaded};
use super::stream::{FrameMaker, FrameStream, ShutSignal};
use crate::chat::ChatMessage;
use crate::generate::StopReason;

/// The Ollama version these routes follow (`/api/version`).
pub const OLLAMA_VERSION: &str = "0.6.3";

/// Ollama's error shape: `{"error": "message"}`, with minfer's status.
fn ollama_error(e: ApiError) -> Response {
    (e.status(), AxJson(json!({ "error": e.to_string() }))).into_response()
}

/// The top-level fields each endpoint reads.
const CHAT_FIELDS: &[&str] = &["model", "messages", "stream", "format", "options", "keep_alive"];
const GENERATE_FIELDS: &[&str] = &["model", "prompt", "system", "raw", "stream", "format", "options", "keep_alive"];
/// `options` minfer reads, and their OpenAI-side names.
const OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("num_predict", "n_predict"),
    ("stop", "stop"),
    ("repeat_penalty", "repeat_penalty"),
    ("repeat_last_n", "repeat_last_n"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
];

/// Is `name` one of the `options` minfer reads?
pub fn is_option(name: &str) -> bool {
    OPTIONS.iter().any(|(o, _)| *o == name)
}

/// What the official client sends for a field it was not given: null, `[]`, `""`.
fn empty(v: &Json) -> bool {
    match v {
        Json::Null => true,
        Json::Array(a) => a.is_empty(),
        Json::String(s) => s.is_empty(),
        Json::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Ollama's fields minfer does not implement, and why.
const NOT_YET: &[(&str, &str)] = &[
    ("images", ": images are not supported (the models minfer runs read text)"),
    ("tools", ": tools are not supported on /api/chat yet (use /v1/chat/completions)"),
    ("think", ": thinking settings are not supported"),
    ("suffix", ": use /infill for fill-in-the-middle"),
    ("context", ": send the conversation as messages (/api/chat) instead of a context"),
    ("template", ": the model's chat template (or --chat-template) is used"),
];

/// The sampling options and limits in OpenAI's terms, read by the shared reader.
fn options(body: &Map<String, Json>, m: &Loaded, st: &AppState) -> Result<GenOptions, ApiError> {
    let f = Fields::new(body);
    let mut b = Map::new();
    if let Some(o) = f.object("options")? {
        for (k, v) in o {
            if v.is_null() {
                continue;
            }
            if k == "num_ctx" {
                match v.as_u64() {
                    Some(n) if n as usize <= m.n_ctx_slot => continue,
                    _ => return Err(ApiError::param("options.num_ctx", format!("must be at most the server's context per slot, {} (--ctx / --slots)", m.n_ctx_slot))),
                }
            }
            let Some((_, name)) = OPTIONS.iter().find(|(o, _)| o == k) else {
                return Err(ApiError::Unsupported { field: format!("options.{}", bounded(k)), why: " (unknown or not implemented option)" });
            };
            b.insert(name.to_string(), v.clone());
        }
    }
    let stream = f.bool("stream")?.unwrap_or(true);
    b.insert("stream".into(), json!(stream));
    match f.get("format") {
        None => {}
        Some(Json::String(s)) if s == "json" => {
            b.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(s @ Json::Object(_)) => {
            b.insert("json_schema".into(), s.clone());
        }
        Some(v) => return Err(ApiError::param("format", format!("must be \"json\" or a JSON schema, got {}", kind_of(v)))),
    }
    let mut opts = gen_options(&Fields::new(&b), LogprobsStyle::Chat, m.n_vocab, &st.cfg.defaults)?;
    if let Some(rf) = super::structured::response_format(&Fields::new(&b))? {
        opts.structured = Some(rf);
    }
    Ok(opts)
}

/// The present in RFC 3339, UTC (Ollama's `created_at`).
fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

/// Unix time in RFC 3339, UTC.
fn rfc3339(secs: u64, nanos: u32) -> String {
    let secs = secs as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Which endpoint an answer is for.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Generate,
}

struct Answer {
    kind: Kind,
    model: String,
    started: std::time::Instant,
}

impl Answer {
    fn piece(&self, text: &str, done: Option<&Finished>) -> Json {
        let mut v = match self.kind {
            Kind::Chat => json!({"model": self.model, "created_at": now_rfc3339(), "message": {"role": "assistant", "content": text}, "done": done.is_some()}),
            Kind::Generate => json!({"model": self.model, "created_at": now_rfc3339(), "response": text, "done": done.is_some()}),
        };
        if let Some(f) = done {
            let ns = |s: f64| (s * 1e9) as u64;
            v["done_reason"] = json!(match f.reason {
                StopReason::EndOfGeneration | StopReason::StopString => "stop",
                StopReason::MaxTokens | StopReason::ContextFull => "length",
            });
            v["total_duration"] = json!(self.started.elapsed().as_nanos() as u64);
            v["load_duration"] = json!(0);
            v["prompt_eval_count"] = json!(f.prompt_tokens);
            v["prompt_eval_duration"] = json!(ns(f.prompt_secs));
            v["eval_count"] = json!(f.completion_tokens);
            v["eval_duration"] = json!(ns(f.gen_secs));
        }
        v
    }
}

pub async fn chat(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    serve(st, body, Kind::Chat).await.unwrap_or_else(ollama_error)
}

pub async fn generate(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    serve(st, body, Kind::Generate).await.unwrap_or_else(ollama_error)
}

/// Ollama's messages: `role` and `content` text (no images, no tool calls).
fn messages(v: Option<&Json>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Json::Array(items)) = v else { return Err(ApiError::param("messages", "is required: a list of {\"role\", \"content\"}")) };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Json::Object(o) = m else { return Err(ApiError::param(format!("messages[{i}]"), "must be an object")) };
            if let Some((k, _)) = o.iter().find(|(k, v)| !empty(v) && !["role", "content"].contains(&k.as_str())) {
                return Err(ApiError::param(format!("messages[{i}].{}", bounded(k)), "is not supported (role and content are)"));
            }
            let f = Fields::new(o);
            let role = match f.str("role")? {
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
                _ => return Err(ApiError::param(format!("messages[{i}].role"), "must be system, user, assistant or tool")),
            };
            Ok(ChatMessage::new(role, f.str("content")?.unwrap_or("")))
        })
        .collect()
}

async fn serve(st: Arc<AppState>, body: Result<Bytes, BytesRejection>, kind: Kind) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let (m, ticket) = admit(&st)?;
    let obj = parse_object(&body_bytes(body)?)?;
    super::request::refuse_unknown_in(&obj, &[if kind == Kind::Chat { CHAT_FIELDS } else { GENERATE_FIELDS }], NOT_YET, empty)?;
    let f = Fields::new(&obj);
    let model = f.str("model")?.ok_or_else(|| ApiError::param("model", "is required"))?.to_string();
    let opts = options(&obj, m, &st)?;
    let (msgs, raw) = match kind {
        Kind::Chat => (messages(f.get("messages"))?, None),
        Kind::Generate => {
            let prompt = f.str("prompt")?.unwrap_or("").to_string();
            if f.bool("raw")?.unwrap_or(false) {
                (Vec::new(), Some(prompt))
            } else {
                let mut v = Vec::new();
                if let Some(s) = f.str("system")? {
                    v.push(ChatMessage::system(s));
                }
                v.push(ChatMessage::new("user", prompt));
                (v, None)
            }
        }
    };
    let (ids, text, grammar) = prepare_prompt(&st, opts.structured.clone(), move |m| match raw {
        Some(t) => Ok(t),
        None => render_chat(m, &msgs, None, Map::new(), false),
    })
    .await?;
    if ids.is_empty() {
        return Err(ApiError::param("prompt", "must not be empty"));
    }
    check_context(m, ids.len(), &opts)?;
    let mut rx = submit_generation(&st, m, &ids, &text, &opts, grammar, ticket)?;
    let answer = Answer { kind, model, started };
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    let first = super::stream::first_event(&mut shut, &mut rx).await?;
    if opts.stream {
        let mut s = FrameStream::with(rx, shut, NdFrames { answer });
        s.push(first);
        return Ok(s.into_response_as("application/x-ndjson"));
    }
    let mut text = String::new();
    let mut ev = first;
    loop {
        match ev {
            // Generations get no replies (those answer embeddings and slot actions).
            Event::Progress(_) | Event::Reply(_) => {}
            Event::Token(t) => text.push_str(&t.text),
            Event::Done(f) => return Ok(AxJson(answer.piece(&text, Some(&f))).into_response()),
            Event::Failed(e) => return Err(e),
        }
        ev = super::stream::next_or_failed(&mut shut, &mut rx).await;
    }
}

/// A streamed answer's lines: one JSON object each.
struct NdFrames {
    answer: Answer,
}

impl FrameMaker for NdFrames {
    fn make(&mut self, ev: Event, out: &mut VecDeque<Bytes>) -> bool {
        let (v, ended) = match ev {
            Event::Progress(_) | Event::Reply(_) => return false,
            Event::Token(t) if t.text.is_empty() => return false,
            Event::Token(t) => (self.answer.piece(&t.text, None), false),
            Event::Done(f) => (self.answer.piece("", Some(&f)), true),
            Event::Failed(e) => (json!({ "error": e.to_string() }), true),
        };
        out.push_back(Bytes::from(format!("{v}\n")));
        ended
    }
}

fn details(m: &Loaded) -> Json {
    let f = &m.facts;
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": f.arch,
        "families": [f.arch],
        "parameter_size": format!("{:.1}M", f.n_params as f64 / 1e6),
        "quantization_level": f.quantization,
    })
}

fn model_entry(st: &AppState, m: &Loaded) -> Json {
    let modified = rfc3339(m.created, 0);
    json!({
        "name": m.model_id,
        "model": m.model_id,
        "modified_at": modified,
        "size": m.facts.file_size,
        "digest": "",
        "details": details(m),
        "path": st.cfg.model.display().to_string(),
    })
}

pub async fn tags(State(st): State<Arc<AppState>>) -> Response {
    match st.model() {
        Ok(m) => AxJson(json!({"models": [model_entry(&st, m)]})).into_response(),
        Err(e) => ollama_error(e),
    }
}

pub async fn ps(State(st): State<Arc<AppState>>) -> Response {
    match st.model() {
        Ok(m) => {
            let mut e = model_entry(&st, m);
            e["expires_at"] = json!("9999-12-31T23:59:59Z");
            e["size_vram"] = json!(0);
            AxJson(json!({"models": [e]})).into_response()
        }
        Err(e) => ollama_error(e),
    }
}

pub async fn show(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = (|| {
        let m = st.model()?;
        let obj = parse_object(&body_bytes(body)?)?;
        let f = Fields::new(&obj);
        let name = f.str("model")?.or(f.str("name")?).ok_or_else(|| ApiError::param("model", "is required"))?;
        if !m.answers_to(name) {
            return Err(ApiError::NotFound { method: "POST".into(), path: format!("/api/show (model '{}')", bounded(name)) });
        }
        Ok(json!({
            "modelfile": "",
            "parameters": "",
            "template": m.template.as_ref().map(|t| t.source().to_string()).unwrap_or_default(),
            "details": details(m),
            "model_info": {"general.architecture": m.facts.arch, "general.parameter_count": m.facts.n_params, format!("{}.context_length", m.facts.arch): m.n_ctx_slot},
            "capabilities": ["completion"],
        }))
    })();
    match r {
        Ok(v) => AxJson(v).into_response(),
        Err(e) => ollama_error(e),
    }
}

pub async fn version() -> AxJson<Json> {
    AxJson(json!({ "version": OLLAMA_VERSION }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_at_is_rfc3339() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 30, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[4] == b'-' && t.as_bytes()[10] == b'T', "{t}");
        let year: i32 = t[..4].parse().unwrap();
        assert!((2024..2200).contains(&year));
        // Hand-computed: 2000-03-01 is day 11017; a leap day; the epoch.
        assert_eq!(rfc3339(11_017 * 86_400 + 3_661, 5), "2000-03-01T01:01:01.000000005Z");
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
    }
}
