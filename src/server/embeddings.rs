//! Embeddings: OpenAI's `POST /v1/embeddings` (and `/embeddings`), llama-server's
//! `POST /embedding`, Ollama's `POST /api/embed` and its older `POST /api/embeddings`.
//!
//! An input's vector is its final hidden states pooled the server's way (`--pooling`, else the
//! model's `pooling_type`, else the last token: see [`crate::generate::embed`]), then scaled
//! the way llama-server's `embd_normalize` says (default 2: unit Euclidean length; -1: raw).
//! Every input of a request is embedded on one slot, one after another, in one scheduler round;
//! the slot's KV then holds the last input (a later prompt sharing its prefix reuses it).
//!
//! - OpenAI: `input` (a string, token ids, or a list of either), `encoding_format` (`float`,
//!   or `base64`: little-endian f32 bytes, the official clients' default), `dimensions` (only
//!   the model's own width: minfer does not truncate vectors), `model` and `user` (read, not
//!   used), and llama-server's `embd_normalize`. Pooling `none` has no single vector: a 400, as
//!   llama-server's.
//! - llama-server: `content` (or `input`) as above, `embd_normalize`; answers
//!   `[{"index", "embedding": [[...]]}]`, one vector per token with pooling `none` (never
//!   normalised then, as llama-server).
//! - Ollama: `/api/embed` (`input` text or texts, `truncate`, `dimensions`, `options`,
//!   `keep_alive`; vectors of unit length, as Ollama's) and `/api/embeddings` (`prompt`; the
//!   raw vector).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json, json};
use tokio::sync::mpsc::unbounded_channel;

use super::admission::Ticket;
use super::error::ApiError;
use super::fields::{Fields, kind_of, parse_object};
use super::openai::{admit, blocking, body_bytes};
use super::request::{refuse_unknown_in, token_ids};
use super::slot::{Embedded, Event, Job, Reply, Work};
use super::state::{AppState, Loaded};
use super::stream::{ShutSignal, first_event};
use crate::generate::{Pooling, normalize};

const OPENAI_FIELDS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user", "embd_normalize"];
const NATIVE_FIELDS: &[&str] = &["content", "input", "model", "embd_normalize", "encoding_format"];
const OLLAMA_EMBED_FIELDS: &[&str] = &["model", "input", "truncate", "dimensions", "options", "keep_alive"];
const OLLAMA_EMBEDDINGS_FIELDS: &[&str] = &["model", "prompt", "options", "keep_alive"];

/// One input: text (tokenized as llama.cpp does with `add_special`) or token ids.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// `v` as inputs: a string, an array of token ids, or an array of those (at least one).
fn inputs(param: &str, v: &Json, n_vocab: usize) -> Result<Vec<Input>, ApiError> {
    let one = |p: &str, v: &Json| match v {
        Json::String(s) => Ok(Input::Text(s.clone())),
        Json::Array(items) if items.iter().all(Json::is_number) => Ok(Input::Ids(token_ids(p, items, n_vocab)?)),
        other => Err(ApiError::param(p, format!("must be a string or an array of token ids, got {}", kind_of(other)))),
    };
    match v {
        Json::Array(items) if items.is_empty() => Err(ApiError::param(param, "must not be empty")),
        Json::Array(items) if !items.iter().all(Json::is_number) => items.iter().enumerate().map(|(i, x)| one(&format!("{param}[{i}]"), x)).collect(),
        other => Ok(vec![one(param, other)?]),
    }
}

/// `embd_normalize`: an integer (-1 none, 0 int16 range, 2 Euclidean, p: p-norm).
fn norm_field(f: &Fields<'_>) -> Result<i32, ApiError> {
    Ok(f.int_in("embd_normalize", -1, 64)?.map_or(2, |n| n as i32))
}

/// What one request asks, whichever API it came by.
struct EmbedRequest {
    inputs: Vec<Input>,
    /// Over the context: cut to it (Ollama's `truncate`, default on), else a 400.
    truncate: bool,
}

