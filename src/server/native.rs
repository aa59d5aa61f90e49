//! llama-server's native completion API: `POST /completion` (and `/completions`) and
//! `POST /infill`, with its request fields and response shapes.
//!
//! A request is read into the same [`GenOptions`] as OpenAI's endpoints (so sampling, limits,
//! stops and structured output mean the same), after its own fields are translated:
//! `n_predict`, `n_probs`, `logit_bias` as pairs or with text keys, `ignore_eos`. The prompt may
//! be text, token ids, a mixed array (one prompt), `{"prompt_string": …}`, or an array of those
//! (several prompts: the answer is an array, one object per prompt, generated side by side).
//!
//! The response is llama-server's object: `content`, `tokens` (with `return_tokens`),
//! `stop`, `stop_type` (`eos`, `word`, `limit`), `generation_settings`, `timings`,
//! `completion_probabilities` (with `n_probs`), and with `response_fields` only the fields
//! named (`a/b` reaches inside objects). A stream sends one `data:` object per token, then the
//! whole object with empty `content` and `stop: true`, and no `[DONE]`.

use std::sync::Arc;

use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::fields::{Fields, kind_of, parse_object};
use super::openai::{admit, blocking, body_bytes, check_context, compile, submit_generation};
use super::request::{GenOptions, LogprobsStyle, gen_options, token_ids};
use super::response::timings;
use super::slot::{Event, Finished};
use super::state::{AppState, Loaded};
use super::stream::{FrameMaker, FrameStream, ShutSignal};
use std::collections::VecDeque;
use crate::generate::{StopReason, TokenLogprobs};
use crate::tokenizer::Tokenizer;

/// The fields of llama-server's completion body that minfer reads, beside the OpenAI ones of
/// [`super::request`].
const NATIVE_FIELDS: &[&str] = &["prompt", "n_probs", "return_tokens", "ignore_eos", "response_fields"];
/// `/infill`'s own fields.
const INFILL_FIELDS: &[&str] = &["input_prefix", "input_suffix", "input_extra"];
/// Most prompts one request may hold.
const MAX_PROMPTS: usize = 16;

/// What one prompt of a native request becomes.
struct NativePrompt {
    ids: Vec<u32>,
    /// Prompt and its special tokens as text (`prompt` of the response).
    text: String,
}

/// A native request, read.
struct NativeRequest {
    prompts: Vec<NativePrompt>,
    opts: GenOptions,
    return_tokens: bool,
    ignore_eos: bool,
    /// `response_fields`: only these (paths) in the answer.
    fields: Vec<String>,
    /// Whether the prompt was a list of prompts (the answer is then a list).
    many: bool,
}

/// `logit_bias` in llama-server's forms — `[[id_or_text, bias], …]` or `{"id" | "text": bias}`,
/// `false` banning — as OpenAI's `{"id": bias}` object (a text key adds its tokens). Text keys
/// are tokenized without special tokens.
fn logit_bias(v: &Json, tok: &Tokenizer) -> Result<Json, ApiError> {
    let mut out = Map::new();
    let mut put = |key: &Json, bias: &Json, at: String| -> Result<(), ApiError> {
        let bias = match bias {
            Json::Bool(false) => -100.0,
            Json::Number(n) => n.as_f64().unwrap_or(0.0).clamp(-100.0, 100.0),
            other => return Err(ApiError::param(at, format!("a bias must be a number or false, got {}", kind_of(other)))),
        };
        let ids: Vec<u32> = match key {
            Json::Number(n) => vec![n.as_u64().filter(|&i| (i as usize) < tok.n_vocab()).ok_or_else(|| ApiError::param(at.clone(), "token ids must be below the vocabulary size"))? as u32],
            Json::String(s) => match s.parse::<u32>() {
                Ok(id) => vec![id],
                Err(_) => tok.encode(s, false),
            },
            other => return Err(ApiError::param(at, format!("a key must be a token id or a text, got {}", kind_of(other)))),
        };
        for id in ids {
            out.insert(id.to_string(), json!(bias));
        }
        Ok(())
    };
    match v {
        Json::Array(pairs) => {
            for (i, p) in pairs.iter().enumerate() {
                match p.as_array().map(Vec::as_slice) {
                    Some([key, bias]) => put(key, bias, format!("logit_bias[{i}]"))?,
                    _ => return Err(ApiError::param(format!("logit_bias[{i}]"), "must be a pair [token id or text, bias]")),
                }
            }
        }
        Json::Object(m) => {
            for (k, bias) in m {
                put(&Json::String(k.clone()), bias, "logit_bias".into())?;
            }
        }
        other => return Err(ApiError::param("logit_bias", format!("must be a list of pairs or an object, got {}", kind_of(other)))),
    }
    Ok(Json::Object(out))
}

