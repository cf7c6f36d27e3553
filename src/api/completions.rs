//! `POST /v1/completions`: raw text (or token ids) in, continuation out.
use axum::extract::State;
use axum::response::Response;

use super::error::ApiError;
use super::generation::{new_meta, prepare, resolve_model, respond};
use super::json::OpenAiJson;
use super::openai::{CompletionRequest, Endpoint, Prompt};
use super::AppState;

pub async fn completions(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let (info, codec) = resolve_model(&state, req.model.as_deref())?;
    let ids = match req.prompt {
        Prompt::Text(t) => codec.encode(&t).map_err(|e| ApiError::internal(format!("{e:#}")))?,
        Prompt::Texts(v) if v.len() == 1 => codec.encode(&v[0]).map_err(|e| ApiError::internal(format!("{e:#}")))?,
        Prompt::Texts(_) => return Err(ApiError::bad_request("Only one prompt per request is supported").param("prompt")),
        Prompt::Tokens(ids) => {
            let vocab = codec.vocab_size() as u32;
            if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
                return Err(ApiError::bad_request(format!("Token id {bad} is outside the vocabulary (size {vocab})")).param("prompt"));
            }
            ids
        }
    };
    let prepared = prepare(&state, &info, ids, req.common)?;
    respond(&state, new_meta(Endpoint::Completions, &info.id), prepared).await
}
