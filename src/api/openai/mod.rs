//! The OpenAI dialect: `/v1/chat/completions` and `/v1/completions`. Its typed request
//! bodies ([`request`]) translate into the neutral [`crate::inference::InferenceRequest`]
//! ([`chat`], [`completions`]); the answer is rendered as OpenAI's objects ([`response`]),
//! whole or as SSE chunks ([`stream`]). Errors are OpenAI's shape (`ApiError::body`).
pub mod chat;
pub mod completions;
pub mod request;
pub mod response;
pub mod stream;

pub use request::{ChatCompletionRequest, CompletionRequest};

use axum::response::{IntoResponse, Response};

use crate::api::error::ApiError;
use crate::api::AppState;
use crate::inference::{self, InferenceRequest};

/// Runs a translated request and answers in `endpoint`'s shape: one JSON body, or SSE.
pub async fn answer(
    state: &AppState,
    core: InferenceRequest,
    endpoint: response::Endpoint,
    include_usage: bool,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let stream = core.stream;
    let generation = inference::start(state, core).await?;
    let meta = response::new_meta(endpoint, &generation.model);
    if stream {
        return Ok(stream::sse(meta, generation, include_usage, logprobs).into_response());
    }
    let answer = generation.collect().await?;
    Ok(axum::Json(meta.full(&answer, logprobs)).into_response())
}