/// One prompt value: text, ids, a mixed list of ids and texts, or `{"prompt_string"}`.
fn one_prompt(v: &Json, at: &str, tok: &Tokenizer) -> Result<NativePrompt, ApiError> {
    let ids = match v {
        Json::String(s) => tok.encode_prompt(s, true),
        Json::Array(items) => {
            let mut ids = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Json::Number(_) => ids.extend(token_ids(at, std::slice::from_ref(item), tok.n_vocab())?),
                    Json::String(s) if i == 0 => ids.extend(tok.encode_prompt(s, true)),
                    Json::String(s) => ids.extend(tok.encode(s, true)),
                    other => return Err(ApiError::param(format!("{at}[{i}]"), format!("must be a token id or a text, got {}", kind_of(other)))),
                }
            }
            ids
        }
        Json::Object(o) => {
            let f = Fields::new(o);
            if f.get("multimodal_data").is_some() {
                return Err(ApiError::param(format!("{at}.multimodal_data"), "multimodal data was given, but this model reads text only"));
            }
            if let Some(k) = o.keys().find(|k| k.as_str() != "prompt_string" && k.as_str() != "multimodal_data") {
                return Err(ApiError::param(format!("{at}.{}", super::error::bounded(k)), "is not a field of a prompt object (prompt_string)"));
            }
            let s = f.str("prompt_string")?.ok_or_else(|| ApiError::param(format!("{at}.prompt_string"), "is required"))?;
            tok.encode_prompt(s, true)
        }
        other => return Err(ApiError::param(at, format!("must be a text, token ids, or a prompt object, got {}", kind_of(other)))),
    };
    if ids.is_empty() {
        return Err(ApiError::param(at, "must not be empty"));
    }
    let text = tok.detokenize(&ids, true).map_err(|e| ApiError::param(at, e.to_string()))?;
    Ok(NativePrompt { ids, text })
}

/// The prompts: a list whose items are all ids or texts (at least one id) is one prompt; any
/// other list is several.
fn prompts(v: Option<&Json>, tok: &Tokenizer) -> Result<(Vec<NativePrompt>, bool), ApiError> {
    let v = v.ok_or_else(|| ApiError::param("prompt", "is required"))?;
    match v {
        Json::Array(items) if items.is_empty() => Err(ApiError::param("prompt", "must not be empty")),
        Json::Array(items) if items.iter().any(Json::is_number) && items.iter().all(|i| i.is_number() || i.is_string()) => {
            Ok((vec![one_prompt(v, "prompt", tok)?], false))
        }
        Json::Array(items) if items.len() > MAX_PROMPTS => Err(ApiError::param("prompt", format!("holds {} prompts; at most {MAX_PROMPTS}", items.len()))),
        Json::Array(items) => Ok((items.iter().enumerate().map(|(i, p)| one_prompt(p, &format!("prompt[{i}]"), tok)).collect::<Result<_, _>>()?, true)),
        _ => Ok((vec![one_prompt(v, "prompt", tok)?], false)),
    }
}

