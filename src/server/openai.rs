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
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::admission::Ticket;
use super::error::{ApiError, bounded_to};
use super::fields::parse_object;
use super::request::{GenOptions, Prompt, chat_request, completion_request};
use super::response::{Api, Logprobs, Meta, new_id};
use super::slot::{Event, Job, Work};
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
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(format!("prompt preparation failed: {e}")))?
}

/// The request's constraint compiled against the model's vocabulary (blocking).
pub fn compile(st: &AppState, structured: Option<&super::structured::Structured>) -> Result<Option<Grammar>, ApiError> {
    let Some(s) = structured else { return Ok(None) };
    let vocab = st.model()?.grammar_vocab()?;
    s.compile(&vocab).map(Some)
}

pub async fn chat_completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let req = chat_request(&parse_object(&body_bytes(body)?)?, m.n_vocab, &st.cfg.defaults)?;
        let tools = req.tools.is_some();
        let structured = req.opts.structured.clone();
        let (messages, tools_json, kwargs, continue_final) = (req.messages, req.tools, req.template_kwargs, req.continue_final);
        let (ids, text, grammar) =
            prepare_prompt(&st, structured, move |m| render_chat(m, &messages, tools_json, kwargs, continue_final)).await?;
        generate(&st, m, ticket, Prepared { ids, text, echo: false, tools, opts: req.opts, grammar }, Api::Chat).await
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// A prompt made off the runtime: its text (`text`: a template render, say), its tokens
/// (special tokens parsed, as llama-server does), and the request's constraint compiled.
pub async fn prepare_prompt(
    st: &Arc<AppState>,
    structured: Option<super::structured::Structured>,
    text: impl FnOnce(&Loaded) -> Result<String, ApiError> + Send + 'static,
) -> Result<(Vec<u32>, String, Option<Grammar>), ApiError> {
    let st = st.clone();
    blocking(move || {
        let grammar = compile(&st, structured.as_ref())?;
        let m = st.model()?;
        let text = text(m)?;
        Ok((m.tok.encode_prompt(&text, true), text, grammar))
    })
    .await
}

/// The chat prompt as text (blocking). With `continue_final`, the last (assistant) message is
/// left open: the template renders it whole, and the text is cut where its content ends, so
/// the answer continues it (no end-of-turn, no new turn).
pub fn render_chat(m: &Loaded, messages: &[crate::chat::ChatMessage], tools: Option<serde_json::Value>, kwargs: serde_json::Map<String, serde_json::Value>, continue_final: bool) -> Result<String, ApiError> {
    let template = m.template.clone().ok_or_else(|| {
        ApiError::param("messages", "this model has no chat template; use --chat-template FILE or a raw prompt (/v1/completions)")
    })?;
    let mut opts = m.render_options(tools, kwargs);
    let refused = |e: crate::chat::TemplateError| ApiError::param("messages", format!("the chat template refused them: {}", bounded_to(&e.to_string(), TEMPLATE_ERROR_LIMIT)));
    if !continue_final {
        return template.render(messages, &opts).map_err(refused);
    }
    // A marker no client text holds, after the last message's content.
    const MARK: &str = "\u{1}minfer-continue\u{1}";
    let mut marked = messages.to_vec();
    if let Some(last) = marked.last_mut() {
        let content = last.content.as_ref().and_then(|c| c.as_str()).unwrap_or("").to_string();
        last.content = Some(serde_json::Value::String(content + MARK));
    }
    opts.add_generation_prompt = false;
    let text = template.render(&marked, &opts).map_err(refused)?;
    match text.find(MARK) {
        Some(at) => Ok(text[..at].to_string()),
        None => Err(ApiError::param("continue_final_message", "the chat template does not show the last message's content, so it cannot be continued")),
    }
}

/// What both generation endpoints do first: the model must be loaded, the server not
/// draining, and a place free (503 otherwise, before the body is parsed).
pub fn admit(st: &AppState) -> Result<(&Loaded, Ticket), ApiError> {
    let m = st.model()?;
    if st.lifecycle.draining() {
        return Err(ApiError::Draining);
    }
    Ok((m, st.admission.try_admit()?))
}

pub async fn completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let (m, ticket) = admit(&st)?;
        let req = completion_request(&parse_object(&body_bytes(body)?)?, m.n_vocab, &st.cfg.defaults)?;
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

/// Sends one choice's job to the inference thread (its seed the request's plus `choice`, so
/// that the choices of `n` differ and each is reproducible), and returns its events.
fn submit(st: &AppState, m: &Loaded, p: &Prepared, choice: usize, ticket: Ticket) -> Result<UnboundedReceiver<Event>, ApiError> {
    let mut opts = p.opts.clone();
    opts.sampler.seed = opts.sampler.seed.wrapping_add(choice as u64);
    // `id_slot` places the first choice; the others go where they fit.
    if choice > 0 {
        opts.id_slot = None;
    }
    submit_generation(st, m, &p.ids, &p.text, &opts, p.grammar.clone(), ticket)
}

