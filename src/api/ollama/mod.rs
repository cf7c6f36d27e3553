//! The Ollama dialect: `POST /api/chat` and `/api/generate` as Ollama's clients (its Python
//! and JS libraries, and the apps built on them) speak them, and its model routes
//! (`/api/tags`, `/api/show`, `/api/ps`, `/api/version`, `/api/pull`). Bodies ([`request`],
//! [`options`]) translate into the neutral [`crate::inference::InferenceRequest`]
//! ([`translate`]), with model names mapped as [`names`] says; answers come whole
//! ([`response`]) or as NDJSON lines ([`stream`]). Every error on these routes, from the
//! guards in front of them too, is Ollama's `{"error": "…"}` ([`errors`]).
pub mod errors;
pub mod models;
pub mod names;
pub mod options;
pub mod pull;
pub mod request;
pub mod response;
pub mod stream;
pub mod translate;

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::inference::{self, Input};
use crate::registry::{KeepAlive, ModelError};
use request::{ChatRequest, GenerateRequest};
use response::{Clock, Shape};
use translate::Translated;

/// The metrics' `endpoint` label of `/api/chat` and `/api/generate`.
pub const CHAT: &str = "ollama_chat";
pub const GENERATE: &str = "ollama_generate";

/// `POST /api/chat`.
pub async fn chat(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<ChatRequest>) -> Result<Response, ApiError> {
    let started = Instant::now();
    let name = req.model.clone();
    let id = names::model_id(&state, &name).await?;
    let t = translate::chat(req, id.clone())?;
    if matches!(&t.core.input, Input::Chat(m) if m.is_empty()) {
        return load(&state, &id, t.core.keep_alive, Shape::Chat, &name, t.core.stream).await;
    }
    answer(&state, t, &id, Shape::Chat, name, started).await
}

/// `POST /api/generate`.
pub async fn generate(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<GenerateRequest>) -> Result<Response, ApiError> {
    let started = Instant::now();
    let name = req.model.clone();
    let id = names::model_id(&state, &name).await?;
    let no_prompt = req.prompt.as_deref().is_none_or(str::is_empty);
    let chat_template = state.models.view(&id)?.entry.chat_template;
    let t = translate::generate(req, id.clone(), chat_template)?;
    if no_prompt {
        return load(&state, &id, t.core.keep_alive, Shape::Generate, &name, t.core.stream).await;
    }
    answer(&state, t, &id, Shape::Generate, name, started).await
}

async fn answer(state: &AppState, t: Translated, id: &str, shape: Shape, name: String, started: Instant) -> Result<Response, ApiError> {
    if let Some(asked) = t.num_ctx {
        check_num_ctx(state, id, asked)?;
    }
    let stream = t.core.stream;
    let generation = inference::start(state, t.core).await?;
    let clock = Clock { started, load: started.elapsed() };
    if stream {
        return Ok(stream::ndjson(generation, shape, name, clock));
    }
    let answer = generation.collect().await?;
    Ok(Json(response::whole(shape, &name, &answer, clock)).into_response())
}

/// `num_ctx` up to the model's context is the window prompt and answer share (the core's
/// `Overflow::Trim`); beyond the model's context is refused.
fn check_num_ctx(state: &AppState, id: &str, asked: usize) -> Result<(), ApiError> {
    let view = state.models.view(id)?;
    let context = view.info.as_ref().map(|i| i.context_length).or(view.entry.context_length);
    match context {
        Some(context) if asked > context => Err(ApiError::bad_request(format!(
            "options.num_ctx: {asked} is beyond the context of {id}, {context} tokens; send at most {context}"
        ))),
        _ => Ok(()),
    }
}

/// A request with no prompt loads the model and keeps it for `keep_alive`; with
/// `keep_alive: 0` it unloads the model (if loaded), as Ollama's clients expect.
async fn load(
    state: &AppState,
    id: &str,
    keep_alive: Option<KeepAlive>,
    shape: Shape,
    name: &str,
    stream: bool,
) -> Result<Response, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    let unload = keep_alive.is_some_and(KeepAlive::is_zero);
    if unload {
        match state.models.unload(id).await {
            Ok(()) | Err(ModelError::NotLoaded(_)) => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        if state.paused.load(Ordering::Relaxed) {
            return Err(ApiError::paused());
        }
        // The lease ends at once: the model is loaded, idle, kept for `keep_alive`.
        state.models.acquire(Some(id), keep_alive).await?;
    }
    let body = response::loaded(shape, name, unload);
    Ok(if stream { stream::single(body) } else { Json(body).into_response() })
}
