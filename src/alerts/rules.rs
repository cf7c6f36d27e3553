//! Alert rules: what each watches, its thresholds and timings, the built-in defaults, and
//! how a config file overrides them. The same rules are exported as a Prometheus rules
//! file (`mlxbar alerts prometheus-rules`, see `prometheus.rs`) so Grafana users get the
//! same alerts.
use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The signal a rule watches; each maps to one number per evaluation (see `signals.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// 0 normal, 1 warn, 2 critical (the kernel's level on macOS, PSI on Linux).
    MemoryPressure,
    /// Growth of swap used over the rule's window, bytes.
    SwapGrowth,
    /// Pages swapped in per second.
    SwapInRate,
    /// Requests the engine ended with an error within the rule's window, at least 1 while
    /// the engine has failed (model not loaded, engine thread dead).
    EngineErrors,
    /// p90 time to first token over the live window, seconds (no value without requests).
    TtftP90,
    /// Requests waiting for the engine.
    QueueBacklog,
    /// 1 while admission holds new work back (critical pressure), else requests refused
    /// for memory pressure within the rule's window (refusals during a bench run do not count).
    AdmissionHeld,
    /// Seconds the engine has made no progress while work waits or runs (0 when idle).
    EngineStalled,
    /// 1 once an engine thread was stuck past `engine_stop_seconds` or `load_timeout_seconds`
    /// and left behind: it holds its memory until mlxbar restarts.
    RestartRequired,
    /// Share of the router's selections that missed the expert cache over the rule's window
    /// (streamed mixture-of-experts models together; no value with fewer than
    /// [`super::signals::MIN_EXPERT_LOOKUPS`] lookups in it, so a cold start is not judged).
    ExpertMissRatio,
    /// While requests are generating, the share of the last second the GPU was idle (1 −
    /// busy ratio); 0 while nothing generates. No value where the GPU cannot be read (Linux).
    GpuIdleWhileGenerating,
    /// macOS thermal pressure: 0 nominal, 1 fair, 2 serious, 3 critical.
    ThermalPressure,
    /// Ranks of the cluster rank 0 serves with that are lost (0 while all serve); no value
    /// without a cluster.
    ClusterRanksLost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
}

/// One rule. It fires once the signal stays at or above `threshold` for `for_seconds`, and
/// resolves once it stays below `recover_below` for `recover_seconds` (hysteresis).
/// Notifications for one rule are at least `cooldown_seconds` apart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    pub id: String,
    pub summary: String,
    pub signal: Signal,
    pub severity: Severity,
    pub enabled: bool,
    pub threshold: f64,
    pub recover_below: f64,
    pub for_seconds: f64,
    pub recover_seconds: f64,
    pub cooldown_seconds: f64,
    /// Look-back for windowed signals (swap growth, engine errors).
    pub window_seconds: f64,
}

/// A config file's `[alerts.<id>]` table: every key optional, overriding the default rule
/// of that id (or, with `signal`, defining a new one).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleOverride {
    pub summary: Option<String>,
    pub signal: Option<Signal>,
    pub severity: Option<Severity>,
    pub enabled: Option<bool>,
    pub threshold: Option<f64>,
    pub recover_below: Option<f64>,
    pub for_seconds: Option<f64>,
    pub recover_seconds: Option<f64>,
    pub cooldown_seconds: Option<f64>,
    pub window_seconds: Option<f64>,
}

/// At most this many rules: each is a label value of `mlxbar_alerts_firing`.
pub const MAX_RULES: usize = 32;

#[allow(clippy::too_many_arguments)]
fn rule(id: &str, signal: Signal, severity: Severity, threshold: f64, recover_below: f64, for_seconds: f64, window_seconds: f64) -> Rule {
    Rule {
        id: id.into(),
        summary: summary(signal, threshold, window_seconds),
        signal,
        severity,
        enabled: true,
        threshold,
        recover_below,
        for_seconds,
        recover_seconds: 30.0,
        cooldown_seconds: 600.0,
        window_seconds,
    }
}

/// A rule's one-line description, written from its signal and threshold.
pub fn summary(signal: Signal, threshold: f64, window_seconds: f64) -> String {
    let t = super::signals::describe(signal, threshold);
    match signal {
        Signal::MemoryPressure if threshold >= 2.0 => "Memory pressure is critical".into(),
        Signal::MemoryPressure => format!("Memory pressure is at {t} or above"),
        Signal::SwapGrowth => format!("Swap rose {} or more above its lowest in {}", t.trim_start_matches('+'), minutes(window_seconds)),
        Signal::SwapInRate => format!("Swapping in {t} or more"),
        Signal::EngineErrors => "The engine failed or ended requests with an error".into(),
        Signal::TtftP90 => format!("Time to first token p90 is {t} or more"),
        Signal::QueueBacklog => format!("{threshold:.0} or more requests are waiting"),
        Signal::AdmissionHeld => "New requests are held back or refused: memory pressure is critical".into(),
        Signal::EngineStalled => format!("The engine made no progress for {threshold:.0} s with work waiting"),
        Signal::RestartRequired => "An engine is stuck and was left behind: restart mlxbar to free its memory".into(),
        Signal::ExpertMissRatio => format!(
            "{t} or more of the experts the router picks over {} are not in memory: the model is reading its experts from disk. Give it more memory (close apps, or raise expert_cache_bytes) or run a smaller model",
            minutes(window_seconds)
        ),
        Signal::GpuIdleWhileGenerating => {
            format!("Generating with the GPU {t} or more: the model may be running on the CPU")
        }
        Signal::ThermalPressure => format!("Thermal pressure is {t} or above: the Mac is throttling"),
        Signal::ClusterRanksLost => "A rank of the cluster was lost: restart every rank".into(),
    }
}

fn minutes(secs: f64) -> String {
    if secs >= 120.0 {
        format!("{:.0} minutes", secs / 60.0)
    } else {
        format!("{secs:.0} seconds")
    }
}

pub fn defaults() -> Vec<Rule> {
    use Severity::*;
    use Signal::*;
    vec![
        rule("memory_pressure_warn", MemoryPressure, Warning, 1.0, 1.0, 60.0, 0.0),
        rule("memory_pressure_critical", MemoryPressure, Critical, 2.0, 2.0, 10.0, 0.0),
        rule("swap_growing", SwapGrowth, Warning, 512.0 * 1048576.0, 128.0 * 1048576.0, 0.0, 300.0),
        rule("swap_in_high", SwapInRate, Warning, 1000.0, 100.0, 30.0, 0.0),
        rule("engine_error", EngineErrors, Critical, 1.0, 1.0, 0.0, 60.0),
        rule("ttft_p90_high", TtftP90, Warning, 5.0, 3.0, 60.0, 0.0),
        rule("queue_backlog", QueueBacklog, Warning, 8.0, 2.0, 30.0, 0.0),
        rule("admission_held", AdmissionHeld, Critical, 1.0, 1.0, 0.0, 60.0),
        rule("engine_stalled", EngineStalled, Critical, 30.0, 30.0, 0.0, 0.0),
        rule("restart_required", RestartRequired, Critical, 1.0, 1.0, 0.0, 0.0),
        rule("expert_cache_thrashing", ExpertMissRatio, Warning, 0.5, 0.4, 300.0, 300.0),
        // macOS only: GPU busy under 5 % for 30 s while requests generate
        rule("gpu_idle_while_generating", GpuIdleWhileGenerating, Warning, 0.95, 0.95, 30.0, 0.0),
        rule("thermal_throttling", ThermalPressure, Warning, 2.0, 2.0, 60.0, 0.0),
        rule("cluster_rank_lost", ClusterRanksLost, Critical, 1.0, 1.0, 0.0, 0.0),
    ]
}

/// The defaults with a config file's overrides applied, checked.
pub fn resolve(overrides: &BTreeMap<String, RuleOverride>) -> Result<Vec<Rule>> {
    let mut rules = defaults();
    for (id, o) in overrides {
        let r = match rules.iter_mut().find(|r| &r.id == id) {
            Some(r) => r,
            None => {
                let Some(signal) = o.signal else { bail!("alert rule {id:?} is not a built-in one: give it a `signal`") };
                let valid = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    bail!("alert rule id {id:?}: use letters, digits and _");
                }
                rules.push(rule(id, signal, Severity::Warning, f64::INFINITY, f64::INFINITY, 0.0, 60.0));
                rules.last_mut().unwrap()
            }
        };
        let threshold_given = o.threshold.is_some();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = o.$f.clone() { r.$f = v; } )* };
        }
        set!(summary, signal, severity, enabled, threshold, recover_below, for_seconds, recover_seconds, cooldown_seconds, window_seconds);
        if threshold_given && o.recover_below.is_none() && r.recover_below > r.threshold {
            r.recover_below = r.threshold;
        }
        if o.summary.is_none() {
            r.summary = summary(r.signal, r.threshold, r.window_seconds);
        }
        if !r.threshold.is_finite() {
            bail!("alert rule {id:?} needs a threshold");
        }
        if r.recover_below > r.threshold {
            bail!("alert rule {id:?}: recover_below ({}) must not exceed threshold ({})", r.recover_below, r.threshold);
        }
        for (name, v) in [
            ("for_seconds", r.for_seconds),
            ("recover_seconds", r.recover_seconds),
            ("cooldown_seconds", r.cooldown_seconds),
            ("window_seconds", r.window_seconds),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                bail!("alert rule {id:?}: {name} must be a non-negative number of seconds");
            }
        }
    }
    if rules.len() > MAX_RULES {
        bail!("at most {MAX_RULES} alert rules");
    }
    Ok(rules)
}

/// The rules as a Prometheus rules file (kept here for `mlxbar alerts prometheus-rules`).
pub use super::prometheus::prometheus_rules;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<Vec<Rule>> {
        let o: BTreeMap<String, RuleOverride> = toml::from_str(toml_text)?;
        resolve(&o)
    }

    #[test]
    fn overrides_change_one_rule_and_keep_the_rest() {
        let rules = parse("[queue_backlog]\nthreshold = 1\nfor_seconds = 0\n").unwrap();
        let q = rules.iter().find(|r| r.id == "queue_backlog").unwrap();
        assert_eq!((q.threshold, q.recover_below, q.for_seconds), (1.0, 1.0, 0.0), "recover_below follows a lowered threshold");
        assert_eq!(rules.len(), defaults().len());
        assert_eq!(rules.iter().find(|r| r.id == "memory_pressure_warn"), defaults().iter().find(|r| r.id == "memory_pressure_warn"));
    }

    #[test]
    fn bad_overrides_are_refused_with_a_reason() {
        assert!(parse("[nope]\nthreshold = 1\n").unwrap_err().to_string().contains("signal"));
        assert!(parse("[queue_backlog]\nrecover_below = 50\n").unwrap_err().to_string().contains("recover_below"));
        assert!(parse("[queue_backlog]\nfor_seconds = -1\n").unwrap_err().to_string().contains("for_seconds"));
        assert!(parse("[queue_backlog]\nthreshhold = 1\n").is_err(), "unknown keys are errors");
        assert!(parse("[\"bad id\"]\nsignal = \"queue_backlog\"\nthreshold = 1\n").is_err());
        let custom = parse("[tiny_queue]\nsignal = \"queue_backlog\"\nthreshold = 2\n").unwrap();
        assert_eq!(custom.last().unwrap().id, "tiny_queue");
    }
}
