//! One visualizer run: `POST /viz/run`'s request, and the generation it starts on a blocking
//! thread with the engine's trace sink turned into server-sent events.
//!
//! Events, in order (every `data` is JSON with the run's id in `run`):
//! `run` {prompt, prompt_ids, max_tokens} → per phase `phase` {phase, kind, graph} → per
//! evaluation `step` {phase, step, n_past, input, token, text}, one `node` {phase, step, node}
//! per captured node, `step_end` {phase, step, logits_top} → `text` {text} as the output grows →
//! `done` {stop, text, generated_ids, ...} or `run_error` {message}.

use std::sync::Arc;

use serde_json::{Value, json};

use super::state::{Frame, MAX_RUN_TOKENS, RunGuard, VizState};
use crate::chat::{ChatMessage, RenderOptions};
use crate::generate::trace::{logits_top_json, token_text};
use crate::generate::{GenerateParams, Generator, SamplerParams, StopReason, TraceEvent, TraceRecorder};
use crate::tokenizer::Tokenizer;

/// What `POST /viz/run` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub prompt: String,
    /// 1..=[`MAX_RUN_TOKENS`], default 16.
    pub max_tokens: usize,
    /// 0 (the default) is greedy.
    pub temperature: f32,
    pub seed: Option<u64>,
    /// Wrap the prompt as one user message in the model's chat template.
    pub chat: bool,
}

/// A request body that cannot be run; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRun(pub String);

impl RunRequest {
    /// Reads `{"prompt": str, "max_tokens"?: int, "temperature"?: number, "seed"?: int,
    /// "chat"?: bool}`; unknown fields are refused (a typo should not be silently ignored).
    pub fn parse(body: &[u8]) -> Result<RunRequest, BadRun> {
        let bad = |m: String| BadRun(m);
        let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| bad("the body must be a JSON object".into()))?;
        if let Some(k) = obj.keys().find(|k| !["prompt", "max_tokens", "temperature", "seed", "chat"].contains(&k.as_str())) {
            return Err(bad(format!("unknown field {k:?} (expected prompt, max_tokens, temperature, seed, chat)")));
        }
        let prompt = match obj.get("prompt") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) => return Err(bad("\"prompt\" is empty".into())),
            Some(_) => return Err(bad("\"prompt\" must be a string".into())),
            None => return Err(bad("\"prompt\" is required".into())),
        };
        let max_tokens = match obj.get("max_tokens") {
            None | Some(Value::Null) => 16,
            Some(n) => match n.as_u64() {
                Some(n) if (1..=MAX_RUN_TOKENS as u64).contains(&n) => n as usize,
                _ => return Err(bad(format!("\"max_tokens\" must be an integer from 1 to {MAX_RUN_TOKENS}, not {n}"))),
            },
        };
        let temperature = match obj.get("temperature") {
            None | Some(Value::Null) => 0.0,
            Some(t) => match t.as_f64() {
                Some(t) if (0.0..=10.0).contains(&t) => t as f32,
                _ => return Err(bad(format!("\"temperature\" must be a number from 0 to 10, not {t}"))),
            },
        };
        let seed = match obj.get("seed") {
            None | Some(Value::Null) => None,
            Some(s) => Some(s.as_u64().ok_or_else(|| bad(format!("\"seed\" must be a non-negative integer, not {s}")))?),
        };
        let chat = match obj.get("chat") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(c) => return Err(bad(format!("\"chat\" must be true or false, not {c}"))),
        };
        Ok(RunRequest { prompt, max_tokens, temperature, seed, chat })
    }
}

/// A request checked against the model: its text after the template, and its tokens.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    pub req: RunRequest,
    pub text: String,
    pub ids: Vec<u32>,
}

/// Renders and tokenizes `req`; refuses a chat run without a template and a prompt that leaves
/// no room in the context.
pub fn prepare(st: &VizState, req: RunRequest) -> Result<PreparedRun, BadRun> {
    let text = match (&st.template, req.chat) {
        (_, false) => req.prompt.clone(),
        (None, true) => return Err(BadRun("\"chat\": this model has no chat template".into())),
        (Some(t), true) => {
            let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::for_tokenizer(&st.tok) };
            t.render(&[ChatMessage::user(req.prompt.clone())], &opts).map_err(|e| BadRun(e.to_string()))?
        }
    };
    let ids = st.tok.encode_prompt(&text, req.chat);
    if ids.is_empty() {
        return Err(BadRun("the prompt has no tokens".into()));
    }
    if ids.len() >= st.cfg.n_ctx {
        return Err(BadRun(format!(
            "the prompt has {} tokens; the context holds {} (start viz with a larger --ctx)",
            ids.len(),
            st.cfg.n_ctx
        )));
    }
    Ok(PreparedRun { req, text, ids })
}

/// The SSE frame of a trace event of run `run`.
fn event_frame(run: u64, ev: &TraceEvent<'_>, tok: &Tokenizer) -> Arc<Frame> {
    match *ev {
        TraceEvent::Phase { phase, kind, graph } => Frame::new("phase", &json!({ "run": run, "phase": phase, "kind": kind, "graph": graph })),
        TraceEvent::StepStart { phase, step, n_past, input } => {
            let token = input.last().copied();
            let text = token.map(|t| token_text(tok, t));
            Frame::new(
                "step",
                &json!({ "run": run, "phase": phase, "step": step, "n_past": n_past, "input": input, "token": token, "text": text }),
            )
        }
        TraceEvent::Node { phase, step, node } => {
            Frame::new("node", &json!({ "run": run, "phase": phase, "step": step, "node": node.to_json() }))
        }
        TraceEvent::StepEnd { phase, step, trace } => {
            let top = logits_top_json(&trace.logits_top, tok);
            Frame::new("step_end", &json!({ "run": run, "phase": phase, "step": step, "logits_top": top }))
        }
    }
}

