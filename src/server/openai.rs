//! `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! Order of work per request: the drain check (503 once SIGTERM came), admission (503 when
//! full, before anything is parsed or tokenized), the body, the prompt (template render and
//! tokenization off the async runtime), the context check — the prompt, and the prompt plus
//! `max_tokens`, against the slot's context (400 `exceed_context_size_error`, also for
//! streams: nothing is sent before the first result) — then the request goes to the
//! inference thread. A stream's
//! status line waits for the first event, so an error in prefill is still a plain error
//! response.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::unbounded_channel;

use super::admission::Ticket;
use super::error::{ApiError, bounded_to};
use super::fields::parse_object;
use super::request::{GenOptions, Prompt, chat_request, completion_request};
use super::response::{Api, Logprobs, Meta, new_id};
use super::slot::{Event, Job};
use super::state::{AppState, Loaded, unix_now};
use super::stream::{EventStream, ShutSignal, StreamOptions};
use super::tools::ToolCallSplitter;
use crate::generate::GenerateParams;
use crate::grammar::Grammar;

/// Longest template error message passed back (it may quote the conversation).
const TEMPLATE_ERROR_LIMIT: usize = 200;

/// The body, or the reason it could not be read.
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(_) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::BodyTooLarge { limit: super::routes::BODY_LIMIT }
        }
        other => ApiError::MalformedJson(other.body_text()),
    })
}

/// What a request becomes before it reaches a slot.
struct Prepared {
    ids: Vec<u32>,
    /// The prompt as text (for the fault-injection lever and completions' `echo`).
    text: String,
    echo: bool,
    /// Tools were offered: parse `<tool_call>` blocks out of the answer.
    tools: bool,
    opts: GenOptions,
    /// The compiled constraint of structured output.
    grammar: Option<Grammar>,
}

/// Runs blocking work (template render, tokenization) off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(format!("prompt preparation failed: {e}")))?
}

/// The request's constraint compiled against the model's vocabulary (blocking).
fn compile(st: &AppState, structured: Option<&super::structured::Structured>) -> Result<Option<Grammar>, ApiError> {
    let Some(s) = structured else { return Ok(None) };
    let vocab = st.model()?.grammar_vocab()?;
    s.compile(&vocab).map(Some)
}

pub async fn chat_completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let req = chat_request(&parse_object(&body_bytes(body)?)?, m.n_vocab)?;
        let template = m.template.clone().ok_or_else(|| {
            ApiError::param("messages", "this model has no chat template; use --chat-template FILE or a raw prompt (/v1/completions)")
        })?;
        let tools = req.tools.is_some();
        let opts = m.render_options(req.tools, req.template_kwargs);
        let tok = m.tok.clone();
        let messages = req.messages;
        let (st2, structured) = (st.clone(), req.opts.structured.clone());
        let (ids, text, grammar) = blocking(move || {
            let grammar = compile(&st2, structured.as_ref())?;
            let text = template
                .render(&messages, &opts)
                .map_err(|e| ApiError::param("messages", format!("the chat template refused them: {}", bounded_to(&e.to_string(), TEMPLATE_ERROR_LIMIT))))?;
            Ok((tok.encode_prompt(&text, true), text, grammar))
        })
        .await?;
        generate(&st, m, ticket, Prepared { ids, text, echo: false, tools, opts: req.opts, grammar }, Api::Chat).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// What both generation endpoints do first: the model must be loaded, the server not
/// draining, and a place free (503 otherwise, before the body is parsed).
fn admit(st: &AppState) -> Result<(&Loaded, Ticket), ApiError> {
    let m = st.model()?;
    if st.lifecycle.draining() {
        return Err(ApiError::Draining);
    }
    Ok((m, st.admission.try_admit()?))
}

