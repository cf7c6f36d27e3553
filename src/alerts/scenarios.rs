//! The series that drive both alert engines in the tests: for every built-in rule, what
//! `/metrics` shows each second, the reading the app's monitor takes from the same numbers,
//! and the seconds the rule must fire and resolve. The unit tests below run the app's
//! engine (`Alerts`: signals, then the state machine) over them; `tests/alerts_promql.rs`
//! turns the same series into a promtool test of the generated Prometheus rules
//! (`promtool.rs`), expecting the firing times the app's engine produced.
use std::time::{Duration, Instant};

use super::rules::defaults;
use super::signals::Reading;
use super::Alerts;

/// One exported series: a metric, its labels besides instance and job, a value a second.
pub struct Series {
    pub metric: &'static str,
    pub labels: &'static str,
    pub values: Vec<f64>,
}

pub struct Scenario {
    /// The built-in rule it exercises.
    pub rule: &'static str,
    pub about: &'static str,
    pub seconds: usize,
    pub series: Vec<Series>,
    /// The app's TTFT p90 each second (its live window is not an exported series; the
    /// scenario's requests are in the histogram series). Empty: no requests.
    pub ttft_p90: Vec<Option<f64>>,
    /// The value Prometheus shows while firing, where it differs from the app's.
    pub promql_value: Option<f64>,
    /// [from, to) seconds the rule fires; `to` is `seconds` if it still fires at the end.
    pub firing: Vec<(usize, usize)>,
}

/// The app's view of the scenario's rule after one second's evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    pub firing: bool,
    pub value: Option<f64>,
}

impl Scenario {
    fn get(&self, metric: &str, label: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.metric == metric && s.labels.contains(label))
    }

    fn at(&self, metric: &str, t: usize) -> Option<f64> {
        self.get(metric, "").map(|s| s.values[t])
    }

    /// What `monitor::reading` takes at second `t`, from the series each field is
    /// exported as.
    pub fn reading(&self, t: usize) -> Reading {
        Reading {
            // -1 is "unknown", which the monitor reads as no data
            pressure: self.at("mlxbar_memory_pressure_level", t).filter(|v| *v >= 0.0),
            swap_used_bytes: self.at("mlxbar_swap_used_bytes", t),
            // telemetry's rate between consecutive 1 s samples, 0 for the first
            swap_in_pages_per_second: self.get("mlxbar_swap_in_pages_total", "").map(|s| {
                if t == 0 {
                    0.0
                } else {
                    (s.values[t] - s.values[t - 1]).max(0.0)
                }
            }),
            engine_failed: self.at("mlxbar_engine_failed", t) == Some(1.0),
            failed_requests: self.at("mlxbar_engine_failed_requests_total", t).unwrap_or(0.0) as u64,
            ttft_p90_seconds: self.ttft_p90.get(t).copied().flatten(),
            waiting_requests: self.at("mlxbar_scheduler_waiting_requests", t).unwrap_or(0.0),
            admission_blocked: self.at("mlxbar_admission_blocked", t) == Some(1.0),
            refused_total: self.get("mlxbar_admission_refused_total", "reason=\"memory_pressure\"").map_or(0.0, |s| s.values[t]) as u64,
            engine_stall_seconds: self.at("mlxbar_engine_last_step_age_seconds", t).unwrap_or(0.0),
            restart_required: self.at("mlxbar_engine_restart_required", t) == Some(1.0),
            expert_lookups: self
                .at("mlxbar_expert_cache_hits_total", t)
                .zip(self.at("mlxbar_expert_cache_misses_total", t))
                .map(|(h, m)| (h as u64, m as u64)),
            running_requests: self.at("mlxbar_scheduler_running_requests", t).unwrap_or(0.0),
            gpu_busy_ratio: self.at("mlxbar_gpu_busy_ratio", t),
            thermal_pressure: self.at("mlxbar_thermal_pressure", t),
            tokens_per_second: 0.0,
            cluster_ranks_lost: self.at("mlxbar_cluster_ranks", t).zip(self.at("mlxbar_cluster_ranks_healthy", t)).map(|(n, ok)| n - ok),
            cluster_lost: None,
        }
    }

    /// Runs the app's alert engine with the built-in rules once a second over the
    /// scenario; returns this scenario's rule as it stood after each second.
    pub fn run(&self) -> Vec<Tick> {
        let alerts = Alerts::new(defaults());
        let t0 = Instant::now();
        (0..self.seconds)
            .map(|t| {
                alerts.evaluate(&self.reading(t), t0 + Duration::from_secs(t as u64));
                let v = alerts.view().into_iter().find(|v| v.id == self.rule).expect("a built-in rule");
                Tick { firing: v.firing, value: v.value }
            })
            .collect()
    }
}