/// Reads a native body (blocking: it tokenizes). `infill` builds the fill-in-the-middle prompt.
fn native_request(body: &Map<String, Json>, m: &Loaded, st: &AppState, infill: bool) -> Result<NativeRequest, ApiError> {
    let tok = &m.tok;
    let mut body = body.clone();
    // llama-server's names for OpenAI's: n_probs is completions' logprobs.
    if let Some(n) = body.remove("n_probs") {
        if body.contains_key("logprobs") {
            return Err(ApiError::param("n_probs", "and 'logprobs' name the same thing: give one"));
        }
        body.insert("logprobs".into(), n);
    }
    let ignore_eos = Fields::new(&body).bool("ignore_eos")?.unwrap_or(false);
    let mut bias = match body.remove("logit_bias") {
        None | Some(Json::Null) => Map::new(),
        Some(v) => match logit_bias(&v, tok)? {
            Json::Object(o) => o,
            _ => Map::new(),
        },
    };
    if ignore_eos {
        for id in tok.eog_ids() {
            bias.insert(id.to_string(), json!(-100));
        }
    }
    if !bias.is_empty() {
        body.insert("logit_bias".into(), Json::Object(bias));
    }
    let f = Fields::new(&body);
    let mut known: Vec<&[&str]> = vec![super::request::GEN_FIELDS, NATIVE_FIELDS, &["logprobs", "logit_bias"]];
    if infill {
        known.push(INFILL_FIELDS);
    }
    super::request::refuse_unknown(&body, &known)?;
    let (prompts, many) = if infill { (vec![infill_prompt(&f, tok)?], false) } else { prompts(f.get("prompt"), tok)? };
    let opts = gen_options(&f, LogprobsStyle::Legacy, m.n_vocab, &st.cfg.defaults)?;
    if opts.n > 1 {
        return Err(ApiError::param("n", "must be 1 on /completion: send several prompts instead"));
    }
    if many && opts.stream {
        return Err(ApiError::param("stream", "cannot stream several prompts: send them one by one"));
    }
    let fields = match f.get("response_fields") {
        None => Vec::new(),
        Some(Json::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().map(str::to_string).ok_or_else(|| ApiError::param(format!("response_fields[{i}]"), "must be a text")))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(ApiError::param("response_fields", format!("must be a list of field paths, got {}", kind_of(v)))),
    };
    Ok(NativeRequest { prompts, return_tokens: f.bool("return_tokens")?.unwrap_or(false), ignore_eos, fields, many, opts })
}

/// `/infill`: `[fim_prefix] input_prefix [fim_suffix] input_suffix [fim_middle] prompt`, with the
/// model's fill-in-the-middle tokens (a model without them gets a 400).
fn infill_prompt(f: &Fields, tok: &Tokenizer) -> Result<NativePrompt, ApiError> {
    let [pre, suf, mid, ..] = tok.fim_ids();
    let (Some(pre), Some(suf), Some(mid)) = (pre, suf, mid) else {
        return Err(ApiError::param("input_prefix", "this model has no fill-in-the-middle tokens (prefix, suffix, middle), so /infill cannot be served"));
    };
    if f.get("input_extra").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(ApiError::param("input_extra", "is not supported yet: give the context in input_prefix"));
    }
    let prefix = f.str("input_prefix")?.unwrap_or("");
    let suffix = f.str("input_suffix")?.unwrap_or("");
    let prompt = match f.get("prompt") {
        None => "",
        Some(Json::String(s)) => s.as_str(),
        Some(v) => return Err(ApiError::param("prompt", format!("must be a text on /infill, got {}", kind_of(v)))),
    };
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.extend(tok.bos_id());
    }
    ids.push(pre);
    ids.extend(tok.encode(prefix, false));
    ids.push(suf);
    ids.extend(tok.encode(suffix, false));
    ids.push(mid);
    ids.extend(tok.encode(prompt, false));
    let text = tok.detokenize(&ids, true).map_err(|e| ApiError::param("input_prefix", e.to_string()))?;
    Ok(NativePrompt { ids, text })
}

/// One token's probabilities in llama-server's shape: log-probabilities, or with
/// `post_sampling_probs` the probabilities themselves (`prob`, `top_probs`).
fn probs_json(tok: &Tokenizer, l: &TokenLogprobs, post: bool) -> Json {
    let entry = |id: u32, logprob: f32| {
        let bytes = tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
        let mut e = json!({"id": id, "token": String::from_utf8_lossy(&bytes), "bytes": bytes});
        if post {
            e["prob"] = json!(logprob.exp());
        } else {
            e["logprob"] = json!(if logprob.is_finite() { logprob } else { -f32::MAX });
        }
        e
    };
    let mut e = entry(l.id, l.logprob);
    e[if post { "top_probs" } else { "top_logprobs" }] = Json::Array(l.top.iter().map(|&(id, p)| entry(id, p)).collect());
    e
}

