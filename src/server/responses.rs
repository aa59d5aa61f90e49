//! OpenAI's Responses API: `POST /v1/responses` (and `/responses`, llama-server's alias).
//!
//! - Input: `input` as text (one user message) or a list of messages (`role` and `content`,
//!   the content text or `input_text` / `output_text` parts), `instructions` (a system message
//!   first), `max_output_tokens`, the sampling fields, `text.format` (structured output:
//!   `text`, `json_object`, `json_schema`), `stream`.
//! - `previous_response_id` continues a conversation: every answered response's messages are
//!   kept in memory ([`ResponseStore`]: an hour, the 1024 newest), and a request naming one
//!   starts from them (its `instructions` are not carried over, as OpenAI does). An unknown or
//!   expired id is a 400 naming the field.
//! - Output: one `message` item with one `output_text` part; `status` `completed`, or
//!   `incomplete` with `incomplete_details.reason` `max_output_tokens` when the limit cut it.
//! - A stream is OpenAI's typed events (`event:` and `data:` lines, each with a
//!   `sequence_number`): `response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`…,
//!   `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
//!   `response.completed`; no `[DONE]`.
//!
//! Tools, reasoning items, files and images are refused by name.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
use super::response::{timings, unique_id};
use super::slot::{Event, Finished, Usage};
use super::state::{AppState, unix_now};
use super::stream::{FrameMaker, FrameStream, ShutSignal};
use crate::chat::ChatMessage;
use crate::generate::StopReason;

/// How long a response's conversation is kept for `previous_response_id`, and how many at most.
pub const KEEP: Duration = Duration::from_secs(3600);
pub const KEEP_MAX: usize = 1024;

/// A kept conversation: when it was kept, and its messages.
type Kept = (Instant, Arc<Vec<ChatMessage>>);

/// The conversations of recent responses, by response id (and their ids oldest first).
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<(HashMap<String, Kept>, VecDeque<String>)>,
}

impl ResponseStore {
    pub fn put(&self, id: String, messages: Vec<ChatMessage>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        map.insert(id.clone(), (Instant::now(), Arc::new(messages)));
        order.push_back(id);
        while order.len() > KEEP_MAX {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Vec<ChatMessage>>> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(id).filter(|(at, _)| at.elapsed() < KEEP).map(|(_, m)| m.clone())
    }
}

/// The fields a Responses request may hold. `store`, `metadata`, `user` and `truncation`
/// (`disabled`) are taken with nothing to do; the rest are read.
const FIELDS: &[&str] = &[
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stream",
    "previous_response_id", "text", "store", "metadata", "user", "truncation", "stop", "repeat_penalty",
    "presence_penalty", "frequency_penalty", "timings_per_token", "cache_prompt", "return_progress",
];

/// Fields of OpenAI's Responses API minfer does not implement yet, and why.
const NOT_YET: &[(&str, &str)] = &[
    ("tools", TOOLS_NOT_YET),
    ("tool_choice", TOOLS_NOT_YET),
    ("parallel_tool_calls", TOOLS_NOT_YET),
    ("reasoning", ": reasoning settings are not supported"),
];
const TOOLS_NOT_YET: &str = ": tools are not supported on /v1/responses yet (use /v1/chat/completions)";

struct ResponsesRequest {
    /// The whole conversation (the previous response's, then this request's input).
    messages: Vec<ChatMessage>,
    instructions: Option<String>,
    previous: Option<String>,
    opts: GenOptions,
}

/// One input item's text: a string, or parts of type `input_text` / `output_text` / `text`.
fn item_text(v: &Json, at: &str) -> Result<String, ApiError> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let f = p.as_object().map(Fields::new);
                match (f.as_ref().map(|f| f.str("type")), f.as_ref().map(|f| f.str("text"))) {
                    (Some(Ok(Some("input_text" | "output_text" | "text"))), Some(Ok(Some(t)))) => out.push_str(t),
                    _ => return Err(ApiError::param(format!("{at}[{j}]"), "must be a text part {\"type\": \"input_text\", \"text\": ...}; images, files and audio are not supported")),
                }
            }
            Ok(out)
        }
        other => Err(ApiError::param(at, format!("must be a text or a list of text parts, got {}", kind_of(other)))),
    }
}