/// Sends a generation of `ids` (the prompt, `text` its text) to the inference thread.
pub fn submit_generation(st: &AppState, m: &Loaded, ids: &[u32], text: &str, opts: &GenOptions, grammar: Option<Grammar>, ticket: Ticket) -> Result<UnboundedReceiver<Event>, ApiError> {
    if let Some(i) = opts.id_slot.filter(|&i| i >= st.cfg.slots) {
        return Err(ApiError::param("id_slot", format!("slot {i} does not exist: the server has {} slots (0 to {})", st.cfg.slots, st.cfg.slots - 1)));
    }
    let timeout = st.cfg.timeout_secs;
    let params = GenerateParams {
        max_tokens: opts.max_tokens.unwrap_or(m.n_ctx_slot),
        sampler: opts.sampler.clone(),
        stop: opts.stop.clone(),
        ubatch: Some(st.cfg.ubatch),
        n_probs: opts.n_probs,
        post_sampling_probs: opts.post_sampling_probs,
        grammar,
    };
    let (tx, rx) = unbounded_channel();
    // A limit too far away to represent is no limit.
    let deadline = (timeout > 0).then(|| Instant::now().checked_add(Duration::from_secs(timeout))).flatten();
    let inject_panic = st.cfg.inject_panic.as_deref().is_some_and(|s| text.contains(s));
    m.inference.submit(Job {
        prompt: ids.to_vec(),
        work: Work::Generate(Box::new(params)),
        events: tx,
        deadline,
        timeout_secs: timeout,
        inject_panic,
        cache_prompt: opts.cache_prompt,
        return_progress: opts.return_progress && opts.stream,
        slot: opts.id_slot,
        ticket,
    })?;
    Ok(rx)
}

/// The context checks every generation request passes before it reaches a slot: the prompt
/// must fit, and so must the completion when `opts` promises its length (OpenAI's
/// `max_tokens`; a cap such as `n_predict` ends at the context instead).
pub fn check_context(m: &Loaded, n_prompt: usize, opts: &GenOptions) -> Result<(), ApiError> {
    let max_tokens = opts.max_tokens.filter(|_| !opts.cap_to_context);
    if n_prompt > m.n_ctx_slot {
        return Err(ApiError::ExceedContext { n_prompt_tokens: n_prompt, n_ctx: m.n_ctx_slot });
    }
    if let Some(max_tokens) = max_tokens.filter(|&n| n_prompt + n > m.n_ctx_slot) {
        return Err(ApiError::ExceedContextWithCompletion { n_prompt_tokens: n_prompt, max_tokens, n_ctx: m.n_ctx_slot });
    }
    Ok(())
}

/// One whole choice: its text (tool calls split out when tools were offered), calls,
/// log-probabilities and end.
struct Collected {
    text: String,
    calls: Vec<super::tools::ToolCall>,
    logprobs: Option<serde_json::Value>,
    finished: super::slot::Finished,
}

async fn collect(m: &Loaded, p: &Prepared, api: Api, shut: &mut ShutSignal, rx: &mut UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut text = if p.echo { p.text.clone() } else { String::new() };
    let mut logprobs = Logprobs::default();
    let offset0 = text.len();
    while let Some(ev) = shut.next_event(rx).await? {
        match ev {
            // Generations get no replies (those answer embeddings and slot actions).
            Event::Progress(_) | Event::Reply(_) => {}
            Event::Token(t) => {
                text.push_str(&t.text);
                logprobs.push(&m.tok, &t);
            }
            Event::Done(finished) => {
                let lp = p.opts.n_probs.map(|_| logprobs.to_json(&m.tok, api, offset0));
                let (text, calls) = if p.tools {
                    let mut split = ToolCallSplitter::default();
                    let shown = split.push(&text);
                    let (tail, calls) = split.finish();
                    (shown + &tail, calls)
                } else {
                    (text, Vec::new())
                };
                return Ok(Collected { text, calls, logprobs: lp, finished });
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::Internal("the generation ended without a result".into()))
}

async fn generate(st: &AppState, m: &Loaded, ticket: Ticket, p: Prepared, api: Api) -> Result<Response, ApiError> {
    check_context(m, p.ids.len(), &p.opts)?;
    let n = p.opts.n;
    if n > 1 && p.opts.stream {
        return Err(ApiError::param("n", "must be 1 when streaming: several choices are returned whole (stream: false)"));
    }
    // One slot per choice: the first ticket was taken before the body was read.
    let mut tickets = vec![ticket];
    for _ in 1..n {
        tickets.push(st.admission.try_admit()?);
    }
    let mut rxs = Vec::with_capacity(n);
    for (i, t) in tickets.into_iter().enumerate() {
        rxs.push(submit(st, m, &p, i, t)?);
    }
    let meta = Meta { id: new_id(api), created: unix_now(), model: m.model_id.clone(), api };
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    if p.opts.stream {
        let mut rx = rxs.pop().ok_or_else(|| ApiError::Internal("no generation was submitted".into()))?;
        let first = super::stream::first_event(&mut shut, &mut rx).await?;
        let prefix = if p.echo { p.text.clone() } else { String::new() };
        let opts = StreamOptions { include_usage: p.opts.include_usage, prefix, tools: p.tools, timings_per_token: p.opts.timings_per_token };
        let mut s = EventStream::new(rx, m.tok.clone(), meta, opts, shut);
        s.push(first);
        return Ok(s.into_response());
    }
    let mut choices = Vec::with_capacity(n);
    for rx in &mut rxs {
        choices.push(collect(m, &p, api, &mut shut, rx).await?);
    }
    let parts: Vec<_> = choices.iter().enumerate().map(|(i, c)| meta.choice(i, &c.text, &c.calls, c.logprobs.clone(), &c.finished)).collect();
    let finished: Vec<_> = choices.iter().map(|c| c.finished).collect();
    let mut v = meta.complete(parts, &finished);
    if p.opts.verbose {
        v["__verbose"] = serde_json::json!({"prompt": p.text, "content": choices.first().map(|c| c.text.as_str())});
    }
    Ok(AxJson(v).into_response())
}
