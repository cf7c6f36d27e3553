//! HTTP request metrics, labelled by the matched route template (bounded cardinality).
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;

use crate::api::AppState;

pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let route = route.as_deref().unwrap_or("unmatched").to_owned();
    // The scrape is not counted: it would dominate and measure Prometheus, not clients.
    if route == "/metrics" {
        return next.run(req).await;
    }
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "DELETE" => "DELETE",
        "PUT" => "PUT",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "PATCH" => "PATCH",
        _ => "OTHER",
    };
    let m = &state.metrics;
    let in_flight = InFlight::new(m.http_requests_in_flight.with_label_values(&[method, &route]));
    let started = Instant::now();
    let resp = next.run(req).await;
    m.http_request_duration_seconds.with_label_values(&[method, &route]).observe(started.elapsed().as_secs_f64());
    m.http_requests_total.with_label_values(&[method, &route, resp.status().as_str()]).inc();
    // A stream stays in flight until its body ends or the client goes away.
    let is_stream = resp.headers().get(axum::http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !is_stream {
        return resp;
    }
    resp.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _still_in_flight = &in_flight;
            chunk
        }))
    })
}

struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn new(g: prometheus::IntGauge) -> Self {
        g.inc();
        InFlight(g)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
