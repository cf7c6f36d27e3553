//! Turns one reading of the server's state into each rule's signal value; windowed signals
//! (swap growth, recent errors, recent refusals) look back over a short history of readings.
//! Each signal is the number its PromQL twin in `prometheus.rs` computes from `/metrics`.
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::rules::{Rule, Signal};

/// What the monitor reads each tick.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// 0 normal, 1 warn, 2 critical; None when the platform cannot tell.
    pub pressure: Option<f64>,
    pub swap_used_bytes: Option<f64>,
    /// Between the last two telemetry samples (a second apart).
    pub swap_in_pages_per_second: Option<f64>,
    /// The engine failed: the model did not load or the engine thread died.
    pub engine_failed: bool,
    /// Requests the engine ended with an error since start (counted on the engine thread,
    /// whatever `metrics_enabled` says).
    pub failed_requests: u64,
    /// None until a request finished within the live window.
    pub ttft_p90_seconds: Option<f64>,
    pub waiting_requests: f64,
    /// Admission is holding new work back now.
    pub admission_blocked: bool,
    /// Requests refused for memory pressure since start (not those refused for a bench run).
    pub refused_total: u64,
    /// Seconds without engine progress while work waits or runs; 0 when idle.
    pub engine_stall_seconds: f64,
    /// An engine thread was left behind stuck (it holds memory until a restart).
    pub restart_required: bool,
    /// Expert cache hits and misses since load, streamed models together; None when no
    /// model streams its experts.
    pub expert_lookups: Option<(u64, u64)>,
    /// Requests being generated.
    pub running_requests: f64,
    /// Share of the last second the GPU was active; None where it cannot be read.
    pub gpu_busy_ratio: Option<f64>,
    /// 0 nominal … 3 critical; None where the OS has no such level.
    pub thermal_pressure: Option<f64>,
    /// Tokens per second over the last seconds (what a thermal notice compares).
    pub tokens_per_second: f64,
    /// A cluster's ranks not serving (all of them once one is lost: rank 0 cannot serve
    /// alone); None without a cluster.
    pub cluster_ranks_lost: Option<f64>,
    /// Which rank was lost and why, once one was (for the notice).
    pub cluster_lost: Option<String>,
}

/// Fewer lookups than this in the window say nothing about the cache (a cold start, a
/// lull): the miss ratio has no value.
pub const MIN_EXPERT_LOOKUPS: u64 = 100;

/// Readings kept for windowed signals.
const MAX_LOOKBACK: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
}

/// One reading's figures that windowed signals look back on.
#[derive(Debug)]
struct Point {
    at: Instant,
    swap_used: Option<f64>,
    failed: u64,
    refused: u64,
    expert_lookups: Option<(u64, u64)>,
    tokens_per_second: f64,
}

impl History {
    pub fn push(&mut self, now: Instant, r: &Reading) {
        self.points.push_back(Point {
            at: now,
            swap_used: r.swap_used_bytes,
            failed: r.failed_requests,
            refused: r.refused_total,
            expert_lookups: r.expert_lookups,
            tokens_per_second: r.tokens_per_second,
        });
        while self.points.front().is_some_and(|p| now.saturating_duration_since(p.at) > MAX_LOOKBACK) {
            self.points.pop_front();
        }
    }

    /// Tokens per second `seconds` ago (the oldest reading within that span) and now.
    pub fn throughput_since(&self, now: Instant, seconds: f64) -> Option<(f64, f64)> {
        let then = self.within(now, seconds).next()?.tokens_per_second;
        Some((then, self.points.back()?.tokens_per_second))
    }

    fn within(&self, now: Instant, window: f64) -> impl Iterator<Item = &Point> {
        let window = Duration::from_secs_f64(window);
        self.points.iter().filter(move |p| now.saturating_duration_since(p.at) <= window)
    }

