//! The popover page (ui/), compiled into the binary and served at `/` so a browser can
//! open the same view the menu-bar app shows.
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// (path under /ui/, content type, bytes)
const FILES: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../../ui/app.js")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("../../ui/style.css")),
    ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("../../ui/vendor/uPlot.iife.min.js")),
    ("vendor/uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../../ui/vendor/uPlot.min.css")),
];

const INDEX: &[u8] = include_bytes!("../../ui/index.html");

/// Same-origin only; uPlot sets inline styles.
const CSP: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub async fn asset(Path(path): Path<String>) -> Result<Response, ApiError> {
    FILES
        .iter()
        .find(|(p, ..)| *p == path)
        .map(|(_, ct, body)| file(ct, body))
        .ok_or_else(|| ApiError::not_found(format!("No UI file {path:?}")))
}
