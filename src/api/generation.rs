//! What chat and text completions share: model lookup, validation of the common parameters,
//! queueing, and the two ways of answering (one JSON body, or an SSE stream).
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use rand::Rng;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::openai::{CommonParams, Endpoint, ResponseMeta};
use super::AppState;
use crate::engine::{Completion, Event, ModelInfo, SamplingParams, TextCodec};
use crate::metrics::inference::InferenceRecorder;

/// Resolves the request's `model`: absent, "default" or the loaded model's id.
pub fn resolve_model(state: &AppState, requested: Option<&str>) -> Result<(ModelInfo, Arc<TextCodec>), ApiError> {
    if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    if state.paused.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::paused());
    }
    let engine = &state.engine;
    match (requested, engine.loaded()) {
        (Some(m), Some((info, _))) if m != "default" && m != info.id => Err(ApiError::model_not_found(m)),
        (_, Some(loaded)) => Ok(loaded),
        (_, None) => Err(ApiError::from(match engine.state() {
            crate::engine::LoadState::Loading => crate::engine::SubmitError::Loading,
            other => crate::engine::SubmitError::Unavailable(format!("{other:?}")),
        })),
    }
}

/// A validated request, ready for the engine.
pub struct Prepared {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Longest stop string, in bytes: each is matched against the text on every token, on the
/// engine thread every request shares.
pub const MAX_STOP_BYTES: usize = 256;

pub fn prepare(state: &AppState, info: &ModelInfo, prompt_ids: Vec<u32>, p: CommonParams) -> Result<Prepared, ApiError> {
    if p.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("Only n=1 is supported").param("n"));
    }
    let temperature = p.temperature.unwrap_or(state.config.default_temperature);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(format!("temperature must be between 0 and 2, got {temperature}")).param("temperature"));
    }
    let top_p = p.top_p.unwrap_or(state.config.default_top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(format!("top_p must be in (0, 1], got {top_p}")).param("top_p"));
    }
    let stop = p.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::bad_request("At most 4 stop sequences are allowed").param("stop"));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad_request(format!(
            "A stop sequence may be at most {MAX_STOP_BYTES} bytes long; one is {} bytes",
            long.len()
        ))
        .param("stop"));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request("A stop sequence must not be empty").param("stop"));
    }
    if prompt_ids.is_empty() {
        return Err(ApiError::bad_request("The prompt is empty").param("prompt"));
    }
    let context = info.context_length;
    let requested = p.max_completion_tokens.or(p.max_tokens).map(|m| m as usize);
    if requested == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1").param("max_tokens"));
    }
    let prompt_len = prompt_ids.len();
    let max_tokens = requested.unwrap_or(context.saturating_sub(prompt_len));
    if prompt_len + max_tokens > context || prompt_len >= context {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.",
            prompt_len + max_tokens
        ))
        .param("messages")
        .code("context_length_exceeded"));
    }
    Ok(Prepared {
        prompt_ids,
        max_tokens,
        sampling: SamplingParams { temperature, top_p, top_k: p.top_k.unwrap_or(0) as usize, seed: p.seed },
        stop,
        stream: p.stream,
        include_usage: p.stream_options.is_some_and(|o| o.include_usage),
    })
}

pub fn new_meta(endpoint: Endpoint, model: &str) -> ResponseMeta {
    let suffix: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    ResponseMeta { endpoint, id: format!("{}{suffix}", endpoint.id_prefix()), created, model: model.to_string() }
}

/// Queues the request and answers with one JSON body or an SSE stream.
pub async fn respond(state: &AppState, meta: ResponseMeta, p: Prepared) -> Result<Response, ApiError> {
    if state.config.admission == crate::config::Admission::Refuse && state.telemetry.pressure_critical() {
        state.metrics.admission_refused_total.with_label_values(&["memory_pressure"]).inc();
        return Err(ApiError::memory_pressure());
    }
    let (req, rx) = state.engine.new_request(p.prompt_ids, p.max_tokens, p.sampling, p.stop);
    state.engine.submit(req)?;
    let recorder = InferenceRecorder::new(state.metrics.clone(), &meta.model, meta.endpoint.name(), p.stream);
    if p.stream {
        return Ok(sse(meta, rx, recorder, p.include_usage).into_response());
    }
    let (text, done) = collect(rx, recorder).await?;
    Ok(axum::Json(meta.full(&text, &done)).into_response())
}

async fn collect(mut rx: UnboundedReceiver<Event>, mut recorder: InferenceRecorder) -> Result<(String, Completion), ApiError> {
    let mut text = String::new();
    loop {
        let ev = rx.recv().await;
        recorder.observe(ev.as_ref());
        match ev {
            Some(Event::Token { text: t } | Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(done)) => return Ok((text, done)),
            Some(Event::Error(e)) => return Err(ApiError::from(e)),
            None => break,
        }
    }
    Err(ApiError::internal("The engine stopped before finishing this request"))
}

fn sse(
    meta: ResponseMeta,
    rx: UnboundedReceiver<Event>,
    recorder: InferenceRecorder,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |v: serde_json::Value| SseEvent::default().data(v.to_string());
    // The chat stream opens with the assistant role; then one chunk per non-empty delta.
    let opening = (meta.endpoint == Endpoint::Chat).then(|| data(meta.chunk(Some(""), true, None, include_usage)));
    let meta = Arc::new(meta);
    let body = stream::unfold((rx, recorder, false), move |(mut rx, mut recorder, ended)| {
        let meta = meta.clone();
        async move {
            if ended {
                return None;
            }
            let done_marker = || SseEvent::default().data("[DONE]");
            let ev = rx.recv().await;
            recorder.observe(ev.as_ref());
            let (events, ended): (Vec<SseEvent>, bool) = match ev {
                Some(Event::Token { text } | Event::Text(text)) if text.is_empty() => (vec![], false),
                Some(Event::Token { text } | Event::Text(text)) => (vec![data(meta.chunk(Some(&text), false, None, include_usage))], false),
                Some(Event::Done(done)) => {
                    let mut out = vec![data(meta.chunk(None, false, Some(done.finish_reason), include_usage))];
                    if include_usage {
                        out.push(data(meta.usage_chunk(&done)));
                    }
                    out.push(done_marker());
                    (out, true)
                }
                Some(Event::Error(e)) => (vec![data(ApiError::from(e).body()), done_marker()], true),
                None => (vec![data(ApiError::internal("The engine stopped before finishing this request").body()), done_marker()], true),
            };
            Some((events, (rx, recorder, ended)))
        }
    });
    let body = stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok);
    Sse::new(body).keep_alive(KeepAlive::default())
}
