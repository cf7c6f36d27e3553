//! The Anthropic Messages dialect: `POST /v1/messages` and `/v1/messages/count_tokens`, as
//! Anthropic's SDKs and the agents built on them (Claude Code) speak it. Its bodies
//! ([`request`]) translate into the neutral [`crate::inference::InferenceRequest`]
//! ([`translate`]); the answer is rendered as a Message ([`response`]), whole or as
//! Anthropic's named server-sent events ([`stream`]). Every error on these routes, from
//! the guards in front of them too, is Anthropic's shape ([`errors`]).
pub mod errors;
pub mod request;
pub mod response;
pub mod stream;
pub mod translate;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::inference;
use request::{CountTokensRequest, MessagesRequest};

/// The metrics' `endpoint` label of `/v1/messages`.
pub const ENDPOINT: &str = "messages";

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<MessagesRequest>) -> Result<Response, ApiError> {
    let core = translate::messages(req)?;
    let stream = core.stream;
    let generation = inference::start(&state, core).await?;
    if stream {
        return Ok(stream::sse(generation).into_response());
    }
    let model = generation.model.clone();
    let answer = generation.collect().await?;
    Ok(axum::Json(response::message(&model, &answer)).into_response())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the prompt as the model that
/// would answer sees it (template, system prompt, tools).
pub async fn count_tokens(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<CountTokensRequest>) -> Result<Response, ApiError> {
    let core = translate::count_tokens(req)?;
    let (_, tokens) = inference::count::prompt_tokens(&state, core).await?;
    Ok(axum::Json(json!({"input_tokens": tokens})).into_response())
}