    /// The rule's signal now (None: no data). Call after [`History::push`] of `r`.
    pub fn value(&self, rule: &Rule, r: &Reading, now: Instant) -> Option<f64> {
        match rule.signal {
            Signal::MemoryPressure => r.pressure,
            Signal::SwapGrowth => {
                // Rise above the lowest point in the window: a slow climb counts too.
                let low = self.within(now, rule.window_seconds).filter_map(|p| p.swap_used).fold(f64::INFINITY, f64::min);
                r.swap_used_bytes.filter(|_| low.is_finite()).map(|cur| (cur - low).max(0.0))
            }
            Signal::SwapInRate => r.swap_in_pages_per_second,
            Signal::EngineErrors => {
                let first = self.within(now, rule.window_seconds).map(|p| p.failed).min().unwrap_or(r.failed_requests);
                let recent = r.failed_requests.saturating_sub(first) as f64;
                Some(if r.engine_failed { recent.max(1.0) } else { recent })
            }
            Signal::TtftP90 => r.ttft_p90_seconds,
            Signal::QueueBacklog => Some(r.waiting_requests),
            Signal::AdmissionHeld => {
                let first = self.within(now, rule.window_seconds).map(|p| p.refused).min().unwrap_or(r.refused_total);
                let refused = r.refused_total.saturating_sub(first) as f64;
                Some(if r.admission_blocked { refused.max(1.0) } else { refused })
            }
            Signal::EngineStalled => Some(r.engine_stall_seconds),
            Signal::RestartRequired => Some(f64::from(u8::from(r.restart_required))),
            Signal::ExpertMissRatio => {
                let (hits, misses) = r.expert_lookups?;
                let (h0, m0) = self.within(now, rule.window_seconds).find_map(|p| p.expert_lookups).unwrap_or((hits, misses));
                // A reload restarts the counts: judge from the restart on.
                let (h0, m0) = if hits < h0 || misses < m0 { (0, 0) } else { (h0, m0) };
                let (dh, dm) = (hits - h0, misses - m0);
                (dh + dm >= MIN_EXPERT_LOOKUPS).then(|| dm as f64 / (dh + dm) as f64)
            }
            Signal::GpuIdleWhileGenerating => r.gpu_busy_ratio.map(|busy| if r.running_requests > 0.0 { 1.0 - busy } else { 0.0 }),
            Signal::ThermalPressure => r.thermal_pressure,
            Signal::ClusterRanksLost => r.cluster_ranks_lost,
        }
    }
}

