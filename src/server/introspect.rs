//! llama-server's introspection routes: `GET /props`, `GET /slots`, `POST /apply-template`,
//! `POST /chat/completions/input_tokens`; and what minfer answers where it differs:
//! `POST /props` (llama-server lets a client change settings with it; minfer's are fixed at
//! start) and `POST /slots/{id}?action=…` (KV save and restore to files) are refused with a
//! 501 that says so, never ignored.

use std::sync::Arc;

use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use serde_json::{Value as Json, json};

use super::error::ApiError;
use super::fields::parse_object;
use super::openai::{blocking, body_bytes, render_chat};
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

pub async fn slot_action() -> ApiError {
    ApiError::EndpointOff { endpoint: "POST /slots/{id}", flag: "saving and restoring a slot's KV is not implemented (use the chat CLI's /save and /load)" }
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