/// The [from, to) runs of firing seconds.
pub fn intervals(ticks: &[Tick]) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut start = None;
    for (t, tick) in ticks.iter().enumerate() {
        match (tick.firing, start) {
            (true, None) => start = Some(t),
            (false, Some(s)) => {
                out.push((s, t));
                start = None;
            }
            _ => {}
        }
    }
    out.extend(start.map(|s| (s, ticks.len())));
    out
}

/// A gauge that takes each `(from second, value)` until the next change.
fn steps(seconds: usize, changes: &[(usize, f64)]) -> Vec<f64> {
    (0..seconds).map(|t| changes.iter().rev().find(|(from, _)| *from <= t).map_or(0.0, |c| c.1)).collect()
}

/// A counter from 0 that grows by the rate in effect each second (`(from second, per second)`).
fn counter(seconds: usize, rates: &[(usize, f64)]) -> Vec<f64> {
    let per_second = steps(seconds, rates);
    let mut total = 0.0;
    (0..seconds)
        .map(|t| {
            if t > 0 {
                total += per_second[t];
            }
            total
        })
        .collect()
}

fn series(metric: &'static str, labels: &'static str, values: Vec<f64>) -> Series {
    Series { metric, labels, values }
}

fn scenario(rule: &'static str, about: &'static str, seconds: usize, series: Vec<Series>, firing: &[(usize, usize)]) -> Scenario {
    Scenario { rule, about, seconds, series, ttft_p90: vec![], promql_value: None, firing: firing.to_vec() }
}

const MIB: f64 = 1048576.0;