fn input_messages(v: Option<&Json>) -> Result<Vec<ChatMessage>, ApiError> {
    match v {
        None => Err(ApiError::param("input", "is required")),
        Some(Json::String(s)) => Ok(vec![ChatMessage::new("user", s.clone())]),
        Some(Json::Array(items)) if items.is_empty() => Err(ApiError::param("input", "must not be empty")),
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let at = |k: &str| format!("input[{i}].{k}");
                let Json::Object(o) = item else { return Err(ApiError::param(format!("input[{i}]"), "must be a message object")) };
                let f = Fields::new(o);
                match f.str("type").map_err(|_| ApiError::param(at("type"), "must be a string"))? {
                    None | Some("message") => {}
                    Some(t) => return Err(ApiError::param(at("type"), format!("'{}' items are not supported: give messages", bounded(t)))),
                }
                let role = match f.str("role").map_err(|_| ApiError::param(at("role"), "must be a string"))? {
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    Some("developer") => "system",
                    _ => return Err(ApiError::param(at("role"), "must be user, assistant, system or developer")),
                };
                let content = o.get("content").ok_or_else(|| ApiError::param(at("content"), "is required"))?;
                Ok(ChatMessage::new(role, item_text(content, &at("content"))?))
            })
            .collect(),
        Some(v) => Err(ApiError::param("input", format!("must be a text or a list of messages, got {}", kind_of(v)))),
    }
}

/// `text.format` as the chat API's `response_format` (whose reader checks it).
fn text_format(body: &Map<String, Json>) -> Result<Option<super::structured::Structured>, ApiError> {
    let Some(text) = body.get("text").filter(|v| !v.is_null()) else { return Ok(None) };
    let Json::Object(t) = text else { return Err(ApiError::param("text", "must be an object {\"format\": ...}")) };
    if let Some(k) = t.keys().find(|k| k.as_str() != "format") {
        return Err(ApiError::param(format!("text.{}", bounded(k)), "is not supported (text.format is)"));
    }
    let Some(Json::Object(format)) = t.get("format") else { return Ok(None) };
    let mut rf = Map::new();
    match format.get("type").and_then(Json::as_str) {
        Some("json_schema") => {
            let inner: Map<String, Json> = format.iter().filter(|(k, _)| k.as_str() != "type").map(|(k, v)| (k.clone(), v.clone())).collect();
            rf.insert("type".into(), json!("json_schema"));
            rf.insert("json_schema".into(), Json::Object(inner));
        }
        _ => {
            rf = format.clone();
        }
    }
    let mut wrapper = Map::new();
    wrapper.insert("response_format".into(), Json::Object(rf));
    super::structured::response_format(&Fields::new(&wrapper)).map_err(|e| match e {
        ApiError::BadParam { param, why } => ApiError::BadParam { param: param.replacen("response_format", "text.format", 1).replace(".json_schema", ""), why },
        other => other,
    })
}

fn responses_request(body: &Map<String, Json>, st: &AppState, n_vocab: usize) -> Result<ResponsesRequest, ApiError> {
    super::request::refuse_unknown_in(body, &[FIELDS], NOT_YET, Json::is_null)?;
    let f = Fields::new(body);
    let instructions = f.str("instructions")?.map(str::to_string);
    let previous = f.str("previous_response_id")?.map(str::to_string);
    let mut messages = match &previous {
        None => Vec::new(),
        Some(id) => st.responses.get(id).map(|m| m.as_ref().clone()).ok_or_else(|| ApiError::param("previous_response_id", format!("no response '{}' is kept here (responses are kept {} minutes, the newest {KEEP_MAX})", bounded(id), KEEP.as_secs() / 60)))?,
    };
    messages.extend(input_messages(f.get("input"))?);
    // OpenAI's names in the shared reader's terms.
    let mut b = body.clone();
    for k in ["input", "instructions", "previous_response_id", "text", "store", "metadata", "truncation"] {
        b.remove(k);
    }
    if let Some(n) = b.remove("max_output_tokens") {
        b.insert("max_tokens".into(), n);
    }
    let mut opts = gen_options(&Fields::new(&b), LogprobsStyle::Chat, n_vocab, &st.cfg.defaults)?;
    opts.structured = text_format(body)?;
    Ok(ResponsesRequest { messages, instructions, previous, opts })
}

