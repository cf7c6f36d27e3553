//! Errors on the Anthropic routes in Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}`, the type named from the status as Anthropic names it (`overloaded_error`
//! for a full queue and a busy server, which its SDKs retry). The handlers and the guards in
//! front of them (Host, API key, cross-site, body limits) all answer with [`ApiError`];
//! [`reshape`] rewrites whatever error leaves a route under `/v1/messages`, so no guard
//! needs to know which dialect asked. The core's messages name OpenAI's fields where the
//! two differ; they are renamed to Anthropic's here.
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

use crate::api::error::ApiError;

/// The routes this dialect answers.
pub fn is_anthropic(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 | 503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The core speaks of OpenAI's fields where Anthropic's differ.
fn anthropic_words(message: &str) -> String {
    message
        .replace("response_format", "output_config.format")
        .replace(".function.parameters", ".input_schema")
        .replace("'Authorization: Bearer <key>'", "'x-api-key: <key>' or 'Authorization: Bearer <key>'")
        .replace("Unrecognized request argument supplied: ", "Extra inputs are not permitted: ")
}

fn shaped(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": anthropic_words(message)}})
}

/// An error as an `error` event's data (mid-stream).
pub fn body(e: &ApiError) -> Value {
    shaped(e.status, &e.message)
}

/// Rewrites an OpenAI-shaped error body from a `/v1/messages` route into Anthropic's,
/// keeping the status and headers (Retry-After).
pub async fn reshape(req: Request, next: Next) -> Response {
    let anthropic = is_anthropic(req.uri().path());
    let resp = next.run(req).await;
    match anthropic {
        true => crate::api::json_errors::reshape(resp, shaped).await,
        false => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_anthropics_status_table() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "overloaded_error"),
            (500, "api_error"),
            (503, "overloaded_error"),
            (507, "api_error"),
        ] {
            assert_eq!(error_type(StatusCode::from_u16(status).unwrap()), kind, "{status}");
        }
        assert!(is_anthropic("/v1/messages") && is_anthropic("/v1/messages/count_tokens") && !is_anthropic("/v1/messagesx"));
        assert_eq!(anthropic_words("response_format with tools"), "output_config.format with tools");
    }
}
