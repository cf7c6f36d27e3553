//! `POST /v1/completions`: raw text (or token ids) in, continuation out.
use axum::extract::State;
use axum::response::Response;

use super::chat::{format, logit_bias};
use super::request::{CompletionRequest, Prompt};
use super::response::Endpoint;
use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::inference::{InferenceRequest, Input, Overflow, Sampling};

/// The legacy endpoint's limit on `logprobs`.
const MAX_LOGPROBS: u32 = 5;

pub async fn completions(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let (core, include_usage, logprobs) = translate(req)?;
    super::answer(&state, core, Endpoint::Completions, include_usage, logprobs).await
}

pub fn translate(req: CompletionRequest) -> Result<(InferenceRequest, bool, bool), ApiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("Only n=1 is supported").param("n"));
    }
    if req.stream_options.is_some() && !req.stream {
        return Err(ApiError::bad_request("stream_options is only allowed with stream: true").param("stream_options"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("Only best_of=1 is supported").param("best_of"));
    }
    if req.echo {
        return Err(ApiError::bad_request("'echo' is not supported: the answer is the continuation only").param("echo"));
    }
    if req.suffix.is_some() {
        return Err(ApiError::bad_request("'suffix' is not supported: the served models have no fill-in-the-middle mode").param("suffix"));
    }
    if let Some(n) = req.logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(ApiError::bad_request(format!("logprobs must be between 0 and {MAX_LOGPROBS}, got {n}")).param("logprobs"));
    }
    let input = match req.prompt {
        Prompt::Text(t) => Input::Text(t),
        Prompt::Texts(mut v) if v.len() == 1 => Input::Text(v.remove(0)),
        Prompt::Texts(_) => return Err(ApiError::bad_request("Only one prompt per request is supported").param("prompt")),
        Prompt::Tokens(ids) => Input::Tokens(ids),
    };
    let logprobs = req.logprobs.map(|n| n as usize);
    let core = InferenceRequest {
        model: req.model,
        keep_alive: req.keep_alive,
        input,
        tools: None,
        format: format(req.response_format)?,
        reasoning_effort: None,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k.map(|k| k as usize),
            seed: req.seed,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            logit_bias: logit_bias(req.logit_bias)?,
        },
        max_tokens: req.max_tokens.map(|m| m as usize),
        overflow: Overflow::Refuse,
        stop: req.stop.map(|s| s.into_vec()).unwrap_or_default(),
        logprobs,
        prediction: None,
        endpoint: Endpoint::Completions.name(),
        stream: req.stream,
    };
    Ok((core, req.stream_options.is_some_and(|o| o.include_usage), logprobs.is_some()))
}