/// What the response objects of one request repeat.
struct Head {
    id: String,
    msg_id: String,
    created: u64,
    model: String,
    instructions: Option<String>,
    previous: Option<String>,
    max_output_tokens: Option<usize>,
    temperature: f32,
    top_p: f32,
}

impl Head {
    fn usage(u: &Usage) -> Json {
        json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        })
    }

    fn part(text: &str) -> Json {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    fn message(&self, text: Option<&str>) -> Json {
        match text {
            None => json!({"type": "message", "id": self.msg_id, "status": "in_progress", "role": "assistant", "content": []}),
            Some(t) => json!({"type": "message", "id": self.msg_id, "status": "completed", "role": "assistant", "content": [Head::part(t)]}),
        }
    }

    /// The response object: in progress (no output yet), or ended with `text` and `f`.
    fn response(&self, done: Option<(&str, &Finished)>) -> Json {
        let (status, incomplete, output, usage) = match done {
            None => ("in_progress", Json::Null, json!([]), Json::Null),
            Some((text, f)) => {
                let cut = matches!(f.reason, StopReason::MaxTokens | StopReason::ContextFull);
                let incomplete = if cut { json!({"reason": "max_output_tokens"}) } else { Json::Null };
                (if cut { "incomplete" } else { "completed" }, incomplete, json!([self.message(Some(text))]), Head::usage(f))
            }
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "previous_response_id": self.previous,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        })
    }
}

