//! The JSON shapes of OpenAI responses: whole (`chat.completion`, `text_completion`) and
//! streamed (`chat.completion.chunk`, `text_completion` chunks), with usage and logprobs.

use serde_json::{Value as Json, json};

use super::slot::{Finished, TokenEvent, Usage};
use super::tools::ToolCall;
use crate::generate::TokenLogprobs;
use crate::tokenizer::Tokenizer;

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
}

/// What every object or chunk of one response repeats.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub api: Api,
}

/// OpenAI's stand-in for the log-probability of an impossible token (JSON has no -inf).
const LOGPROB_FLOOR: f32 = -9999.0;

fn lp(x: f32) -> f32 {
    if x.is_finite() { x.max(LOGPROB_FLOOR) } else { LOGPROB_FLOOR }
}

/// A token's text (invalid UTF-8 replaced) and its bytes.
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A new response id: `chatcmpl-…` or `cmpl-…`, unique within the process.
pub fn new_id(api: Api) -> String {
    unique_id(if api == Api::Chat { "chatcmpl-" } else { "cmpl-" })
}

/// `prefix` and a suffix unique within the process (the time in ns and a counter, in hex).
pub fn unique_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}{:x}{:04x}", nanos, N.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

/// Log-probabilities of the generated tokens, in the endpoint's convention.
#[derive(Debug, Default)]
pub struct Logprobs {
    items: Vec<TokenLogprobs>,
}

impl Logprobs {
    /// Keeps `t`'s log-probabilities unless it is an end-of-generation token (never shown).
    pub fn push(&mut self, tok: &Tokenizer, t: &TokenEvent) {
        if let Some(l) = t.logprobs.as_ref().filter(|_| !tok.is_eog(t.id)) {
            self.items.push(l.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
    /// Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, offsets
    /// counted from `offset0`.
    pub fn to_json(&self, tok: &Tokenizer, api: Api, offset0: usize) -> Json {
        match api {
            Api::Chat => {
                let entry = |id: u32, logprob: f32| {
                    let (text, bytes) = piece(tok, id);
                    json!({"token": text, "logprob": lp(logprob), "bytes": bytes})
                };
                let content: Vec<Json> = self
                    .items
                    .iter()
                    .map(|l| {
                        let mut e = entry(l.id, l.logprob);
                        e["top_logprobs"] = Json::Array(l.top.iter().map(|&(id, p)| entry(id, p)).collect());
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Api::Completion => {
                let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                let mut offset = offset0;
                for l in &self.items {
                    let (text, _) = piece(tok, l.id);
                    offsets.push(offset);
                    offset += text.len();
                    tokens.push(text);
                    logprobs.push(lp(l.logprob));
                    let top: serde_json::Map<String, Json> = l.top.iter().map(|&(id, p)| (piece(tok, id).0, json!(lp(p)))).collect();
                    tops.push(Json::Object(top));
                }
                json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }
}

/// `tool_calls` when the answer called tools, else `stop` or `length`.
fn finish_reason(f: &Finished, calls: &[ToolCall]) -> &'static str {
    if calls.is_empty() { f.finish_reason() } else { "tool_calls" }
}

/// OpenAI's usage; `prompt_tokens_details.cached_tokens` counts the prompt tokens taken from the
/// slot's KV instead of being evaluated (prompt caching).
pub fn usage(f: &Usage) -> Json {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

/// `system_fingerprint`: llama-server's shape (`b<build>-<name>`), which its clients check.
pub const SYSTEM_FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-minfer");

/// llama-server's `timings` (not in OpenAI's schema; clients ignore it), with its formulas:
/// the prompt's rate over the tokens evaluated (not those cached), the generation's over the
/// decode passes (the first token comes from the prompt's pass).
pub fn timings(u: &Usage) -> Json {
    let prompt_n = u.prompt_tokens.saturating_sub(u.cached_tokens);
    let (prompt_ms, predicted_ms) = (u.prompt_secs * 1e3, u.gen_secs * 1e3);
    let decode_passes = u.completion_tokens.saturating_sub(1);
    let per_token = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let per_second = |ms: f64, n: usize| if ms > 0.0 { 1e3 / ms * n as f64 } else { 0.0 };
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per_token(prompt_ms, prompt_n),
        "prompt_per_second": per_second(prompt_ms, prompt_n),
        "predicted_n": u.completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per_token(predicted_ms, decode_passes),
        "predicted_per_second": per_second(predicted_ms, decode_passes),
    })
}

impl Meta {
    fn object(&self, stream: bool) -> &'static str {
        match (self.api, stream) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, stream: bool, choices: Json) -> Json {
        json!({
            "id": self.id,
            "object": self.object(stream),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        })
    }

    /// Choice `index` of a non-streamed response.
    pub fn choice(&self, index: usize, text: &str, calls: &[ToolCall], logprobs: Option<Json>, f: &Finished) -> Json {
        let logprobs = logprobs.unwrap_or(Json::Null);
        match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    if text.trim().is_empty() {
                        message["content"] = Json::Null;
                    }
                    message["tool_calls"] = self.tool_calls(calls);
                }
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason(f, calls)})
            }
            Api::Completion => json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": f.finish_reason()}),
        }
    }