/// A signal value in words, for notices and the UI.
pub fn describe(signal: Signal, v: f64) -> String {
    match signal {
        Signal::MemoryPressure => match v as i64 {
            0 => "normal".into(),
            1 => "warn".into(),
            _ => "critical".into(),
        },
        Signal::SwapGrowth => format!("+{:.0} MiB", v / 1048576.0),
        Signal::SwapInRate => format!("{v:.0} pages/s"),
        Signal::TtftP90 if v < 0.01 => format!("{} ms", (v * 1000.0 * 100.0).round() / 100.0),
        Signal::TtftP90 if v < 1.0 => format!("{:.0} ms", v * 1000.0),
        Signal::EngineErrors => format!("{v:.0} error(s)"),
        Signal::TtftP90 if v.fract() == 0.0 => format!("{v:.0} s"),
        Signal::TtftP90 => format!("{v:.2} s"),
        Signal::QueueBacklog => format!("{v:.0} waiting"),
        Signal::AdmissionHeld if v == 0.0 => "admitting".into(),
        Signal::AdmissionHeld => format!("held back ({v:.0})"),
        Signal::EngineStalled => format!("{v:.0} s without progress"),
        Signal::RestartRequired if v == 0.0 => "no".into(),
        Signal::RestartRequired => "yes".into(),
        Signal::ExpertMissRatio => format!("{:.0} %", v * 100.0),
        Signal::GpuIdleWhileGenerating => format!("{:.0} % idle", v * 100.0),
        Signal::ThermalPressure => match v as i64 {
            0 => "nominal".into(),
            1 => "fair".into(),
            2 => "serious".into(),
            _ => "critical".into(),
        },
        Signal::ClusterRanksLost => format!("{v:.0} not serving"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::rules::defaults;

    fn rule(id: &str) -> Rule {
        defaults().into_iter().find(|r| r.id == id).unwrap()
    }

    #[test]
    fn swap_growth_is_the_rise_over_the_window() {
        let (r, t0) = (rule("swap_growing"), Instant::now());
        let mut h = History::default();
        let mut last = None;
        // 100 MiB, dipping to 50 MiB, then climbing 10 MiB a second for 60 s
        for (i, mib) in [100.0, 50.0].into_iter().chain((1..=60).map(|i| 50.0 + 10.0 * i as f64)).enumerate() {
            let now = t0 + Duration::from_secs(i as u64);
            let reading = Reading { swap_used_bytes: Some(mib * 1048576.0), ..Default::default() };
            h.push(now, &reading);
            last = h.value(&r, &reading, now);
        }
        assert_eq!(last, Some(600.0 * 1048576.0));
        // 10 minutes later at the same level: the old low is out of the window
        let now = t0 + Duration::from_secs(62 + 600);
        let reading = Reading { swap_used_bytes: Some(650.0 * 1048576.0), ..Default::default() };
        h.push(now, &reading);
        assert_eq!(h.value(&r, &reading, now), Some(0.0));
    }

    #[test]
    fn engine_errors_count_recent_failures_and_a_failed_model() {
        let (r, t0) = (rule("engine_error"), Instant::now());
        let mut h = History::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = |failed_requests, engine_failed| Reading { failed_requests, engine_failed, ..Default::default() };
        h.push(at(0), &read(5, false));
        assert_eq!(h.value(&r, &read(5, false), at(0)), Some(0.0), "errors before the window started do not count");
        h.push(at(10), &read(7, false));
        assert_eq!(h.value(&r, &read(7, false), at(10)), Some(2.0));
        h.push(at(100), &read(7, false));
        assert_eq!(h.value(&r, &read(7, false), at(100)), Some(0.0), "older than the 60 s window");
        h.push(at(101), &read(7, true));
        assert_eq!(h.value(&r, &read(7, true), at(101)), Some(1.0));
    }

    #[test]
    fn admission_held_counts_blocking_and_recent_refusals() {
        let (r, t0) = (rule("admission_held"), Instant::now());
        let mut h = History::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = |refused_total, admission_blocked| Reading { refused_total, admission_blocked, ..Default::default() };
        h.push(at(0), &read(0, false));
        assert_eq!(h.value(&r, &read(0, false), at(0)), Some(0.0));
        h.push(at(1), &read(0, true));
        assert_eq!(h.value(&r, &read(0, true), at(1)), Some(1.0));
        h.push(at(2), &read(3, false));
        assert_eq!(h.value(&r, &read(3, false), at(2)), Some(3.0));
        h.push(at(100), &read(3, false));
        assert_eq!(h.value(&r, &read(3, false), at(100)), Some(0.0));
    }

    #[test]
    fn expert_miss_ratio_is_over_the_window_and_needs_enough_lookups() {
        let (r, t0) = (rule("expert_cache_thrashing"), Instant::now());
        let mut h = History::default();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read = |hits, misses| Reading { expert_lookups: Some((hits, misses)), ..Default::default() };
        h.push(at(0), &read(0, 0));
        h.push(at(10), &read(20, 50));
        assert_eq!(h.value(&r, &read(20, 50), at(10)), None, "70 lookups: too few to judge");
        h.push(at(20), &read(40, 160));
        assert_eq!(h.value(&r, &read(40, 160), at(20)), Some(0.8));
        // Five minutes on, only the last 300 s count: 900 hits, 100 misses since t = 20.
        h.push(at(320), &read(940, 260));
        assert_eq!(h.value(&r, &read(940, 260), at(320)), Some(0.1));
        assert_eq!(h.value(&r, &Reading::default(), at(320)), None, "no streamed model");
    }

    #[test]
    fn no_data_stays_no_data() {
        let t0 = Instant::now();
        let h = History::default();
        let r = Reading::default();
        assert_eq!(h.value(&rule("memory_pressure_warn"), &r, t0), None);
        assert_eq!(h.value(&rule("ttft_p90_high"), &r, t0), None);
        assert_eq!(h.value(&rule("swap_growing"), &r, t0), None);
        assert_eq!(describe(Signal::MemoryPressure, 2.0), "critical");
    }
}