pub async fn create(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    serve(st, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let (m, ticket) = admit(&st)?;
    let obj = parse_object(&body_bytes(body)?)?;
    let req = responses_request(&obj, &st, m.n_vocab)?;
    let (messages, instructions, structured) = (req.messages.clone(), req.instructions.clone(), req.opts.structured.clone());
    let (ids, text, grammar) = prepare_prompt(&st, structured, move |m| {
        let mut all = Vec::with_capacity(messages.len() + 1);
        if let Some(i) = instructions {
            all.push(ChatMessage::system(i));
        }
        all.extend(messages);
        render_chat(m, &all, None, Map::new(), false)
    })
    .await?;
    check_context(m, ids.len(), &req.opts)?;
    let mut rx = submit_generation(&st, m, &ids, &text, &req.opts, grammar, ticket)?;
    let head = Head {
        id: unique_id("resp_"),
        msg_id: unique_id("msg_"),
        created: unix_now(),
        model: m.model_id.clone(),
        instructions: req.instructions.clone(),
        previous: req.previous.clone(),
        max_output_tokens: req.opts.max_tokens,
        temperature: req.opts.sampler.temperature,
        top_p: req.opts.sampler.top_p,
    };
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    let first = super::stream::first_event(&mut shut, &mut rx).await?;
    let state = Answer { head, messages: req.messages, text: String::new(), st: st.clone() };
    if req.opts.stream {
        let mut frames = ResponseFrames { frames: VecDeque::new(), ended: false, seq: 0, answer: state, timings_per_token: req.opts.timings_per_token };
        frames.start();
        let mut s = FrameStream::with(rx, shut, frames);
        s.push(first);
        return Ok(s.into_response_as("text/event-stream"));
    }
    let mut answer = state;
    let mut ev = Some(first);
    while let Some(e) = ev.take() {
        match e {
            // Generations get no replies (those answer embeddings and slot actions).
            Event::Progress(_) | Event::Reply(_) => {}
            Event::Token(t) => answer.text.push_str(&t.text),
            Event::Done(f) => {
                let v = answer.finish(&f);
                return Ok(AxJson(v).into_response());
            }
            Event::Failed(e) => return Err(e),
        }
        ev = shut.next_event(&mut rx).await?;
    }
    Err(ApiError::Internal("the generation ended without a result".into()))
}

/// The answer as it grows, and what it is kept as once done.
struct Answer {
    head: Head,
    /// The conversation before the answer (without the instructions).
    messages: Vec<ChatMessage>,
    text: String,
    st: Arc<AppState>,
}

impl Answer {
    /// The finished response object; the conversation with the answer is kept for
    /// `previous_response_id`.
    fn finish(&mut self, f: &Finished) -> Json {
        let mut conversation = std::mem::take(&mut self.messages);
        conversation.push(ChatMessage::new("assistant", self.text.clone()));
        self.st.responses.put(self.head.id.clone(), conversation);
        self.head.response(Some((&self.text, f)))
    }
}

/// The Responses API's typed events for a [`FrameStream`].
struct ResponseFrames {
    frames: VecDeque<Bytes>,
    ended: bool,
    seq: u64,
    answer: Answer,
    timings_per_token: bool,
}

impl FrameMaker for ResponseFrames {
    fn make(&mut self, ev: Event, out: &mut VecDeque<Bytes>) -> bool {
        self.push(ev);
        out.append(&mut self.frames);
        self.ended
    }
}

impl ResponseFrames {
    fn event(&mut self, kind: &str, mut data: Json) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.frames.push_back(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    fn start(&mut self) {
        let r = self.answer.head.response(None);
        self.event("response.created", json!({"response": r}));
        self.event("response.in_progress", json!({"response": r}));
        let item = self.answer.head.message(None);
        self.event("response.output_item.added", json!({"output_index": 0, "item": item}));
        let msg = self.answer.head.msg_id.clone();
        self.event("response.content_part.added", json!({"item_id": msg, "output_index": 0, "content_index": 0, "part": Head::part("")}));
    }

    fn push(&mut self, ev: Event) {
        let msg = self.answer.head.msg_id.clone();
        match ev {
            Event::Reply(_) => {}
            Event::Progress(p) => {
                let r = self.answer.head.response(None);
                let mut d = json!({"response": r, "prompt_progress": super::native::progress_json(&p)});
                if self.timings_per_token {
                    d["timings"] = timings(&p.so_far);
                }
                self.event("response.in_progress", d);
            }
            Event::Token(t) => {
                if t.text.is_empty() {
                    return;
                }
                self.answer.text.push_str(&t.text);
                let mut d = json!({"item_id": msg, "output_index": 0, "content_index": 0, "delta": t.text, "logprobs": []});
                if self.timings_per_token {
                    d["timings"] = timings(&t.so_far);
                }
                self.event("response.output_text.delta", d);
            }
            Event::Done(f) => {
                let text = self.answer.text.clone();
                self.event("response.output_text.done", json!({"item_id": msg, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}));
                self.event("response.content_part.done", json!({"item_id": msg, "output_index": 0, "content_index": 0, "part": Head::part(&text)}));
                let item = self.answer.head.message(Some(&text));
                self.event("response.output_item.done", json!({"output_index": 0, "item": item}));
                let r = self.answer.finish(&f);
                let kind = if r["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                let mut d = json!({"response": r});
                d["timings"] = timings(&f);
                self.event(kind, d);
                self.ended = true;
            }
            Event::Failed(e) => {
                let err = e.to_json();
                self.event("error", json!({"code": err["error"]["code"], "message": err["error"]["message"], "param": err["error"]["param"]}));
                self.ended = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_become_messages() {
        let m = input_messages(Some(&json!("hi"))).unwrap();
        assert_eq!((m[0].role.as_str(), m[0].content.clone()), ("user", Some(json!("hi"))));
        let m = input_messages(Some(&json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]}
        ])))
        .unwrap();
        assert_eq!(m.iter().map(|x| x.role.as_str()).collect::<Vec<_>>(), ["system", "user", "assistant"]);
        assert_eq!(m[1].content, Some(json!("ab")));
        let param = |v: Json| match input_messages(Some(&v)).unwrap_err() {
            ApiError::BadParam { param, .. } => param,
            e => panic!("{e:?}"),
        };
        assert_eq!(param(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])), "input[0].content[0]");
        assert_eq!(param(json!([{"type": "function_call_output", "output": "x"}])), "input[0].type");
        assert_eq!(param(json!([{"role": "wizard", "content": "x"}])), "input[0].role");
        assert_eq!(param(json!([])), "input");
    }

    #[test]
    fn the_store_keeps_the_newest() {
        let s = ResponseStore::default();
        for i in 0..KEEP_MAX + 5 {
            s.put(format!("r{i}"), vec![ChatMessage::new("user", "x")]);
        }
        assert!(s.get("r0").is_none() && s.get("r4").is_none());
        assert!(s.get("r5").is_some() && s.get(&format!("r{}", KEEP_MAX + 4)).is_some());
    }
}
