//! The bodies of `/v1/chat/completions` and `/v1/completions`, read into typed requests.
//!
//! Every field is read or refused: a field minfer does not implement (llama-server's
//! `grammar` and `json_schema`, OpenAI's `metadata`, a typo) is a 400 naming it, never
//! silently ignored; so is a known field with a wrong type or an out-of-range value, or a
//! value minfer cannot honour (`n` > 1, `response_format` json). A `null` field is absent.

use serde_json::{Map, Value as Json};

use super::error::ApiError;
use super::fields::{Fields, kind_of};
use super::structured::{Structured, ToolChoice, llama_fields, response_format, tool_calls, tool_choice};
use crate::chat::ChatMessage;
use super::state::RequestDefaults;
use crate::generate::SamplerParams;

/// Most stop strings a request may give, and their longest length in bytes (every stop
/// string is searched for after every token, on the thread all slots share).
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most alternatives `top_logprobs` / `logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The fields both endpoints read (OpenAI's names, and llama-server's sampling extensions).
/// `user` is OpenAI's end-user id for abuse monitoring: taken, and nothing to do with it.
pub(crate) const GEN_FIELDS: &[&str] = &[
    "model", "user", "n", "max_tokens", "max_completion_tokens", "temperature", "top_k", "top_p", "min_p",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n", "seed", "logit_bias", "stream",
    "stream_options", "logprobs", "top_logprobs", "stop", "cache_prompt", "json_schema", "grammar",
    "n_predict", "timings_per_token", "verbose", "return_progress", "id_slot", "post_sampling_probs",
    // llama-server samples on the GPU with it; minfer always samples on the CPU, the same draw.
    "backend_sampling",
];
/// The fields only `/v1/chat/completions` reads.
const CHAT_FIELDS: &[&str] =
    &["messages", "tools", "tool_choice", "response_format", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"];
/// The fields only `/v1/completions` reads.
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "best_of", "suffix"];
/// Fields other servers implement that minfer does not yet, with what to say about them.
const NOT_YET: &[(&str, &str)] = &[
    ("parallel_tool_calls", ": tool calls are parsed from the answer, never forced or limited"),
    ("functions", ": use 'tools'"),
    ("function_call", ": use 'tool_choice'"),
];

/// The first field of `body` that is neither in `known` sets nor null, as a 400.
pub(crate) fn refuse_unknown(body: &Map<String, Json>, known: &[&[&str]]) -> Result<(), ApiError> {
    refuse_unknown_in(body, known, NOT_YET, Json::is_null)
}

/// The first field of `body` that is in none of the `known` sets and not `absent`, as a 400
/// that says why when `not_yet` names the field. Every API's reader refuses through it.
pub(crate) fn refuse_unknown_in(body: &Map<String, Json>, known: &[&[&str]], not_yet: &[(&str, &'static str)], absent: fn(&Json) -> bool) -> Result<(), ApiError> {
    let Some(field) = body.iter().find(|(k, v)| !absent(v) && !known.iter().any(|set| set.contains(&k.as_str()))).map(|(k, _)| k) else {
        return Ok(());
    };
    let why = not_yet.iter().find(|(name, _)| name == field).map_or(" (unknown or not implemented field)", |(_, why)| why);
    // Escaped: a client's field name may hold a newline, and errors are one line.
    Err(ApiError::Unsupported { field: super::error::bounded(&field.escape_debug().to_string()), why })
}

/// What both endpoints share: sampling, limits, streaming.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOptions {
    /// Choices to generate from the one prompt (`n`).
    pub n: usize,
    /// `max_tokens` is a cap (llama-server's `n_predict`, the server's `--n-predict`), not a
    /// promise the prompt must leave room for.
    pub cap_to_context: bool,
    /// llama-server's `timings_per_token`: every streamed chunk carries the `timings`.
    pub timings_per_token: bool,
    /// llama-server's `verbose`: the whole response carries `__verbose` (the prompt's text).
    pub verbose: bool,
    /// llama-server's `return_progress`: a stream reports the prompt's evaluation as it goes.
    pub return_progress: bool,
    /// llama-server's `post_sampling_probs`: the probabilities reported are those the token
    /// was drawn from (after the sampler's filters), as `prob` / `top_probs` on `/completion`.
    pub post_sampling_probs: bool,
    /// llama-server's `id_slot`: run (the first choice) on this slot, waiting for it if busy
    /// (-1 or absent: the slot whose cache fits best).
    pub id_slot: Option<usize>,
    /// `max_completion_tokens` or `max_tokens`; `None`: until the slot's context is full.
    pub max_tokens: Option<usize>,
    pub sampler: SamplerParams,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Log-probabilities of each token and of this many alternatives.
    pub n_probs: Option<usize>,
    /// llama-server's `cache_prompt`: start from the slot's KV that shares the longest prefix
    /// with this prompt and evaluate only the rest (answers are the same either way).
    pub cache_prompt: bool,
    /// The constraint on the text (structured output), not yet compiled.
    pub structured: Option<Structured>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Json>,
    /// `chat_template_kwargs` (llama-server's extension): extra template variables.
    pub template_kwargs: Map<String, Json>,
    /// `continue_final_message` (vLLM's and llama-server's): the answer continues the last,
    /// assistant, message instead of starting a new turn.
    pub continue_final: bool,
    pub opts: GenOptions,
}

/// A completion prompt: text (tokenized with special tokens parsed, as llama-server does) or
/// token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Put the prompt's text before the completion.
    pub echo: bool,
    pub opts: GenOptions,
}

/// Which `logprobs` convention a body follows.
#[derive(Clone, Copy)]
pub(crate) enum LogprobsStyle {
    /// Chat: `logprobs: bool`, `top_logprobs: int`.
    Chat,
    /// Completions: `logprobs: int` (the number of alternatives).
    Legacy,
}

/// A seed for requests without one: different for every request.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 of time and a counter
    let mut z = nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn logit_bias(f: &Fields, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(m) = f.object("logit_bias")? else { return Ok(Vec::new()) };
    if m.len() > n_vocab {
        return Err(ApiError::param("logit_bias", format!("lists more tokens than the vocabulary's {n_vocab}")));
    }
    let mut out = Vec::with_capacity(m.len());
    for (key, v) in m {
        let id = key
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < n_vocab)
            .ok_or_else(|| ApiError::param("logit_bias", format!("keys must be token ids below {n_vocab}")))?;
        let bias = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| ApiError::param("logit_bias", "values must be numbers between -100 and 100"))?;
        // As in OpenAI's API, -100 bans the token.
        out.push((id, if bias <= -100.0 { f32::NEG_INFINITY } else { bias as f32 }));
    }
    // Keys are distinct, so this counts distinct banned tokens.
    if out.iter().filter(|(_, b)| *b == f32::NEG_INFINITY).count() >= n_vocab {
        return Err(ApiError::param("logit_bias", "bans every token: nothing could be generated"));
    }
    Ok(out)
}

/// `seed`: any 64-bit integer, signed or not (negative ones wrap).
fn seed(f: &Fields) -> Result<Option<u64>, ApiError> {
    match f.get("seed") {
        None => Ok(None),
        Some(Json::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Ok(Some(u)),
            (None, Some(i)) => Ok(Some(i as u64)),
            _ => Err(ApiError::param("seed", format!("must be an integer, got {n}"))),
        },
        Some(v) => Err(ApiError::param("seed", format!("must be an integer, got {}", kind_of(v)))),
    }
}

fn stops(f: &Fields) -> Result<Vec<String>, ApiError> {
    let stops = f.strings("stop", MAX_STOPS)?;
    if let Some(i) = stops.iter().position(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::param(format!("stop[{i}]"), format!("must be at most {MAX_STOP_BYTES} bytes long")));
    }
    Ok(stops)
}

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: i64 = 16;

pub(crate) fn gen_options(f: &Fields, style: LogprobsStyle, n_vocab: usize, defaults: &RequestDefaults) -> Result<GenOptions, ApiError> {
    let n = f.int_in("n", 1, MAX_CHOICES)?.unwrap_or(1) as usize;
    // llama-server's n_predict (-1: no limit) beside OpenAI's names; the first given wins.
    // OpenAI's limits are promises the prompt must leave room for (else a 400); llama-server's
    // n_predict and the server's --n-predict are caps, the generation ending when the slot's
    // context is full (finish_reason "length").
    let (max_tokens, cap_to_context) = match f.int_in("max_completion_tokens", 1, i64::from(u32::MAX))? {
        Some(n) => (Some(n as usize), false),
        None => match f.int_in("max_tokens", 1, i64::from(u32::MAX))? {
            Some(n) => (Some(n as usize), false),
            None => match f.int_in("n_predict", -1, i64::from(u32::MAX))? {
                Some(-1) | None => (defaults.n_predict, true),
                Some(0) => return Err(ApiError::param("n_predict", "must be -1 (no limit) or at least 1")),
                Some(n) => (Some(n as usize), true),
            },
        },
    };
    let d = SamplerParams::default();
    let sampler = SamplerParams {
        temperature: f.f32_in("temperature", 0.0, 2.0)?.or(defaults.temperature).unwrap_or(d.temperature),
        top_k: f.int_in("top_k", 0, i64::from(u32::MAX))?.map_or(d.top_k, |k| k as usize),
        top_p: f.f32_in("top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: f.f32_in("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        repeat_penalty: f.f32_in("repeat_penalty", 0.0, 10.0)?.unwrap_or(d.repeat_penalty),
        presence_penalty: f.f32_in("presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.f32_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        penalty_last_n: f.int_in("repeat_last_n", 0, i64::from(u32::MAX))?.map_or(d.penalty_last_n, |n| n as usize),
        seed: seed(f)?.or(defaults.seed).unwrap_or_else(fresh_seed),
        logit_bias: logit_bias(f, n_vocab)?,
    };
    if sampler.repeat_penalty == 0.0 {
        return Err(ApiError::param("repeat_penalty", "must be greater than 0"));
    }
    // A ban (-inf) is fine; validate() refuses NaN and +inf, which the reader cannot produce.
    sampler.validate().map_err(|e| ApiError::param("sampling", e.to_string()))?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let cache_prompt = f.bool("cache_prompt")?.unwrap_or(true);
    let include_usage = match f.object("stream_options")? {
        None => false,
        Some(_) if !stream => return Err(ApiError::param("stream_options", "is only allowed when 'stream' is true")),
        Some(o) => Fields::new(o).bool("include_usage").map_err(|_| ApiError::param("stream_options.include_usage", "must be a boolean"))?.unwrap_or(false),
    };
    let n_probs = match style {
        LogprobsStyle::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let top = f.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
            match (on, top) {
                (false, Some(_)) => return Err(ApiError::param("top_logprobs", "requires 'logprobs' to be true")),
                (false, None) => None,
                (true, top) => Some(top.unwrap_or(0) as usize),
            }
        }
        LogprobsStyle::Legacy => f.int_in("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|n| n as usize),
    };
    Ok(GenOptions {
        n,
        cap_to_context,
        timings_per_token: f.bool("timings_per_token")?.unwrap_or(false),
        verbose: f.bool("verbose")?.unwrap_or(defaults.verbose),
        return_progress: f.bool("return_progress")?.unwrap_or(false),
        post_sampling_probs: f.bool("post_sampling_probs")?.unwrap_or(false),
        id_slot: f.int_in("id_slot", -1, i64::from(u16::MAX))?.filter(|&i| i >= 0).map(|i| i as usize),
        max_tokens,
        sampler,
        stop: stops(f)?,
        stream,
        include_usage,
        n_probs,
        cache_prompt,
        structured: llama_fields(f)?,
    })
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// One message, its content normalized to a string (text parts joined by newlines) or null.
fn message(i: usize, v: &Json) -> Result<ChatMessage, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Json::Object(m) = v else {
        return Err(ApiError::param(format!("messages[{i}]"), format!("must be an object, got {}", kind_of(v))));
    };
    let f = Fields::new(m);
    let role = f.str("role").map_err(|_| ApiError::param(at("role"), "must be a string"))?;
    let role = role.ok_or_else(|| ApiError::param(at("role"), "is required"))?;
    if !ROLES.contains(&role) {
        return Err(ApiError::param(at("role"), format!("must be one of {}", ROLES.join(", "))));
    }
    let mut msg: ChatMessage =
        serde_json::from_value(v.clone()).map_err(|_| ApiError::param(format!("messages[{i}]"), "is not a valid message"))?;
    if let Some(Json::Array(calls)) = &mut msg.tool_calls {
        // OpenAI sends a call's arguments as JSON text; templates (Qwen's `arguments | tojson`)
        // expect the object, as llama-server gives them.
        for call in calls.iter_mut() {
            if let Some(args) = call.pointer_mut("/function/arguments")
                && let Some(obj) = args.as_str().and_then(|t| serde_json::from_str::<Json>(t).ok()).filter(Json::is_object)
            {
                *args = obj;
            }
        }
    }
    if role == "developer" {
        // OpenAI's newer name for the system role; chat templates know "system".
        msg.role = "system".into();
    }
    msg.content = match m.get("content") {
        None | Some(Json::Null) if role == "assistant" && f.get("tool_calls").is_some() => Some(Json::Null),
        None | Some(Json::Null) => return Err(ApiError::param(at("content"), "is required")),
        Some(Json::String(s)) => Some(Json::String(s.clone())),
        Some(Json::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let p = part.as_object().map(Fields::new);
                match (p.as_ref().map(|p| p.str("type")), p.as_ref().map(|p| p.str("text"))) {
                    (Some(Ok(Some("text"))), Some(Ok(Some(t)))) => texts.push(t.to_string()),
                    _ => {
                        return Err(ApiError::param(
                            format!("messages[{i}].content[{j}]"),
                            "must be a text part {\"type\": \"text\", \"text\": ...}; other part types are not supported",
                        ));
                    }
                }
            }
            Some(Json::String(texts.join("\n")))
        }
        Some(other) => return Err(ApiError::param(at("content"), format!("must be a string or an array of parts, got {}", kind_of(other)))),
    };
    Ok(msg)
}

pub fn chat_request(body: &Map<String, Json>, n_vocab: usize, defaults: &RequestDefaults) -> Result<ChatCompletionRequest, ApiError> {
    refuse_unknown(body, &[GEN_FIELDS, CHAT_FIELDS])?;
    let f = Fields::new(body);
    let messages = match f.get("messages") {
        None => return Err(ApiError::param("messages", "is required")),
        Some(Json::Array(items)) if items.is_empty() => return Err(ApiError::param("messages", "must not be empty")),
        Some(Json::Array(items)) => items.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(ApiError::param("messages", format!("must be an array, got {}", kind_of(v)))),
    };
    let mut tools = match f.get("tools") {
        None => None,
        Some(Json::Array(items)) if items.iter().all(Json::is_object) => Some(Json::Array(items.clone())),
        Some(_) => return Err(ApiError::param("tools", "must be an array of tool objects")),
    };
    let choice = tool_choice(&f)?;
    if choice == ToolChoice::None {
        tools = None;
    }
    let forced = match &tools {
        Some(t) => tool_calls(t, &choice)?,
        None if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) => return Err(ApiError::param("tool_choice", "forces a tool call, so 'tools' must offer one")),
        None => None,
    };
    let mut opts = gen_options(&f, LogprobsStyle::Chat, n_vocab, defaults)?;
    // One constraint per request: response_format, json_schema / grammar, or a forced call.
    for (c, field) in [(response_format(&f)?, "response_format"), (forced, "tools")] {
        if let Some(c) = c {
            if opts.structured.is_some() {
                return Err(ApiError::param(field, "constrains the answer, and so does another field: give one of response_format, json_schema, grammar, and strict tools or a forced tool_choice"));
            }
            opts.structured = Some(c);
        }
    }
    let template_kwargs = f.object("chat_template_kwargs")?.cloned().unwrap_or_default();
    let ends_with_assistant = messages.last().is_some_and(|m| m.role == "assistant");
    let asked = f.bool("continue_final_message")?;
    let continue_final = asked.unwrap_or(defaults.prefill_assistant && ends_with_assistant);
    if asked.is_none() && continue_final && messages.len() >= 2 && messages[messages.len() - 2].role == "assistant" {
        return Err(ApiError::param("messages", "ends with two assistant messages: only the last one can be continued (--prefill-assistant)"));
    }
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(!continue_final);
    let mut messages = messages;
    if continue_final {
        // The continued message's text parts are joined by a blank line, as llama-server joins
        // them (other messages' parts by a newline).
        let raw = f.get("messages").and_then(Json::as_array).and_then(|m| m.last()).and_then(|m| m.get("content")).and_then(Json::as_array);
        if let (Some(parts), Some(last)) = (raw, messages.last_mut()) {
            let texts: Vec<&str> = parts.iter().filter_map(|p| p.get("text").and_then(Json::as_str)).collect();
            last.content = Some(Json::String(texts.join("\n\n")));
        }
    }
    if continue_final && add_generation_prompt {
        return Err(ApiError::param("continue_final_message", "cannot be true together with add_generation_prompt: one continues the last message, the other starts a new one"));
    }
    if continue_final && messages.last().is_none_or(|m| m.role != "assistant") {
        return Err(ApiError::param("continue_final_message", "needs the last message to be the assistant's"));
    }
    Ok(ChatCompletionRequest { messages, tools, template_kwargs, continue_final, opts })
}

/// Token ids below `n_vocab`; an error names the offending index of `param`.
pub fn token_ids(param: &str, items: &[Json], n_vocab: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(id) if (id as usize) < n_vocab => Ok(id as u32),
            Some(id) => Err(ApiError::param(format!("{param}[{i}]"), format!("token id {id} is not below the vocabulary size {n_vocab}"))),
            None => Err(ApiError::param(format!("{param}[{i}]"), format!("must be a token id (an integer >= 0), got {}", kind_of(v)))),
        })
        .collect()
}

pub fn completion_request(body: &Map<String, Json>, n_vocab: usize, defaults: &RequestDefaults) -> Result<CompletionRequest, ApiError> {
    refuse_unknown(body, &[GEN_FIELDS, COMPLETION_FIELDS])?;
    let f = Fields::new(body);
    let one = "must be a string, an array of token ids, or a list holding one of those";
    let prompt = match f.get("prompt") {
        None => return Err(ApiError::param("prompt", "is required")),
        Some(Json::String(s)) => Prompt::Text(s.clone()),
        Some(Json::Array(items)) => match items.first() {
            None => return Err(ApiError::param("prompt", "must not be empty")),
            Some(Json::Number(_)) => Prompt::Ids(token_ids("prompt", items, n_vocab)?),
            Some(_) if items.len() > 1 => return Err(ApiError::param("prompt", "must hold one prompt: batches of prompts are not supported")),
            Some(Json::String(s)) => Prompt::Text(s.clone()),
            Some(Json::Array(ids)) => Prompt::Ids(token_ids("prompt[0]", ids, n_vocab)?),
            Some(_) => return Err(ApiError::param("prompt", one)),
        },
        Some(_) => return Err(ApiError::param("prompt", one)),
    };
    if matches!(&prompt, Prompt::Text(s) if s.is_empty()) || matches!(&prompt, Prompt::Ids(ids) if ids.is_empty()) {
        return Err(ApiError::param("prompt", "must not be empty"));
    }
    if f.get("best_of").is_some_and(|b| b.as_i64() != Some(1)) {
        return Err(ApiError::param("best_of", "must be 1: one candidate per request is supported"));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "is not supported"));
    }
    let echo = f.bool("echo")?.unwrap_or(false);
    let opts = gen_options(&f, LogprobsStyle::Legacy, n_vocab, defaults)?;
    if echo && opts.n_probs.is_some() {
        return Err(ApiError::param("echo", "cannot be combined with 'logprobs' (prompt log-probabilities are not computed)"));
    }
    Ok(CompletionRequest { prompt, echo, opts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: Json) -> Result<ChatCompletionRequest, ApiError> {
        chat_request(v.as_object().unwrap(), 1000, &RequestDefaults::default())
    }

    fn param_of(e: ApiError) -> String {
        match e {
            ApiError::BadParam { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chat_reads_the_openai_fields() {
        let r = chat(json!({
            "model": "x", "user": "ignored",
            "messages": [{"role": "developer", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "stop": "END", "seed": 3,
            "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
            "logit_bias": {"5": -100, "6": 2.5}
        }))
        .unwrap();
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[1].content, Some(json!("a\nb")));
        assert_eq!(r.opts.max_tokens, Some(7));
        assert_eq!(r.opts.stop, vec!["END"]);
        assert_eq!(r.opts.sampler.seed, 3);
        assert_eq!(r.opts.sampler.temperature, 0.5);
        assert!(r.opts.stream && r.opts.include_usage);
        assert_eq!(r.opts.n_probs, Some(2));
        assert_eq!(r.opts.sampler.logit_bias, vec![(5, f32::NEG_INFINITY), (6, 2.5)]);
        let seed = |v: Json| chat(json!({"messages": [{"role": "user", "content": "x"}], "seed": v})).unwrap().opts.sampler.seed;
        assert_eq!(seed(json!(u64::MAX)), u64::MAX);
        assert_eq!(seed(json!(-1)), u64::MAX);
        assert_ne!(seed(json!(u64::MAX - 1)), seed(json!(u64::MAX)));
    }

    /// Fields minfer does not implement are refused by name (an independent list: what
    /// llama-server and OpenAI accept and minfer does not), nulls count as absent.
    #[test]
    fn unimplemented_fields_are_refused_by_name() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        for field in ["metadata", "store", "n_probs", "temprature", "parallel_tool_calls", "mirostat"] {
            let mut body = json!({"messages": msgs, "max_tokens": 3});
            body[field] = json!("x");
            let e = chat(body).unwrap_err();
            assert!(matches!(&e, ApiError::Unsupported { field: f, .. } if f == field), "{field}: {e:?}");
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
            assert_eq!(e.to_json()["error"]["param"], field);
            assert!(e.to_string().starts_with(&format!("'{field}' is not supported")), "{e}");
            let c = completion_request(json!({"prompt": "x", field: 1}).as_object().unwrap(), 1000, &RequestDefaults::default()).unwrap_err();
            assert!(matches!(c, ApiError::Unsupported { .. }), "{field}");
        }
        // Each endpoint's own fields are not the other's.
        assert!(matches!(chat(json!({"messages": msgs, "echo": true})).unwrap_err(), ApiError::Unsupported { .. }));
        let c = completion_request(json!({"prompt": "x", "messages": msgs}).as_object().unwrap(), 1000, &RequestDefaults::default()).unwrap_err();
        assert!(matches!(c, ApiError::Unsupported { .. }));
        assert!(chat(json!({"messages": msgs, "grammar": null, "user": "u-1", "model": "m"})).is_ok());
        // A long unknown name is cut in the message, a newline in it escaped.
        let long = "z".repeat(10_000);
        let e = chat(json!({"messages": msgs, long.clone(): 1})).unwrap_err();
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
        let e = chat(json!({"messages": msgs, "a\nb": 1})).unwrap_err();
        assert_eq!(e.to_string(), "'a\\nb' is not supported by this server (unknown or not implemented field)");
    }

    #[test]
    fn tool_choice_none_and_auto_need_no_tools() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        for choice in ["none", "auto"] {
            let r = chat(json!({"messages": msgs, "tool_choice": choice})).unwrap();
            assert!(r.tools.is_none() && r.opts.structured.is_none(), "{choice}");
        }
        let tools = json!([{"type": "function", "function": {"name": "f", "strict": true}}]);
        assert!(chat(json!({"messages": msgs, "tools": tools, "tool_choice": "none"})).unwrap().opts.structured.is_none());
        assert!(chat(json!({"messages": msgs, "tools": tools})).unwrap().opts.structured.is_some(), "strict tools under auto");
    }

    #[test]
    fn banning_every_token_is_refused() {
        let all: Map<String, Json> = (0..1000).map(|i| (i.to_string(), json!(-100))).collect();
        let r = chat(json!({"messages": [{"role": "user", "content": "x"}], "logit_bias": all}));
        assert_eq!(param_of(r.unwrap_err()), "logit_bias");
    }

    #[test]
    fn tool_call_arguments_become_objects_for_the_template() {
        let r = chat(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}))
        .unwrap();
        assert_eq!(r.messages[1].content, Some(Json::Null));
        assert_eq!(r.messages[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(r.messages[2].role, "tool");
    }

    #[test]
    fn chat_errors_name_the_parameter() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "wizard", "content": "x"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "user"}]}), "messages[0].content"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "messages[0].content[0]"),
            (json!({"messages": msgs, "temperature": "hot"}), "temperature"),
            (json!({"messages": msgs, "temperature": 9}), "temperature"),
            (json!({"messages": msgs, "n": 0}), "n"),
            (json!({"messages": msgs, "n": 17}), "n"),
            (json!({"messages": msgs, "add_generation_prompt": true, "continue_final_message": true}), "continue_final_message"),
            (json!({"messages": msgs, "continue_final_message": true}), "continue_final_message"),
            (json!({"messages": msgs, "max_tokens": 0}), "max_tokens"),
            (json!({"messages": msgs, "max_completion_tokens": -5}), "max_completion_tokens"),
            (json!({"messages": msgs, "stream_options": {"include_usage": true}}), "stream_options"),
            (json!({"messages": msgs, "top_logprobs": 3}), "top_logprobs"),
            (json!({"messages": msgs, "logprobs": true, "top_logprobs": 50}), "top_logprobs"),
            (json!({"messages": msgs, "stop": [1]}), "stop[0]"),
            (json!({"messages": msgs, "logit_bias": {"99999": 1}}), "logit_bias"),
            (json!({"messages": msgs, "response_format": {"type": "xml"}}), "response_format.type"),
            (json!({"messages": msgs, "response_format": {"type": "json_schema"}}), "response_format.json_schema"),
            (json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}), "response_format.json_schema.name"),
            (json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}), "response_format.json_schema.schema"),
            (json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "shema": {}}}}), "response_format.json_schema.shema"),
            (json!({"messages": msgs, "response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}), "response_format"),
            (json!({"messages": msgs, "json_schema": {}, "grammar": "root ::= \"a\""}), "grammar"),
            (json!({"messages": msgs, "tool_choice": "required"}), "tool_choice"),
            (json!({"messages": msgs, "tool_choice": "sometimes"}), "tool_choice"),
            (json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}), "tools[0].function.strict"),
            (json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x-guidance": {}}}}], "tool_choice": "required"}), "tools[0].function.parameters.x-guidance"),
            (json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice"),
            (json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}], "tool_choice": "required"}), "tools[0].function.parameters.properties.a.type"),
            (json!({"messages": msgs, "presence_penalty": 3}), "presence_penalty"),
            (json!({"messages": msgs, "stop": ["ok", "x".repeat(2000)]}), "stop[1]"),
            (json!({"messages": msgs, "seed": "7"}), "seed"),
            (json!({"messages": msgs, "seed": 1.5}), "seed"),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(chat(body.clone()).unwrap_err()), param, "{body}");
        }
    }

    #[test]
    fn completion_prompts() {
        let c = |v: Json| completion_request(v.as_object().unwrap(), 1000, &RequestDefaults::default());
        assert_eq!(c(json!({"prompt": "hi"})).unwrap().prompt, Prompt::Text("hi".into()));
        assert_eq!(c(json!({"prompt": [1, 2]})).unwrap().prompt, Prompt::Ids(vec![1, 2]));
        assert_eq!(c(json!({"prompt": [[3]]})).unwrap().prompt, Prompt::Ids(vec![3]));
        assert_eq!(c(json!({"prompt": ["x"]})).unwrap().prompt, Prompt::Text("x".into()));
        assert_eq!(param_of(c(json!({"prompt": [1, 1000]})).unwrap_err()), "prompt[1]");
        assert_eq!(param_of(c(json!({"prompt": [1, -1]})).unwrap_err()), "prompt[1]");
        assert_eq!(param_of(c(json!({"prompt": ["a", "b"]})).unwrap_err()), "prompt");
        assert_eq!(param_of(c(json!({"prompt": ""})).unwrap_err()), "prompt");
        assert_eq!(param_of(c(json!({"prompt": "x", "logprobs": 2, "echo": true})).unwrap_err()), "echo");
        assert_eq!(c(json!({"prompt": "x", "logprobs": 2})).unwrap().opts.n_probs, Some(2));
    }
}
