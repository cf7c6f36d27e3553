//! The guard against drive-by requests from web pages. Any page the user opens can send
//! a "simple" cross-origin POST to 127.0.0.1 (`text/plain`, no CORS preflight, a loopback
//! `Host`): the page cannot read the answer, but the request would still run. So every
//! state-changing request (POST, PUT, PATCH, DELETE)
//! - must carry `Content-Type: application/json` when it has (or, for POST/PUT/PATCH, may
//!   have) a body (415 otherwise): a browser sends that only after a CORS preflight, which
//!   only configured origins pass;
//! - is refused (403) when its `Origin` is neither this server's own (the popover page),
//!   the Tauri app's, nor a configured `cors_origin`, or when the browser marks it
//!   `Sec-Fetch-Site: cross-site` from an origin not configured.
//!
//! Requests without `Origin` (curl, SDKs, Prometheus, the bench client) pass.
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Where the Tauri app's own pages come from (macOS/Linux, and Windows/Android).
const TAURI_ORIGINS: &[&str] = &["tauri://localhost", "http://tauri.localhost", "https://tauri.localhost"];

pub async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match verdict(req.method(), req.headers(), &state.config.cors_origins) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Whether a request may go on; pure, so the rules are unit- and property-tested.
pub fn verdict(method: &Method, headers: &HeaderMap, cors_origins: &[String]) -> Result<(), ApiError> {
    if !changes_state(method) {
        return Ok(());
    }
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if let Some(origin) = text(header::ORIGIN) {
        let configured = cors_origins.iter().any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin));
        if !configured {
            if headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site")) {
                return Err(ApiError::forbidden_origin(format!(
                    "Cross-site request from origin '{origin}' refused: this route changes the server's state. Allow the origin with --cors-origin"
                )));
            }
            if !same_origin(origin, text(header::HOST)) && !TAURI_ORIGINS.contains(&origin) {
                return Err(ApiError::forbidden_origin(format!(
                    "Origin '{origin}' is not allowed to change this server's state; allow it with --cors-origin"
                )));
            }
        }
    }
    let has_body = headers.get(header::TRANSFER_ENCODING).is_some()
        || headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|n| n.trim() != "0");
    // POST/PUT/PATCH without a body still say JSON: an empty text/plain POST is a
    // simple request too. A DELETE without a body cannot be sent cross-origin unflighted.
    if (has_body || method != Method::DELETE) && !is_json(text(header::CONTENT_TYPE)) {
        return Err(ApiError::unsupported_media_type(text(header::CONTENT_TYPE)));
    }
    Ok(())
}

fn changes_state(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

/// `application/json`, with or without parameters such as `; charset=utf-8`.
pub fn is_json(content_type: Option<&str>) -> bool {
    content_type.and_then(|c| c.split(';').next()).is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// The page was served by this server: its origin is `http://` + the `Host` it used
/// (which the Host check has already limited to loopback or configured names).
pub fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    origin.strip_prefix("http://").is_some_and(|rest| rest.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn status(method: Method, pairs: &[(&str, &str)], cors: &[&str]) -> u16 {
        let cors: Vec<String> = cors.iter().map(|s| s.to_string()).collect();
        verdict(&method, &headers(pairs), &cors).map_or_else(|e| e.status.as_u16(), |()| 200)
    }

    const JSON: (&str, &str) = ("content-type", "application/json");
    const HOST: (&str, &str) = ("host", "127.0.0.1:8080");

    #[test]
    fn reads_pass_whatever_their_origin() {
        assert_eq!(status(Method::GET, &[HOST, ("origin", "https://evil.example"), ("sec-fetch-site", "cross-site")], &[]), 200);
        assert_eq!(status(Method::HEAD, &[HOST, ("origin", "null")], &[]), 200);
    }

    #[test]
    fn a_simple_cross_site_post_is_refused() {
        // What `fetch(url, {method: "POST", body})` from another site sends.
        let page = [HOST, ("origin", "https://evil.example"), ("content-type", "text/plain;charset=UTF-8"), ("content-length", "22")];
        assert_eq!(status(Method::POST, &page, &[]), 403);
        // The same without an Origin (curl with the wrong type) is a 415.
        assert_eq!(status(Method::POST, &[HOST, ("content-type", "text/plain"), ("content-length", "2")], &[]), 415);
        assert_eq!(status(Method::POST, &[HOST, ("content-length", "2")], &[]), 415);
        assert_eq!(status(Method::POST, &[HOST], &[]), 415, "an empty POST says JSON too");
        assert_eq!(status(Method::PUT, &[HOST, ("content-type", "application/x-www-form-urlencoded"), ("content-length", "3")], &[]), 415);
    }

    #[test]
    fn another_port_on_localhost_is_another_origin() {
        // same-site for the browser (ports do not count), a foreign origin all the same
        let page = [HOST, JSON, ("origin", "http://127.0.0.1:9000"), ("sec-fetch-site", "same-site")];
        assert_eq!(status(Method::POST, &page, &[]), 403);
        assert_eq!(status(Method::POST, &page, &["http://127.0.0.1:9000"]), 200, "unless configured");
        assert_eq!(status(Method::POST, &[HOST, JSON, ("origin", "null")], &[]), 403, "sandboxed frames and file:// pages");
    }

    #[test]
    fn the_popover_the_app_and_clients_without_origin_pass() {
        let popover = [HOST, JSON, ("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "same-origin"), ("content-length", "2")];
        assert_eq!(status(Method::POST, &popover, &[]), 200);
        assert_eq!(status(Method::POST, &[("host", "localhost:8080"), JSON, ("origin", "http://LOCALHOST:8080")], &[]), 200);
        assert_eq!(status(Method::POST, &[HOST, JSON, ("origin", "tauri://localhost")], &[]), 200);
        assert_eq!(status(Method::POST, &[HOST, ("content-type", "Application/JSON; charset=utf-8"), ("content-length", "2")], &[]), 200);
        assert_eq!(status(Method::DELETE, &[HOST], &[]), 200, "a DELETE without a body");
        assert_eq!(status(Method::DELETE, &[HOST, ("content-length", "4"), ("content-type", "text/plain")], &[]), 415);
        assert_eq!(status(Method::DELETE, &[HOST, ("origin", "https://evil.example")], &[]), 403);
    }

    #[test]
    fn cross_site_is_refused_even_with_a_matching_host() {
        // A DNS-rebinding page whose name is in allowed_hosts still says cross-site.
        let h = [("host", "mac.local:8080"), JSON, ("origin", "http://mac.local:8080"), ("sec-fetch-site", "cross-site")];
        assert_eq!(status(Method::POST, &h, &[]), 403);
        assert_eq!(status(Method::POST, &h, &["http://mac.local:8080"]), 200);
    }

    #[test]
    fn json_media_type() {
        for ok in ["application/json", "application/json; charset=utf-8", " APPLICATION/JSON "] {
            assert!(is_json(Some(ok)), "{ok}");
        }
        for bad in ["text/plain", "application/jsonx", "application/json-patch+json", "multipart/form-data", ""] {
            assert!(!is_json(Some(bad)), "{bad}");
        }
        assert!(!is_json(None));
    }
}