/// llama-server's `prompt_progress`.
pub fn progress_json(p: &super::slot::Progress) -> Json {
    json!({"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms})
}

/// llama-server's `stop_type`.
fn stop_type(r: StopReason) -> &'static str {
    match r {
        StopReason::EndOfGeneration => "eos",
        StopReason::StopString => "word",
        StopReason::MaxTokens | StopReason::ContextFull => "limit",
    }
}

/// What every answer object of a request repeats.
struct Shape<'a> {
    m: &'a Loaded,
    req: &'a NativeRequest,
}

impl Shape<'_> {
    fn generation_settings(&self) -> Json {
        let o = &self.req.opts;
        let s = &o.sampler;
        let bias: Vec<Json> = s.logit_bias.iter().map(|&(id, b)| json!({"token": id, "bias": if b.is_finite() { json!(b) } else { Json::Null }})).collect();
        json!({
            "n_predict": o.max_tokens.map_or(-1, |n| n as i64),
            "max_tokens": o.max_tokens.map_or(-1, |n| n as i64),
            "seed": s.seed,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": s.penalty_last_n,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "stop": o.stop,
            "stream": o.stream,
            "n_probs": o.n_probs.unwrap_or(0),
            "ignore_eos": self.req.ignore_eos,
            "logit_bias": bias,
            "timings_per_token": o.timings_per_token,
        })
    }

    /// The whole answer for one prompt (`content` empty in a stream's last object).
    fn object(&self, index: usize, p: &NativePrompt, content: &str, ids: &[u32], probs: Option<Vec<Json>>, f: &Finished) -> Json {
        let mut v = json!({
            "index": index,
            "content": content,
            "tokens": if self.req.return_tokens { ids.to_vec() } else { Vec::new() },
            "stop": true,
            "model": self.m.model_id,
            "tokens_predicted": f.completion_tokens,
            "tokens_evaluated": f.prompt_tokens,
            "generation_settings": self.generation_settings(),
            "prompt": p.text,
            "has_new_line": content.contains('\n'),
            "truncated": f.reason == StopReason::ContextFull,
            "stop_type": stop_type(f.reason),
            "stopping_word": "",
            "tokens_cached": f.prompt_tokens + f.completion_tokens,
            "timings": timings(f),
        });
        if let Some(p) = probs {
            v["completion_probabilities"] = Json::Array(p);
        }
        pick_fields(v, &self.req.fields)
    }
}

/// With `response_fields`, only the paths named (`a/b`: key `b` of object `a`), each under its
/// path; paths that lead nowhere are left out, as llama-server leaves them.
fn pick_fields(v: Json, fields: &[String]) -> Json {
    if fields.is_empty() {
        return v;
    }
    let mut out = Map::new();
    for path in fields {
        let found = path.split('/').try_fold(&v, |at, key| at.get(key));
        if let Some(x) = found {
            out.insert(path.clone(), x.clone());
        }
    }
    Json::Object(out)
}

