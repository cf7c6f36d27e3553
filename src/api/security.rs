//! Request guards: the Host header check against DNS rebinding, and the API key.
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]", "::1"];

/// A web page on evil.example that resolves its name to 127.0.0.1 still sends
/// `Host: evil.example`; only loopback names (and configured ones) get through. With an
/// API key configured the key is the guard and any host is accepted.
pub async fn check_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.config.api_key.is_none() {
        // A Host that is not text is no loopback name (it must not skip the check).
        let host = match req.headers().get(header::HOST) {
            Some(h) => Some(h.to_str().map(str::to_string).unwrap_or_else(|_| String::from_utf8_lossy(h.as_bytes()).into_owned())),
            None => req.uri().authority().map(|a| a.to_string()),
        };
        if let Some(host) = host {
            if !host_allowed(&host, &state.config.allowed_hosts) {
                return ApiError::forbidden_host(&host).into_response();
            }
        }
    }
    next.run(req).await
}

pub fn host_allowed(host_header: &str, extra: &[String]) -> bool {
    let name = strip_port(host_header).to_ascii_lowercase();
    LOOPBACK_HOSTS.contains(&name.as_str()) || extra.iter().any(|h| h == "*" || h.eq_ignore_ascii_case(&name))
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // Only `[addr]` or `[addr]:port`; anything after the bracket keeps the name whole.
        return match host.find(']') {
            Some(i)
                if host[i + 1..].is_empty() || host[i + 1..].strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())) =>
            {
                &host[..=i]
            }
            _ => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

/// With an API key configured, every route but `/health` needs `Authorization: Bearer <key>`
/// or `x-api-key: <key>`
/// (`/health` then answers only its one-word state without it).
pub async fn check_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/health" && !key_given(&state, req.headers()) {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// True when no key is configured, or the request carries it (compared in constant time).
pub fn key_given(state: &AppState, headers: &axum::http::HeaderMap) -> bool {
    let Some(key) = &state.config.api_key else { return true };
    // OpenAI's clients send `Authorization: Bearer`, Anthropic's `x-api-key`.
    let bearer = headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
    let given = bearer.or_else(|| headers.get("x-api-key").and_then(|h| h.to_str().ok())).unwrap_or("");
    bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_pass_with_or_without_port() {
        for h in ["localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "[::1]", "LOCALHOST:1"] {
            assert!(host_allowed(h, &[]), "{h}");
        }
    }

    #[test]
    fn other_names_are_refused_unless_configured() {
        assert!(!host_allowed("evil.example:8080", &[]));
        assert!(!host_allowed("127.0.0.1.evil.example", &[]));
        assert!(!host_allowed("192.168.1.5:8080", &[]));
        assert!(host_allowed("mac.local:8080", &["mac.local".into()]));
        assert!(host_allowed("anything", &["*".into()]));
    }
}
