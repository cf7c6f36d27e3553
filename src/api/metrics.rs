//! `GET /metrics`: Prometheus text format.
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use crate::registry::SlotState;

pub async fn prometheus(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    let models = &state.models;
    m.uptime_seconds.set(state.started.elapsed().as_secs_f64());
    m.scheduler_waiting_requests.set(models.waiting() as i64);
    m.scheduler_running_requests.set(models.running() as i64);
    crate::metrics::advance_to(&m.engine_steps_total, models.steps());
    m.engine_last_step_age_seconds.set(models.stall_seconds());
    m.engine_failed.set(i64::from(models.active_views().iter().any(|v| v.state == SlotState::Failed)));
    m.engine_restart_required.set(i64::from(models.restart_required().is_some()));
    m.info.with_label_values(&[env!("CARGO_PKG_VERSION"), models.default_id(), models.device().as_str()]).set(1);
    // Only models of the library (or the default) become labels: a bounded set.
    for view in models.active_views() {
        let id = view.entry.id.as_str();
        m.init_model(id);
        // Every result and reason at 0 from the start, so rates and dashboards see the series.
        for result in ["ok", "failed", "refused"] {
            m.model_loads_total.with_label_values(&[id, result]);
        }
        for reason in crate::registry::budget::UnloadReason::ALL {
            m.model_unloads_total.with_label_values(&[id, reason.as_str()]);
        }
        m.model_loaded.with_label_values(&[id]).set(i64::from(view.state == SlotState::Loaded));
        if let Some(info) = &view.info {
            m.model_load_duration_seconds.with_label_values(&[id]).set(info.load_seconds);
            m.model_weight_bytes.with_label_values(&[id]).set(info.weight_bytes as i64);
        }
        // The memory split of a loaded model (weights above; MLX's cache is process-wide).
        m.model_kv_bytes.with_label_values(&[id]).set(view.kv_bytes.unwrap_or(0) as i64);
        m.model_prefix_cache_bytes.with_label_values(&[id]).set(view.prefix_cache_bytes.unwrap_or(0) as i64);
        match &view.experts {
            Some(experts) => m.experts.observe(id, experts, &models.drain_expert_loads(id)),
            None => m.experts.forget(id),
        }
    }
    m.observe_engine(&models.stats());
    let stats = models.engine(models.default_id()).and_then(|e| e.loaded()).and_then(|l| l.cluster);
    m.cluster.observe(models.cluster_rejoining().map(|(ranks, _)| ranks), stats.as_deref());
    m.observe_batch_sizes(models.decode_steps_by_batch_size());
    m.observe_system(&state.telemetry.latest());
    m.power.observe(&state.telemetry.power.latest(), &state.telemetry.power.energy());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], m.encode())
}