pub async fn completion(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    serve(st, body, false).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn infill(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    serve(st, body, true).await.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(st: Arc<AppState>, body: Result<Bytes, BytesRejection>, infill: bool) -> Result<Response, ApiError> {
    let (m, ticket) = admit(&st)?;
    let obj = parse_object(&body_bytes(body)?)?;
    let st2 = st.clone();
    let (req, grammar) = blocking(move || {
        let m = st2.model()?;
        let req = native_request(&obj, m, &st2, infill)?;
        let grammar = compile(&st2, req.opts.structured.as_ref())?;
        Ok((req, grammar))
    })
    .await?;
    for p in &req.prompts {
        check_context(m, p.ids.len(), &req.opts)?;
    }
    // One slot per prompt: the first ticket was taken before the body was read.
    let mut tickets = vec![ticket];
    for _ in 1..req.prompts.len() {
        tickets.push(st.admission.try_admit()?);
    }
    let mut rxs = Vec::with_capacity(req.prompts.len());
    for (p, t) in req.prompts.iter().zip(tickets) {
        rxs.push(submit_generation(&st, m, &p.ids, &p.text, &req.opts, grammar.clone(), t)?);
    }
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    let shape = Shape { m, req: &req };
    if req.opts.stream {
        let mut rx = rxs.pop().ok_or_else(|| ApiError::Internal("no generation was submitted".into()))?;
        let first = super::stream::first_event(&mut shut, &mut rx).await?;
        let mut s = FrameStream::with(rx, shut, NativeFrames { req: Arc::new(req), st: st.clone() });
        s.push(first);
        return Ok(s.into_response_as("text/event-stream"));
    }
    let mut answers = Vec::with_capacity(rxs.len());
    for (i, (rx, p)) in rxs.iter_mut().zip(&req.prompts).enumerate() {
        answers.push(collect(&shape, i, p, &mut shut, rx).await?);
    }
    Ok(if req.many { AxJson(Json::Array(answers)) } else { AxJson(answers.pop().unwrap_or(Json::Null)) }.into_response())
}

async fn collect(shape: &Shape<'_>, index: usize, p: &NativePrompt, shut: &mut ShutSignal, rx: &mut UnboundedReceiver<Event>) -> Result<Json, ApiError> {
    let (mut text, mut ids, mut probs) = (String::new(), Vec::new(), Vec::new());
    let tok = &shape.m.tok;
    while let Some(ev) = shut.next_event(rx).await? {
        match ev {
            // Generations get no replies (those answer embeddings and slot actions).
            Event::Progress(_) | Event::Reply(_) => {}
            Event::Token(t) => {
                text.push_str(&t.text);
                if !tok.is_eog(t.id) {
                    ids.push(t.id);
                    if let Some(l) = &t.logprobs {
                        probs.push(probs_json(tok, l, shape.req.opts.post_sampling_probs));
                    }
                }
            }
            Event::Done(f) => {
                let probs = shape.req.opts.n_probs.map(|_| probs);
                return Ok(shape.object(index, p, &text, &ids, probs, &f));
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::Internal("the generation ended without a result".into()))
}

/// Frames for one event of a native stream; true when it ended the stream.
fn stream_event(shape: &Shape<'_>, ev: Event, frames: &mut VecDeque<Bytes>) -> bool {
    let frame = |v: &Json| Bytes::from(format!("data: {v}\n\n"));
    match ev {
        Event::Reply(_) => false,
        Event::Progress(p) => {
            let mut v = json!({"index": 0, "content": "", "tokens": [], "stop": false, "prompt_progress": progress_json(&p)});
            if shape.req.opts.timings_per_token {
                v["timings"] = timings(&p.so_far);
            }
            frames.push_back(frame(&v));
            false
        }
        Event::Token(t) => {
            let tok = &shape.m.tok;
            if tok.is_eog(t.id) {
                return false;
            }
            let mut v = json!({
                "index": 0,
                "content": t.text,
                "tokens": [t.id],
                "stop": false,
                "tokens_predicted": t.so_far.completion_tokens,
                "tokens_evaluated": t.so_far.prompt_tokens,
            });
            if let (Some(_), Some(l)) = (shape.req.opts.n_probs, &t.logprobs) {
                v["completion_probabilities"] = json!([probs_json(tok, l, shape.req.opts.post_sampling_probs)]);
            }
            if shape.req.opts.timings_per_token {
                v["timings"] = timings(&t.so_far);
            }
            frames.push_back(frame(&v));
            false
        }
        Event::Done(f) => {
            let p = &shape.req.prompts[0];
            frames.push_back(frame(&shape.object(0, p, "", &[], None, &f)));
            true
        }
        Event::Failed(e) => {
            frames.push_back(frame(&e.to_json()));
            true
        }
    }
}

/// A native stream's frames: owns what they need, since the body outlives the handler.
struct NativeFrames {
    req: Arc<NativeRequest>,
    st: Arc<AppState>,
}

impl FrameMaker for NativeFrames {
    fn make(&mut self, ev: Event, out: &mut VecDeque<Bytes>) -> bool {
        let Ok(m) = self.st.model() else { return true };
        stream_event(&Shape { m, req: &self.req }, ev, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_fields_pick_paths() {
        let v = json!({"content": "x", "generation_settings": {"n_predict": 32, "seed": 1}, "prompt": "p", "tokens": []});
        let fields = vec!["content".to_string(), "generation_settings/n_predict".to_string(), "prompt".to_string(), "nope/x".to_string()];
        assert_eq!(pick_fields(v.clone(), &fields), json!({"content": "x", "generation_settings/n_predict": 32, "prompt": "p"}));
        assert_eq!(pick_fields(v.clone(), &[]), v);
    }
}