fn stop_name(s: StopReason) -> &'static str {
    match s {
        StopReason::EndOfGeneration => "eog",
        StopReason::StopString => "stop",
        StopReason::MaxTokens => "length",
        StopReason::ContextFull => "context",
    }
}

/// Runs `p` to the end on the calling (blocking) thread, sending its events; the trace is kept
/// as the last trace. Ends with a `done` or a `run_error` event, also when generation panics.
pub fn run_blocking(guard: RunGuard, p: PreparedRun) {
    let (st, run) = (guard.st.clone(), guard.id);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| generate(&st, run, &p)))
        .unwrap_or_else(|panic| Err(format!("the run panicked: {}", crate::http::panic_text(&*panic))));
    let frame = match outcome {
        Ok(done) => Frame::new("done", &done),
        Err(message) => Frame::new("run_error", &json!({ "run": run, "message": message })),
    };
    guard.finish(frame);
}

fn generate(st: &VizState, run: u64, p: &PreparedRun) -> Result<Value, String> {
    let mut engine = st.engine();
    engine.reset();
    let (tx, tok) = (st.sender(), st.tok.clone());
    let sink = Box::new(move |ev: TraceEvent<'_>| {
        let _ = tx.send(event_frame(run, &ev, &tok));
    });
    engine.set_tracer(Some(TraceRecorder::new(st.cfg.max_values).with_sink(sink)));
    st.send(Frame::new(
        "run",
        &json!({ "run": run, "prompt": p.text, "prompt_ids": p.ids, "max_tokens": p.req.max_tokens, "model": st.model_name }),
    ));
    let mut sampler = SamplerParams { temperature: p.req.temperature, ..SamplerParams::default() };
    if let Some(seed) = p.req.seed {
        sampler.seed = seed;
    }
    let params = GenerateParams { max_tokens: p.req.max_tokens, sampler, stop: Vec::new(), ubatch: None, n_probs: None, post_sampling_probs: false, grammar: None };
    let outcome = (|| {
        let mut g = Generator::new(&engine, &st.tok, &p.ids, &params).map_err(|e| e.to_string())?;
        let mut stopped = false;
        loop {
            if st.stop_requested() {
                stopped = true;
                break;
            }
            let step = g.step(&mut engine).map_err(|e| e.to_string())?;
            if !step.text.is_empty() {
                st.send(Frame::new("text", &json!({ "run": run, "text": step.text })));
            }
            if step.finished.is_some() {
                break;
            }
        }
        Ok::<_, String>((g.into_generation(), stopped))
    })();
    // The trace is kept even when the run failed: it shows what ran up to the failure.
    if let Some(rec) = engine.take_tracer() {
        st.set_last_trace(rec.to_json_bytes(&st.model_name, &p.text, &st.tok));
    }
    let (g, stopped) = outcome?;
    Ok(json!({
        "run": run,
        "stop": if stopped { "stopped" } else { stop_name(g.stop) },
        "text": g.text,
        "prompt_ids": g.prompt_ids,
        "generated_ids": g.generated_ids,
        "prompt_secs": g.prompt_secs,
        "gen_secs": g.gen_secs,
        "gen_tokens_per_s": g.gen_tokens_per_s(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_requests_are_read_with_defaults_and_refused_by_field() {
        let r = RunRequest::parse(br#"{"prompt": "Hi"}"#).unwrap();
        assert_eq!(r, RunRequest { prompt: "Hi".into(), max_tokens: 16, temperature: 0.0, seed: None, chat: false });
        let r = RunRequest::parse(br#"{"prompt": "Hi", "max_tokens": 5, "temperature": 0.7, "seed": 3, "chat": true}"#).unwrap();
        assert_eq!((r.max_tokens, r.temperature, r.seed, r.chat), (5, 0.7, Some(3), true));
        for (body, names) in [
            (&br#"not json"#[..], "not valid JSON"),
            (br#"[1]"#, "JSON object"),
            (br#"{}"#, "\"prompt\" is required"),
            (br#"{"prompt": ""}"#, "\"prompt\" is empty"),
            (br#"{"prompt": 3}"#, "\"prompt\" must be a string"),
            (br#"{"prompt": "a", "max_tokens": 0}"#, "\"max_tokens\""),
            (br#"{"prompt": "a", "max_tokens": 513}"#, "\"max_tokens\""),
            (br#"{"prompt": "a", "temperature": -1}"#, "\"temperature\""),
            (br#"{"prompt": "a", "seed": -1}"#, "\"seed\""),
            (br#"{"prompt": "a", "chat": "yes"}"#, "\"chat\""),
            (br#"{"prompt": "a", "max_token": 3}"#, "unknown field \"max_token\""),
        ] {
            let e = RunRequest::parse(body).unwrap_err();
            assert!(e.0.contains(names), "{}: {e}", String::from_utf8_lossy(body));
        }
    }
}
