//! `GET /metrics`: Prometheus text format.
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use crate::engine::LoadState;

pub async fn prometheus(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    let e = &state.engine;
    m.uptime_seconds.set(state.started.elapsed().as_secs_f64());
    m.scheduler_waiting_requests.set(e.waiting() as i64);
    m.scheduler_running_requests.set(e.running() as i64);
    crate::metrics::advance_to(&m.engine_steps_total, e.steps());
    m.engine_last_step_age_seconds.set(e.stall_seconds());
    m.engine_failed.set(i64::from(matches!(e.state(), LoadState::Failed(_))));
    if let Some(model) = e.model() {
        let id = [model.id.as_str()];
        m.init_model(&model.id);
        m.info.with_label_values(&[env!("CARGO_PKG_VERSION"), &model.id, e.device().as_str()]).set(1);
        m.model_loaded.with_label_values(&id).set(i64::from(e.state() == LoadState::Ready));
        m.model_load_duration_seconds.with_label_values(&id).set(model.load_seconds);
        m.model_weight_bytes.with_label_values(&id).set(model.weight_bytes as i64);
    }
    m.observe_engine(&e.stats());
    m.observe_batch_sizes(e.decode_steps_by_batch_size());
    m.observe_system(&state.telemetry.latest());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], m.encode())
}