/// One scenario per built-in rule.
pub fn all() -> Vec<Scenario> {
    let mut out = vec![
        scenario(
            "memory_pressure_warn",
            "warn from 10 s fires after 60 s; a 10 s dip is bridged; resolves 30 s after the last dip; a 10 s spike does not fire",
            200,
            vec![series("mlxbar_memory_pressure_level", "", steps(200, &[(0, 0.0), (10, 1.0), (100, 0.0), (110, 1.0), (120, 0.0), (160, 1.0), (170, 0.0)]))],
            &[(70, 150)],
        ),
        scenario(
            "memory_pressure_critical",
            "critical from 5 s fires after 10 s; warn is below its recovery level, so it resolves 30 s later; a 5 s spike does not fire",
            100,
            vec![series("mlxbar_memory_pressure_level", "", steps(100, &[(0, 0.0), (5, 2.0), (30, 1.0), (80, 2.0), (85, 0.0)]))],
            &[(15, 60)],
        ),
        scenario(
            "swap_growing",
            "swap drops from 1000 to 200 MiB, then climbs 20 MiB/s to 800 MiB: fires at +520 MiB over the low; resolves once the low has left the 5 minutes and the rise is under 128 MiB",
            400,
            vec![series(
                "mlxbar_swap_used_bytes",
                "",
                (0..400).map(|t| MIB * if t < 20 { 1000.0 } else { 200.0 + 20.0 * t.clamp(30, 60) as f64 - 600.0 }).collect(),
            )],
            &[(56, 384)],
        ),
        scenario(
            "swap_in_high",
            "2000 pages/s from 10 s fires after 30 s; 500 pages/s keeps it firing; 50 pages/s from 80 s resolves 30 s later",
            150,
            vec![series("mlxbar_swap_in_pages_total", "", counter(150, &[(0, 10.0), (10, 2000.0), (70, 500.0), (80, 50.0)]))],
            &[(40, 110)],
        ),
        scenario(
            "engine_error",
            "two failed requests at 20 s fire until they are a minute old, then resolve 30 s later; the engine failing at 150 s fires until it recovers",
            220,
            vec![
                series("mlxbar_engine_failed_requests_total", "", steps(220, &[(0, 0.0), (20, 2.0)])),
                series("mlxbar_engine_failed", "", steps(220, &[(0, 0.0), (150, 1.0), (170, 0.0)])),
            ],
            &[(20, 110), (150, 200)],
        ),
        scenario(
            "queue_backlog",
            "10 waiting from 10 s fires after 30 s; 5 keeps it firing; 1 for 10 s then 5 again is bridged; resolves 30 s after the queue empties; a 20 s burst does not fire",
            200,
            vec![series("mlxbar_scheduler_waiting_requests", "", steps(200, &[(0, 0.0), (10, 10.0), (60, 5.0), (90, 1.0), (100, 5.0), (105, 0.0), (150, 20.0), (170, 0.0)]))],
            &[(40, 135)],
        ),
        scenario(
            "admission_held",
            "refusals while a bench runs do not fire; one refusal for memory pressure at 100 s fires for a minute; admission holding work back at 250 s fires until it lets go",
            320,
            vec![
                series("mlxbar_admission_refused_total", "reason=\"bench_running\"", counter(320, &[(10, 1.0), (21, 0.0)])),
                series("mlxbar_admission_refused_total", "reason=\"memory_pressure\"", steps(320, &[(0, 0.0), (100, 1.0)])),
                series("mlxbar_admission_blocked", "", steps(320, &[(0, 0.0), (250, 1.0), (260, 0.0)])),
            ],
            &[(100, 190), (250, 290)],
        ),
        scenario(
            "engine_stalled",
            "no progress from 10 s with work waiting fires at 30 s without progress; progress at 61 s resolves it 30 s later",
            120,
            vec![series("mlxbar_engine_last_step_age_seconds", "", (0..120).map(|t| if (10..=60).contains(&t) { (t - 10) as f64 } else { 0.0 }).collect())],
            &[(40, 91)],
        ),
        scenario(
            "restart_required",
            "an engine left behind at 20 s fires at once and stays firing: only a restart frees what it holds",
            60,
            vec![series("mlxbar_engine_restart_required", "", steps(60, &[(0, 0.0), (20, 1.0)]))],
            &[(20, 60)],
        ),
        scenario(
            "expert_cache_thrashing",
            "a streamed model: 20 lookups a second, 80 % missing from 0 s to 600 s, then 10 %: the 5-minute ratio is 0.8 once 100 lookups are in (5 s) and fires 5 minutes later; it falls below 0.4 at 772 s (Δmisses/6000 < 0.4) and resolves 30 s later",
            900,
            vec![
                series("mlxbar_expert_cache_hits_total", "model=\"m\"", counter(900, &[(0, 4.0), (600, 18.0)])),
                series("mlxbar_expert_cache_misses_total", "model=\"m\"", counter(900, &[(0, 16.0), (600, 2.0)])),
            ],
            &[(305, 801)],
        ),
        scenario(
            "gpu_idle_while_generating",
            "generating from 10 s with the GPU idle fires after 30 s; a 10 s burst of GPU work is bridged; resolves 30 s after generation stops; an idle GPU with nothing generating never fires",
            200,
            vec![
                series("mlxbar_scheduler_running_requests", "", steps(200, &[(0, 0.0), (10, 1.0), (120, 0.0)])),
                series("mlxbar_gpu_busy_ratio", "", steps(200, &[(0, 0.0), (70, 0.5), (80, 0.01)])),
            ],
            &[(40, 150)],
        ),
        scenario(
            "thermal_throttling",
            "serious from 20 s drops to fair at 50 s (not 60 s: no alert); critical from 55 s fires at 115 s; fair from 150 s resolves 30 s later",
            200,
            vec![series("mlxbar_thermal_pressure", "", steps(200, &[(0, 0.0), (10, 1.0), (20, 2.0), (50, 1.0), (55, 3.0), (150, 1.0)]))],
            &[(115, 180)],
        ),
        scenario(
            "cluster_rank_lost",
            "a rank of 3 lost at 20 s fires at once (rank 0 then counts none serving); the cluster restarted at 40 s resolves 30 s later",
            100,
            vec![
                series("mlxbar_cluster_ranks", "", steps(100, &[(0, 3.0)])),
                series("mlxbar_cluster_ranks_healthy", "", steps(100, &[(0, 3.0), (20, 0.0), (40, 3.0)])),
            ],
            &[(20, 70)],
        ),
    ];
    // A request a second with a 10 s TTFT from 10 s to 100 s. Both see a p90 over 5 s while
    // a request finished within the last 5 minutes (to 399 s), then no data.
    let requests = |t: usize| t.clamp(9, 100) as f64 - 9.0;
    let ttft = (0..450).map(requests).collect::<Vec<_>>();
    let mut slow = scenario(
        "ttft_p90_high",
        "requests with a 10 s TTFT from 10 s to 100 s fire after 60 s; 5 minutes after the last one the p90 has no data, and it resolves 30 s later",
        450,
        vec![
            series("mlxbar_time_to_first_token_seconds_bucket", "model=\"m\",le=\"8.192\"", vec![0.0; 450]),
            series("mlxbar_time_to_first_token_seconds_bucket", "model=\"m\",le=\"16.384\"", ttft.clone()),
            series("mlxbar_time_to_first_token_seconds_bucket", "model=\"m\",le=\"+Inf\"", ttft),
        ],
        &[(70, 430)],
    );
    slow.ttft_p90 = (0..450).map(|t| (10..400).contains(&t).then_some(10.0)).collect();
    // interpolated within the (8.192, 16.384] bucket: 8.192 + 8.192 × 0.9
    slow.promql_value = Some(15.5648);
    out.insert(5, slow);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_rule_has_a_scenario() {
        let scenarios = all();
        for r in defaults() {
            assert!(scenarios.iter().any(|s| s.rule == r.id), "no scenario for {}", r.id);
        }
        for s in &scenarios {
            assert!(s.series.iter().all(|x| x.values.len() == s.seconds), "{}", s.rule);
        }
    }

    #[test]
    fn the_app_fires_and_resolves_each_scenario_on_time() {
        for s in all() {
            assert_eq!(intervals(&s.run()), s.firing, "{}: {}", s.rule, s.about);
        }
    }

    #[test]
    fn the_signal_values_are_the_ones_the_scenarios_describe() {
        let scenarios = all();
        let value = |rule: &str, t: usize| scenarios.iter().find(|s| s.rule == rule).unwrap().run()[t].value;
        assert_eq!(value("swap_growing", 56), Some(520.0 * MIB), "the rise over the window's low, not the change over it");
        assert_eq!(value("swap_in_high", 70), Some(500.0));
        assert_eq!(value("engine_error", 79), Some(2.0));
        assert_eq!(value("engine_error", 80), Some(0.0));
        assert_eq!(value("admission_held", 20), Some(0.0), "bench refusals do not count");
        assert_eq!(value("admission_held", 100), Some(1.0));
        assert_eq!(value("engine_stalled", 40), Some(30.0));
    }
}
