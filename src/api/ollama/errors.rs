//! Errors on the Ollama routes in Ollama's shape, `{"error": "message"}`, with the status
//! kept (404 for a model this server does not have, 400 for a bad field; Ollama's clients
//! raise the message with the status). The handlers and the guards in front of them (Host,
//! API key, cross-site, body limits) answer with [`ApiError`]; [`reshape`] rewrites whatever
//! error leaves an Ollama route, so no guard needs to know which dialect asked. Ollama
//! routes mlxbar does not have (create, push, copy, delete, blobs, embed) answer 501 Not
//! Implemented: a client shows the message, and does not take it for a missing model as it
//! would a 404.
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

use crate::api::error::ApiError;

/// The routes Ollama's API has (those mlxbar answers and those it refuses).
pub fn is_ollama(path: &str) -> bool {
    matches!(
        path,
        "/api/chat"
            | "/api/generate"
            | "/api/tags"
            | "/api/show"
            | "/api/ps"
            | "/api/version"
            | "/api/pull"
            | "/api/create"
            | "/api/push"
            | "/api/copy"
            | "/api/delete"
            | "/api/embed"
            | "/api/embeddings"
    ) || path.starts_with("/api/blobs/")
}

/// The core speaks of OpenAI's fields where Ollama's differ.
fn ollama_words(message: &str) -> String {
    message
        .replace("response_format", "format")
        .replace("max_tokens", "options.num_predict")
        .replace("Unrecognized request argument supplied: ", "unknown field: ")
        .replace("GET /v1/models", "GET /api/tags")
        .replace("; use /v1/completions", "")
}

pub fn shaped(message: &str) -> Value {
    json!({"error": ollama_words(message)})
}

/// An error as a stream's `{"error": …}` line.
pub fn body(e: &ApiError) -> Value {
    shaped(&e.message)
}

/// Ollama routes mlxbar does not implement.
pub async fn unsupported(req: Request) -> ApiError {
    let mut e = ApiError::bad_request(format!(
        "{} is not supported by mlxbar: it serves the models it finds on disk (GET /api/tags) and pulls from Hugging Face (POST /api/pull); it does not create, copy, push, delete or embed",
        req.uri().path()
    ));
    e.status = StatusCode::NOT_IMPLEMENTED;
    e
}

/// Rewrites an OpenAI-shaped error body from an Ollama route into Ollama's, keeping the
/// status and headers (Retry-After).
pub async fn reshape(req: Request, next: Next) -> Response {
    let ollama = is_ollama(req.uri().path());
    let resp = next.run(req).await;
    match ollama {
        true => crate::api::json_errors::reshape(resp, |_, message| shaped(message)).await,
        false => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_routes_and_words() {
        assert!(is_ollama("/api/chat") && is_ollama("/api/blobs/sha256:abc") && !is_ollama("/api/models") && !is_ollama("/api/chatx"));
        assert_eq!(shaped("response_format with tools"), json!({"error": "format with tools"}));
    }
}
