//! The loop that feeds the alert engine once a second from the server's live state and
//! mirrors the result into `mlxbar_alerts_firing`. The same tick samples the scheduler's
//! queue into the live series and steps the energy-per-token ledger (tokens so far, engine
//! busy or not).
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::signals::Reading;
use super::{Alerts, NoticeKind};
use crate::metrics::Metrics;
use crate::registry::{Models, SlotState};
use crate::telemetry::Telemetry;

pub const INTERVAL: Duration = Duration::from_secs(1);

/// What the alert rules read, taken from the engine, telemetry and live metrics. Each field
/// is also exported on `/metrics` (see `scenarios::Scenario::reading` for which series), so
/// the Prometheus rules see the same numbers. Failures and stalls come from the engine
/// itself: they count even with `metrics_enabled = false`.
pub fn reading(models: &Models, telemetry: &Telemetry, metrics: &Metrics) -> Reading {
    let sys = telemetry.latest();
    let mem = sys.memory.as_ref();
    let ttft = metrics.live.ttft_seconds();
    let stats = models.stats();
    let power = telemetry.power.latest();
    let cluster = models.engine(models.default_id()).and_then(|e| e.loaded()).and_then(|l| l.cluster);
    let rejoining = models.cluster_rejoining();
    Reading {
        pressure: mem.and_then(|m| m.pressure.as_number()).map(f64::from),
        swap_used_bytes: mem.map(|m| m.swap_used as f64),
        swap_in_pages_per_second: mem.map(|_| sys.swap_in_rate),
        engine_failed: models.active_views().iter().any(|v| v.state == SlotState::Failed),
        failed_requests: stats.failed_requests,
        ttft_p90_seconds: (ttft.count > 0).then_some(ttft.p90),
        waiting_requests: models.waiting() as f64,
        admission_blocked: stats.admission_blocked,
        refused_total: metrics.admission_refused_total.with_label_values(&["memory_pressure"]).get(),
        engine_stall_seconds: models.stall_seconds(),
        // A lost cluster's engine is given up too, but cluster_rank_lost says that (and why).
        restart_required: models.restart_required().is_some() && cluster.as_ref().is_none_or(|c| c.broken().is_none()),
        expert_lookups: expert_lookups(models),
        running_requests: models.running() as f64,
        gpu_busy_ratio: power.gpu_busy_ratio,
        thermal_pressure: power.thermal_pressure.map(|t| f64::from(t.as_number())),
        tokens_per_second: metrics.live.tokens_per_second_now(),
        // A rank 0 restarted to rejoin counts its ranks lost until the cluster forms again.
        cluster_ranks_lost: match (&cluster, &rejoining) {
            (Some(c), _) => Some((c.ranks - c.healthy()) as f64),
            (None, Some((ranks, _))) => Some(*ranks as f64),
            (None, None) => None,
        },
        cluster_lost: cluster.and_then(|c| c.broken()).or(rejoining.map(|(_, why)| why)),
    }
}

/// Hits and misses of every loaded model that streams its experts; None when none does.
fn expert_lookups(models: &Models) -> Option<(u64, u64)> {
    let streamed: Vec<_> = models.active_views().into_iter().filter_map(|v| v.experts).collect();
    (!streamed.is_empty()).then(|| streamed.iter().fold((0, 0), |(h, m), x| (h + x.hits, m + x.misses)))
}

/// Evaluates the rules every [`INTERVAL`] until the returned task is aborted.
pub fn spawn(alerts: Arc<Alerts>, models: Arc<Models>, telemetry: Arc<Telemetry>, metrics: Arc<Metrics>) -> JoinHandle<()> {
    for rule in alerts.rules() {
        metrics.alerts_firing.with_label_values(&[&rule.id]).set(0);
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            metrics.live.sample_scheduler(models.running(), models.waiting());
            telemetry.power.account(metrics.live.totals().1, models.running() > 0);
            let r = reading(&models, &telemetry, &metrics);
            for n in alerts.evaluate(&r, Instant::now()) {
                match n.kind {
                    NoticeKind::Firing => tracing::warn!(alert = %n.alert, "{}: {}", n.title, n.body),
                    NoticeKind::Resolved => tracing::info!(alert = %n.alert, "{}: {}", n.title, n.body),
                }
            }
            for (id, firing) in alerts.firing() {
                metrics.alerts_firing.with_label_values(&[&id]).set(firing as i64);
            }
        }
    })
}
