//! Every error answer is JSON in OpenAI's shape, including the plain-text ones axum's own
//! extractors produce (a path segment that is not UTF-8, a query string that does not
//! parse, a body that breaks off): this layer rewrites them, keeping status and text.
//! [`reshape`] then lets a dialect's own layer put any error in its shape.
use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;

/// Longest plain-text error body kept as the message.
const MAX_TEXT: usize = 4096;

/// Largest error body a dialect reshapes (ours are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// An error answer (OpenAI-shaped by then) in a dialect's shape: `shape(status, message)`
/// makes the new body; status and headers (Retry-After) are kept. Other answers pass.
pub async fn reshape(resp: Response, shape: impl FnOnce(StatusCode, &str) -> Value) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = to_bytes(Body::new(body), MAX_ERROR_BODY).await else {
        return (status, axum::Json(shape(status, "error"))).into_response();
    };
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let new = serde_json::to_vec(&shape(status, &message)).unwrap_or_default();
    parts.headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(new))
}

pub async fn rewrite(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let json = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = match to_bytes(Body::new(body), MAX_TEXT).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).into_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let mut e = ApiError::bad_request(text);
    e.status = status;
    if status.is_server_error() {
        e.kind = "server_error";
    }
    let mut out = e.into_response();
    // Keep what the original said beside its body (Retry-After, Allow…).
    for (name, value) in parts.headers.iter().filter(|(n, _)| *n != header::CONTENT_TYPE && *n != header::CONTENT_LENGTH) {
        out.headers_mut().insert(name.clone(), value.clone());
    }
    out
}