/// Tokenizes, checks and embeds the request's inputs on a slot; per input, its vectors and
/// token count.
async fn run(st: &Arc<AppState>, m: &Loaded, ticket: Ticket, req: EmbedRequest) -> Result<Embedded, ApiError> {
    let pooling = m.pooling.clone().map_err(|why| ApiError::param("input", why))?;
    let tok = m.tok.clone();
    let n_ctx = m.n_ctx_slot;
    let ids = blocking(move || {
        let mut all = Vec::with_capacity(req.inputs.len());
        for input in req.inputs {
            let mut ids = match input {
                Input::Text(t) => tok.encode_input(&t),
                Input::Ids(ids) => ids,
            };
            if ids.is_empty() {
                return Err(ApiError::param("input", "Input content cannot be empty"));
            }
            if ids.len() > n_ctx {
                if !req.truncate {
                    return Err(ApiError::ExceedContext { n_prompt_tokens: ids.len(), n_ctx });
                }
                ids.truncate(n_ctx);
            }
            all.push(ids);
        }
        Ok(all)
    })
    .await?;
    let (tx, mut rx) = unbounded_channel();
    let timeout = st.cfg.timeout_secs;
    let deadline = (timeout > 0).then(|| Instant::now().checked_add(Duration::from_secs(timeout))).flatten();
    let inject_panic = st.cfg.inject_panic.as_deref().is_some_and(|s| ids.iter().any(|i| m.tok.decode(i).is_ok_and(|t| t.contains(s))));
    m.inference.submit(Job {
        prompt: Vec::new(),
        work: Work::Embed { inputs: ids, pooling },
        events: tx,
        deadline,
        timeout_secs: timeout,
        inject_panic,
        cache_prompt: false,
        return_progress: false,
        slot: None,
        ticket,
    })?;
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    match first_event(&mut shut, &mut rx).await? {
        Event::Reply(Reply::Embedded(e)) => Ok(e),
        Event::Failed(e) => Err(e),
        _ => Err(ApiError::Internal("the embedding ended without a result".into())),
    }
}

/// Each input's single vector, scaled by `norm`; pooling none has none.
fn pooled(e: Embedded, norm: i32, endpoint: &str) -> Result<Vec<Vec<f32>>, ApiError> {
    e.vectors
        .into_iter()
        .map(|mut v| match v.len() {
            1 => {
                let mut x = v.remove(0);
                normalize(&mut x, norm);
                Ok(x)
            }
            _ => Err(ApiError::param("input", format!("Pooling type 'none' is not OAI compatible. Please use a different pooling type (this server runs with --pooling none: use /embedding; {endpoint} needs one vector per input)"))),
        })
        .collect()
}

/// `POST /v1/embeddings`: OpenAI's shape.
pub async fn openai(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let obj = parse_object(&body_bytes(body)?)?;
        refuse_unknown_in(&obj, &[OPENAI_FIELDS], &[], Json::is_null)?;
        let f = Fields::new(&obj);
        let input = f.get("input").ok_or_else(|| ApiError::param("input", "\"input\" or \"content\" must be provided"))?;
        let inputs = inputs("input", input, m.n_vocab)?;
        let base64 = match f.str("encoding_format")? {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => return Err(ApiError::param("encoding_format", format!("must be \"float\" or \"base64\", got {other:?}"))),
        };
        check_dimensions(&f, m)?;
        let norm = norm_field(&f)?;
        if m.pooling == Ok(Pooling::None) {
            return Err(ApiError::param("input", "Pooling type 'none' is not OAI compatible. Please use a different pooling type"));
        }
        let done = run(&st, m, ticket, EmbedRequest { inputs, truncate: false }).await?;
        let n_tokens: usize = done.n_tokens.iter().sum();
        let data: Vec<Json> = pooled(done, norm, "/v1/embeddings")?
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 { json!(crate::http::base64::encode(&le_bytes(&v))) } else { json!(v) };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        let model = f.str("model")?.map_or_else(|| m.model_id.clone(), str::to_string);
        Ok::<_, ApiError>(AxJson(json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }))
        .into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// `dimensions`: vectors are the model's width; another width is refused (not truncated).
