//! A JSON body extractor whose failures are OpenAI-shaped errors: 413 past the body limit,
//! 400 for malformed JSON or wrong fields (axum's own says 422 in plain text), 408 for a body
//! that did not arrive in time.
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::ApiError;

pub struct OpenAiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OpenAiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0).unwrap_or(usize::MAX);
        // Refuse on the declared length, without waiting for the upload.
        let declared = req.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::payload_too_large(limit));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large(limit)
            } else if let Some(after) = crate::transport::body::timed_out(&e) {
                ApiError::request_timeout(after.as_secs_f64())
            } else {
                ApiError::bad_request(format!("Could not read the request body: {e}"))
            }
        })?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request("The request body is empty; expected a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.to_string();
            if let Some(field) = message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) {
                // OpenAI's own words for it; a field mlxbar does not know is never ignored.
                let at = path.rsplit_once('.').map(|(parent, _)| parent).filter(|p| !p.is_empty() && *p != ".");
                let at = at.map(|p| format!(" (in '{p}')")).unwrap_or_default();
                ApiError::bad_request(format!("Unrecognized request argument supplied: {field}{at}"))
            } else if inner.is_syntax() || inner.is_eof() {
                ApiError::bad_request(format!("We could not parse the JSON body of your request: {inner}"))
            } else if path == "." {
                ApiError::bad_request(format!("Invalid request: {inner}"))
            } else {
                ApiError::bad_request(format!("Invalid value for '{path}': {inner}"))
            }
        })?;
        // One JSON value, nothing after it: `{…}{…}` is not a request.
        de.end().map_err(|e| ApiError::bad_request(format!("Unexpected data after the JSON body: {e}")))?;
        Ok(OpenAiJson(value))
    }
}

/// The configured body limit, put into request extensions so errors can quote it.
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);
