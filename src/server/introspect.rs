//! llama-server's introspection routes: `GET /props`, `GET /slots`, `POST /slots/{id}?action=…`
//! (a slot's KV saved to, restored from or erased: `slot_files.rs`), `POST /apply-template`,
//! `POST /chat/completions/input_tokens`; and what minfer answers where it differs: `POST /props`
//! (llama-server lets a client change settings with it; minfer's are fixed at start) is refused
//! with a 501 that says so, never ignored.

use std::sync::Arc;

use axum::Json as AxJson;
use axum::body::Bytes;
use std::collections::HashMap;

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use serde_json::{Value as Json, json};
use tokio::sync::mpsc::unbounded_channel;

use super::error::ApiError;
use super::fields::{Fields, parse_object};
use super::openai::{admit, blocking, body_bytes, render_chat};
use super::slot::{Event, Job, Reply, Work};
use super::slot_files::{SlotAction, valid_filename};
use super::stream::{ShutSignal, first_event};
use super::request::chat_request;
use super::state::AppState;

/// The settings a request starts from when it names none (`default_generation_settings`).
fn default_params(st: &AppState) -> Json {
    let d = crate::generate::SamplerParams::default();
    let c = &st.cfg.defaults;
    json!({
        "n_predict": c.n_predict.map_or(-1, |n| n as i64),
        "seed": c.seed.map_or(-1, |s| s as i64),
        "temperature": c.temperature.unwrap_or(d.temperature),
        "top_k": d.top_k,
        "top_p": d.top_p,
        "min_p": d.min_p,
        "repeat_penalty": d.repeat_penalty,
        "repeat_last_n": d.penalty_last_n,
        "presence_penalty": d.presence_penalty,
        "frequency_penalty": d.frequency_penalty,
    })
}

pub async fn props(State(st): State<Arc<AppState>>) -> Result<AxJson<Json>, ApiError> {
    let m = st.model()?;
    let tok = &m.tok;
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i).ok()).unwrap_or("").to_string();
    Ok(AxJson(json!({
        "default_generation_settings": {"n_ctx": m.n_ctx_slot, "params": default_params(&st)},
        "total_slots": st.cfg.slots,
        "model_alias": m.model_id,
        "model_path": st.cfg.model.display().to_string(),
        "modalities": {"vision": false, "audio": false, "video": false},
        "endpoint_slots": st.cfg.slots_endpoint,
        "endpoint_props": true,
        "endpoint_metrics": st.cfg.metrics_endpoint,
        "chat_template": m.template.as_ref().map(|t| t.source().to_string()),
        "bos_token": text(tok.bos_id()),
        "eos_token": text(tok.eos_id()),
        "build_info": super::response::SYSTEM_FINGERPRINT,
        "is_sleeping": false,
    })))
}

pub async fn set_props() -> ApiError {
    ApiError::EndpointOff { endpoint: "POST /props", flag: "its settings are fixed when it starts (minfer serve's flags)" }
}

/// `POST /slots/{id}?action=save|restore|erase` (`{"filename": NAME}` for the first two): runs
/// on the inference thread when the slot is free (a busy slot finishes its request first).
pub async fn slot_action(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<AxJson<Json>, ApiError> {
    let Some(dir) = st.cfg.slot_save_path.clone() else {
        return Err(ApiError::EndpointOff { endpoint: "POST /slots/{id}", flag: "start it with --slot-save-path DIR to save and restore slots" });
    };
    let id = id.parse::<usize>().ok().filter(|&i| i < st.cfg.slots).ok_or_else(|| ApiError::param("id_slot", format!("Invalid slot ID: the server has slots 0 to {}", st.cfg.slots - 1)))?;
    let filename = || -> Result<(String, std::path::PathBuf), ApiError> {
        let bytes = body_bytes(body)?;
        let obj = parse_object(&bytes)?;
        let name = Fields::new(&obj).str("filename")?.ok_or_else(|| ApiError::param("filename", "is required"))?;
        if !valid_filename(name) {
            return Err(ApiError::param("filename", "Invalid filename: one plain file name inside --slot-save-path"));
        }
        Ok((name.to_string(), dir.join(name)))
    };
    let action = match query.get("action").map(String::as_str) {
        Some("save") => filename().map(|(filename, path)| SlotAction::Save { filename, path })?,
        Some("restore") => filename().map(|(filename, path)| SlotAction::Restore { filename, path })?,
        Some("erase") => SlotAction::Erase,
        _ => return Err(ApiError::param("action", "Invalid action: save, restore or erase")),
    };
    let (m, ticket) = admit(&st)?;
    let (tx, mut rx) = unbounded_channel();
    m.inference.submit(Job {
        prompt: Vec::new(),
        work: Work::SlotAction(action),
        events: tx,
        deadline: None,
        timeout_secs: 0,
        inject_panic: false,
        cache_prompt: false,
        return_progress: false,
        slot: Some(id),
        ticket,
    })?;
    let mut shut = ShutSignal::new(&st.lifecycle, st.cfg.drain_timeout_secs);
    match first_event(&mut shut, &mut rx).await? {
        Event::Reply(Reply::Slot(report)) => Ok(AxJson(report.to_json())),
        _ => Err(ApiError::Internal("the slot action ended without a result".into())),
    }
}

pub async fn slots(State(st): State<Arc<AppState>>) -> Result<AxJson<Json>, ApiError> {
    if !st.cfg.slots_endpoint {
        return Err(ApiError::EndpointOff { endpoint: "/slots", flag: "it runs with --no-slots-endpoint" });
    }
    let m = st.model()?;
    let busy = st.metrics.busy_slots();
    // Slots fill from the first: minfer reports how many are busy, not which.
    let v: Vec<Json> = (0..st.cfg.slots).map(|i| json!({"id": i, "n_ctx": m.n_ctx_slot, "speculative": st.cfg.draft.is_some(), "is_processing": i < busy})).collect();
    Ok(AxJson(Json::Array(v)))
}

/// `{"messages": …}` → `{"prompt": TEXT}`: the chat template's text, not tokenized.
pub async fn apply_template(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<AxJson<Json>, ApiError> {
    let m = st.model()?;
    let req = chat_request(&parse_object(&body_bytes(body)?)?, m.n_vocab, &st.cfg.defaults)?;
    let st2 = st.clone();
    let prompt = blocking(move || render_chat(st2.model()?, &req.messages, req.tools, req.template_kwargs, req.continue_final)).await?;
    Ok(AxJson(json!({ "prompt": prompt })))
}

/// `{"messages": …}` → `{"input_tokens": N}`: the prompt's tokens as a chat request would count
/// them.
pub async fn input_tokens(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<AxJson<Json>, ApiError> {
    let m = st.model()?;
    let req = chat_request(&parse_object(&body_bytes(body)?)?, m.n_vocab, &st.cfg.defaults)?;
    let st2 = st.clone();
    let n = blocking(move || {
        let m = st2.model()?;
        let text = render_chat(m, &req.messages, req.tools, req.template_kwargs, req.continue_final)?;
        Ok(m.tok.encode_prompt(&text, true).len())
    })
    .await?;
    Ok(AxJson(json!({"object": "response.input_tokens", "input_tokens": n})))
}