pub async fn completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let req = completion_request(&parse_object(&body_bytes(body)?)?, m.n_vocab)?;
        let tok = m.tok.clone();
        let (st2, structured) = (st.clone(), req.opts.structured.clone());
        let (ids, text, grammar) = blocking(move || {
            let grammar = compile(&st2, structured.as_ref())?;
            let (ids, text) = match req.prompt {
                // llama-server parses special tokens in a text prompt.
                Prompt::Text(t) => (tok.encode_prompt(&t, true), t),
                Prompt::Ids(ids) => {
                    let text = tok.decode(&ids).map_err(|e| ApiError::param("prompt", e.to_string()))?;
                    (ids, text)
                }
            };
            Ok((ids, text, grammar))
        })
        .await?;
        generate(&st, m, ticket, Prepared { ids, text, echo: req.echo, tools: false, opts: req.opts, grammar }, Api::Completion).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

async fn generate(st: &AppState, m: &Loaded, ticket: Ticket, p: Prepared, api: Api) -> Result<Response, ApiError> {
    if p.ids.len() > m.n_ctx_slot {
        return Err(ApiError::ExceedContext { n_prompt_tokens: p.ids.len(), n_ctx: m.n_ctx_slot });
    }
    if let Some(max_tokens) = p.opts.max_tokens.filter(|&n| p.ids.len() + n > m.n_ctx_slot) {
        return Err(ApiError::ExceedContextWithCompletion { n_prompt_tokens: p.ids.len(), max_tokens, n_ctx: m.n_ctx_slot });
    }
    let timeout = st.cfg.timeout_secs;
    let params = GenerateParams {
        max_tokens: p.opts.max_tokens.unwrap_or(m.n_ctx_slot),
        sampler: p.opts.sampler.clone(),
        stop: p.opts.stop.clone(),
        ubatch: Some(st.cfg.ubatch),
        n_probs: p.opts.n_probs,
        grammar: p.grammar,
    };
    let (tx, mut rx) = unbounded_channel();
    // A limit too far away to represent is no limit.
    let deadline = (timeout > 0).then(|| Instant::now().checked_add(Duration::from_secs(timeout))).flatten();
    let inject_panic = st.cfg.inject_panic.as_deref().is_some_and(|s| p.text.contains(s));
    m.inference.submit(Job {
        prompt: p.ids,
        params,
        events: tx,
        deadline,
        timeout_secs: timeout,
        inject_panic,
        cache_prompt: p.opts.cache_prompt,
        ticket,
    })?;
    let meta = Meta { id: new_id(api), created: unix_now(), model: m.model_id.clone(), api };
    let prefix = if p.echo { p.text } else { String::new() };
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    if p.opts.stream {
        // Nothing is sent before the first event: an error in prefill is a plain response.
        let first = shut.next_event(&mut rx).await?.ok_or_else(|| ApiError::Internal("the generation ended without a result".into()))?;
        if let Event::Failed(e) = first {
            return Err(e);
        }
        let opts = StreamOptions { include_usage: p.opts.include_usage, prefix, tools: p.tools };
        let mut s = EventStream::new(rx, m.tok.clone(), meta, opts, shut);
        s.push(first);
        return Ok(s.into_response());
    }
    let mut text = prefix;
    let mut logprobs = Logprobs::default();
    let offset0 = text.len();
    while let Some(ev) = shut.next_event(&mut rx).await? {
        match ev {
            Event::Token(t) => {
                text.push_str(&t.text);
                logprobs.push(&m.tok, &t);
            }
            Event::Done(f) => {
                let lp = p.opts.n_probs.map(|_| logprobs.to_json(&m.tok, api, offset0));
                let (text, calls) = if p.tools {
                    let mut split = ToolCallSplitter::default();
                    let shown = split.push(&text);
                    let (tail, calls) = split.finish();
                    (shown + &tail, calls)
                } else {
                    (text, Vec::new())
                };
                return Ok(AxJson(meta.complete(&text, &calls, lp, &f)).into_response());
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::Internal("the generation ended without a result".into()))
}