fn check_dimensions(f: &Fields<'_>, m: &Loaded) -> Result<(), ApiError> {
    match f.int_in("dimensions", 1, i64::from(u32::MAX))? {
        Some(d) if d as usize != m.n_embd => Err(ApiError::param("dimensions", format!("this model's embeddings have {} dimensions; minfer does not shorten them", m.n_embd))),
        _ => Ok(()),
    }
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `POST /embedding`: llama-server's native shape, every token's vector with pooling none.
pub async fn native(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let obj = parse_object(&body_bytes(body)?)?;
        refuse_unknown_in(&obj, &[NATIVE_FIELDS], &[], Json::is_null)?;
        let f = Fields::new(&obj);
        let (name, input) = match (f.get("content"), f.get("input")) {
            (Some(v), _) => ("content", v),
            (None, Some(v)) => ("input", v),
            (None, None) => return Err(ApiError::param("input", "\"input\" or \"content\" must be provided")),
        };
        let inputs = inputs(name, input, m.n_vocab)?;
        if f.str("encoding_format")?.is_some_and(|e| e != "float") {
            return Err(ApiError::param("encoding_format", "the native endpoint answers floats (use /v1/embeddings for base64)"));
        }
        let norm = norm_field(&f)?;
        let done = run(&st, m, ticket, EmbedRequest { inputs, truncate: false }).await?;
        let items: Vec<Json> = done
            .vectors
            .into_iter()
            .enumerate()
            .map(|(i, mut vs)| {
                if vs.len() == 1 {
                    normalize(&mut vs[0], norm);
                }
                json!({"index": i, "embedding": vs})
            })
            .collect();
        Ok::<_, ApiError>(AxJson(Json::Array(items)).into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// Ollama's `options` on an embedding: its sampling options change nothing here (as in
/// Ollama); `num_ctx` may not exceed the slot's context; anything else is refused by name.
fn ollama_options(f: &Fields<'_>, m: &Loaded) -> Result<(), ApiError> {
    let Some(o) = f.object("options")? else { return Ok(()) };
    for (k, v) in o.iter().filter(|(_, v)| !v.is_null()) {
        if k == "num_ctx" {
            if v.as_u64().is_some_and(|n| n as usize <= m.n_ctx_slot) {
                continue;
            }
            return Err(ApiError::param("options.num_ctx", format!("must be at most the server's context per slot, {} (--ctx / --slots)", m.n_ctx_slot)));
        }
        if !super::ollama::is_option(k) {
            return Err(ApiError::Unsupported { field: format!("options.{}", super::error::bounded(k)), why: " (unknown or not implemented option)" });
        }
    }
    Ok(())
}

/// Ollama's error shape.
fn ollama_error(e: ApiError) -> Response {
    (e.status(), AxJson(json!({ "error": e.to_string() }))).into_response()
}

fn ollama_body(body: Result<Bytes, BytesRejection>, fields: &[&str]) -> Result<Map<String, Json>, ApiError> {
    let obj = parse_object(&body_bytes(body)?)?;
    refuse_unknown_in(&obj, &[fields], &[], Json::is_null)?;
    Ok(obj)
}

/// `POST /api/embed`: Ollama's current endpoint, unit-length vectors.
pub async fn ollama_embed(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = Instant::now();
    let r = async {
        let (m, ticket) = admit(&st)?;
        let obj = ollama_body(body, OLLAMA_EMBED_FIELDS)?;
        let f = Fields::new(&obj);
        ollama_options(&f, m)?;
        check_dimensions(&f, m)?;
        let inputs = match f.get("input") {
            None => return Err(ApiError::param("input", "is required")),
            Some(v @ (Json::String(_) | Json::Array(_))) if v.as_array().is_none_or(|a| a.iter().all(Json::is_string)) => inputs("input", v, m.n_vocab)?,
            Some(v) => return Err(ApiError::param("input", format!("must be a string or an array of strings, got {}", kind_of(v)))),
        };
        let truncate = f.bool("truncate")?.unwrap_or(true);
        let done = run(&st, m, ticket, EmbedRequest { inputs, truncate }).await?;
        let n_tokens: usize = done.n_tokens.iter().sum();
        let vectors = pooled(done, 2, "/api/embed")?;
        Ok::<_, ApiError>(AxJson(json!({
            "model": f.str("model")?.unwrap_or(&m.model_id),
            "embeddings": vectors,
            "total_duration": t0.elapsed().as_nanos() as u64,
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }))
        .into_response())
    };
    r.await.unwrap_or_else(ollama_error)
}

/// `POST /api/embeddings`: Ollama's older endpoint, one raw vector.
pub async fn ollama_embeddings(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let obj = ollama_body(body, OLLAMA_EMBEDDINGS_FIELDS)?;
        let f = Fields::new(&obj);
        ollama_options(&f, m)?;
        let prompt = f.str("prompt")?.ok_or_else(|| ApiError::param("prompt", "is required"))?;
        let done = run(&st, m, ticket, EmbedRequest { inputs: vec![Input::Text(prompt.to_string())], truncate: true }).await?;
        let vector = pooled(done, -1, "/api/embeddings")?.pop().unwrap_or_default();
        Ok::<_, ApiError>(AxJson(json!({ "embedding": vector })).into_response())
    };
    r.await.unwrap_or_else(ollama_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_shape() {
        let n = |v: Json| inputs("input", &v, 100).map(|x| x.len());
        assert_eq!(n(json!("hi")).unwrap(), 1);
        assert_eq!(n(json!([1, 2, 3])).unwrap(), 1);
        assert_eq!(n(json!(["a", "b"])).unwrap(), 2);
        assert_eq!(n(json!([[1, 2], "b", [3]])).unwrap(), 3);
        assert!(n(json!([])).is_err());
        assert!(n(json!(5)).is_err());
        assert!(n(json!([[1, 200]])).is_err_and(|e| e.to_string().contains("input[0][1]")));
        assert!(n(json!([{"a": 1}])).is_err());
    }
}
