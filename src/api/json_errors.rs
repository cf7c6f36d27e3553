//! Every error answer is JSON in OpenAI's shape, including the plain-text ones axum's own
//! extractors produce (a path segment that is not UTF-8, a query string that does not
//! parse, a body that breaks off): this layer rewrites them, keeping status and text.
use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// Longest plain-text error body kept as the message.
const MAX_TEXT: usize = 4096;

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
