//! The OpenAI Responses dialect: `POST /v1/responses`, without server-side state (no
//! stored responses, no `previous_response_id`: the client sends the whole conversation).
//! Its bodies ([`request`]) translate into the neutral [`crate::inference::InferenceRequest`]
//! ([`input`], [`translate`]); the answer is rendered as a Response object ([`response`]),
//! whole or as the Responses API's numbered server-sent events ([`stream`]). Errors are
//! OpenAI's shape, in the Responses API's words ([`errors`]).
pub mod errors;
pub mod input;
pub mod request;
pub mod response;
pub mod sealed;
pub mod stream;
pub mod translate;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::inference;
use errors::responses_words;
use request::ResponsesRequest;

/// The metrics' `endpoint` label of `/v1/responses`.
pub const ENDPOINT: &str = "responses";

/// `POST /v1/responses`.
pub async fn responses(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<ResponsesRequest>) -> Result<Response, ApiError> {
    let (core, mut echo) = translate::translate(req)?;
    // The sampling the answer is drawn with: the server's defaults where the request set none.
    echo.params.entry("temperature").or_insert_with(|| translate::number(state.config.default_temperature));
    echo.params.entry("top_p").or_insert_with(|| translate::number(state.config.default_top_p));
    let stream = core.stream;
    let generation = inference::start(&state, core).await.map_err(responses_words)?;
    let meta = response::Meta::new(&generation.model, echo);
    if stream {
        return Ok(stream::sse(meta, generation).into_response());
    }
    let answer = generation.collect().await.map_err(responses_words)?;
    Ok(axum::Json(meta.full(&answer)).into_response())
}