    /// The whole response of a non-streamed request: its choices, and the usage of all of them
    /// (the prompt counted once, as OpenAI counts it; the timings are the first choice's).
    pub fn complete(&self, choices: Vec<Json>, finished: &[Finished]) -> Json {
        let mut v = self.envelope(false, Json::Array(choices));
        if let Some(first) = finished.first() {
            let mut total = first.usage;
            total.completion_tokens = finished.iter().map(|f| f.completion_tokens).sum();
            v["usage"] = usage(&total);
            v["timings"] = timings(&first.usage);
        }
        v
    }

    /// The first chunk of a chat stream: the role alone, as OpenAI and llama-server send it.
    pub fn role_chunk(&self, include_usage: bool) -> Json {
        let choice = json!({"index": 0, "delta": {"role": "assistant", "content": null}, "logprobs": null, "finish_reason": null});
        self.with_usage_slot(self.envelope(true, json!([choice])), include_usage)
    }

    /// A chunk with no text, to carry the prompt's progress.
    pub fn progress_chunk(&self, include_usage: bool) -> Json {
        let choice = match self.api {
            Api::Chat => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": null}),
            Api::Completion => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": null}),
        };
        self.with_usage_slot(self.envelope(true, json!([choice])), include_usage)
    }

    /// A streamed chunk carrying `text`.
    pub fn chunk(&self, text: &str, logprobs: Option<Json>, include_usage: bool) -> Json {
        let logprobs = logprobs.unwrap_or(Json::Null);
        let choice = match self.api {
            Api::Chat => json!({"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null}),
            Api::Completion => json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": null}),
        };
        self.with_usage_slot(self.envelope(true, json!([choice])), include_usage)
    }

    /// The chat chunk that carries the tool calls.
    pub fn tool_calls_chunk(&self, calls: &[ToolCall], include_usage: bool) -> Json {
        let choice = json!({"index": 0, "delta": {"tool_calls": self.tool_calls(calls)}, "logprobs": null, "finish_reason": null});
        self.with_usage_slot(self.envelope(true, json!([choice])), include_usage)
    }

    fn tool_calls(&self, calls: &[ToolCall]) -> Json {
        Json::Array(calls.iter().enumerate().map(|(i, c)| c.to_json(&self.id, i)).collect())
    }

    /// The chunk that ends the choice, with its `finish_reason`.
    pub fn final_chunk(&self, f: &Finished, calls: &[ToolCall], include_usage: bool) -> Json {
        let choice = match self.api {
            Api::Chat => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason(f, calls)}),
            Api::Completion => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": f.finish_reason()}),
        };
        let mut v = self.with_usage_slot(self.envelope(true, json!([choice])), include_usage);
        v["timings"] = timings(f);
        v
    }

    /// The last chunk of a stream ended by the server's shutdown: `finish_reason` `"shutdown"`.
    pub fn shutdown_chunk(&self, include_usage: bool) -> Json {
        let choice = match self.api {
            Api::Chat => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "shutdown"}),
            Api::Completion => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "shutdown"}),
        };
        self.with_usage_slot(self.envelope(true, json!([choice])), include_usage)
    }

    /// With `stream_options.include_usage`: the last chunk, no choices, the usage.
    pub fn usage_chunk(&self, f: &Finished) -> Json {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = usage(f);
        v["timings"] = timings(f);
        v
    }

    /// OpenAI puts `"usage": null` on every chunk but the last when usage was asked for.
    fn with_usage_slot(&self, mut v: Json, include_usage: bool) -> Json {
        if include_usage {
            v["usage"] = Json::Null;
        }
        v
    }
}
