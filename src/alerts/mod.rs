//! The alert engine: rules from the config (with good defaults) evaluated once a second
//! against the server's telemetry, with `for` durations, hysteresis, cooldowns and snoozes.
//! Notices go to subscribers (the menu-bar app turns them into native notifications; the
//! headless server logs them); state shows in `/metrics`, the live snapshot and
//! `/api/alerts`. Snoozes survive a restart ([`Alerts::persist_in`]).
pub mod monitor;
pub mod prometheus;
pub mod promtool;
pub mod rules;
pub mod scenarios;
pub mod signals;
pub mod state;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::broadcast;

pub use rules::{Rule, RuleOverride, Severity, Signal};
use signals::{History, Reading};
use state::RuleState;
pub use state::{NoticeKind, Phase};

use crate::state_store::StateStore;

/// A notification to show: an alert started firing or resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Notice {
    pub alert: String,
    pub kind: NoticeKind,
    pub severity: Severity,
    pub title: String,
    pub body: String,
}

/// One alert as the API and UI show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct AlertView {
    pub id: String,
    pub summary: String,
    pub severity: Severity,
    pub signal: Signal,
    pub enabled: bool,
    pub state: Phase,
    pub firing: bool,
    pub value: Option<f64>,
    /// The value in words ("warn", "+600 MiB", "3.20 s").
    pub value_text: Option<String>,
    pub threshold: f64,
    pub recover_below: f64,
    pub for_seconds: f64,
    /// Seconds in the current state.
    pub state_seconds: f64,
    pub snoozed: bool,
    pub snoozed_until_unix: Option<u64>,
}

/// Longest snooze accepted from the API.
pub const MAX_SNOOZE: Duration = Duration::from_secs(7 * 24 * 3600);

pub struct Alerts {
    rules: Vec<Rule>,
    inner: Mutex<Inner>,
    notices: broadcast::Sender<Notice>,
    /// Where snoozes are saved, once [`Alerts::persist_in`] set it.
    store: OnceLock<Arc<StateStore>>,
}

struct Inner {
    states: Vec<RuleState>,
    history: History,
}

impl Alerts {
    pub fn new(rules: Vec<Rule>) -> Arc<Alerts> {
        let now = Instant::now();
        let states = rules.iter().map(|_| RuleState::new(now)).collect();
        Arc::new(Alerts {
            rules,
            inner: Mutex::new(Inner { states, history: History::default() }),
            notices: broadcast::channel(64).0,
            store: OnceLock::new(),
        })
    }

    /// Restores the snoozes `store` holds (still running ones, of rules that exist; the
    /// rest are dropped from it) and saves every snooze from now on.
    pub fn persist_in(&self, store: Arc<StateStore>) {
        let (now, unix) = (Instant::now(), unix_now());
        let saved = store.get().snoozes;
        {
            let mut inner = self.inner.lock().unwrap();
            for (id, &until) in &saved {
                match self.rules.iter().position(|r| r.id == *id) {
                    Some(i) if until > unix => inner.states[i].snooze(now, Duration::from_secs(until - unix).min(MAX_SNOOZE)),
                    Some(_) => {}
                    None => tracing::info!("dropping the saved snooze of alert {id}: no such alert any more"),
                }
            }
        }
        store.update(|p| p.snoozes.retain(|id, until| *until > unix && self.rules.iter().any(|r| r.id == *id)));
        let _ = self.store.set(store);
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Notices from now on. A slow subscriber misses old notices rather than blocking.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// Steps every rule with one reading; returns (and publishes) the notices to send.
    pub fn evaluate(&self, reading: &Reading, now: Instant) -> Vec<Notice> {
        let mut out = vec![];
        {
            let mut guard = self.inner.lock().unwrap();
            let inner = &mut *guard;
            inner.history.push(now, reading);
            for (rule, st) in self.rules.iter().zip(inner.states.iter_mut()) {
                let value = inner.history.value(rule, reading, now);
                if let Some(kind) = st.step(rule, value, now) {
                    let mut n = notice(rule, kind, value);
                    if rule.signal == Signal::ThermalPressure && kind == NoticeKind::Firing {
                        // the pressure has stood at the threshold for `for_seconds`
                        if let Some((then, now_tps)) = inner.history.throughput_since(now, rule.for_seconds) {
                            n.body += &throughput_change(then, now_tps);
                        }
                    }
                    // Which rank: what the user must go and look at.
                    if let (Signal::ClusterRanksLost, NoticeKind::Firing, Some(why)) = (rule.signal, kind, &reading.cluster_lost) {
                        let mut why = why.trim_end_matches('.').to_string();
                        if let Some(first) = why.get(..1).map(str::to_uppercase) {
                            why.replace_range(..1, &first);
                        }
                        n.body = format!("{} {why}.", n.body);
                    }
                    out.push(n);
                }
            }
        }
        for n in &out {
            let _ = self.notices.send(n.clone());
        }
        out
    }

    pub fn view(&self) -> Vec<AlertView> {
        let now = Instant::now();
        let inner = self.inner.lock().unwrap();
        self.rules.iter().zip(&inner.states).map(|(r, s)| view(r, s, now)).collect()
    }

    /// (id, firing) for every rule, for `mlxbar_alerts_firing`.
    pub fn firing(&self) -> Vec<(String, bool)> {
        let inner = self.inner.lock().unwrap();
        self.rules.iter().zip(&inner.states).map(|(r, s)| (r.id.clone(), s.phase.is_firing())).collect()
    }

    /// Silences an alert's notifications for `length` (None: lifts the snooze). None if
    /// there is no such alert.
    pub fn snooze(&self, id: &str, length: Option<Duration>) -> Option<AlertView> {
        let now = Instant::now();
        let i = self.rules.iter().position(|r| r.id == id)?;
        let mut inner = self.inner.lock().unwrap();
        let st = &mut inner.states[i];
        match length {
            Some(d) => st.snooze(now, d.min(MAX_SNOOZE)),
            None => st.unsnooze(),
        }
        let shown = view(&self.rules[i], st, now);
        drop(inner);
        if let Some(store) = self.store.get() {
            let unix = unix_now();
            store.update(|p| {
                p.snoozes.retain(|_, until| *until > unix);
                match shown.snoozed_until_unix {
                    Some(until) => p.snoozes.insert(id.to_string(), until),
                    None => p.snoozes.remove(id),
                };
            });
        }
        Some(shown)
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// " Tokens/s 40.0 → 25.0 since it started (−38 %)." for a thermal notice.
fn throughput_change(then: f64, now: f64) -> String {
    if then > 0.0 {
        format!(" Tokens/s {then:.1} → {now:.1} since it started ({:+.0} %).", (now / then - 1.0) * 100.0)
    } else {
        format!(" Tokens/s {then:.1} → {now:.1} since it started.")
    }
}

fn notice(rule: &Rule, kind: NoticeKind, value: Option<f64>) -> Notice {
    let now_text = value.map(|v| signals::describe(rule.signal, v)).unwrap_or_else(|| "no data".into());
    let (title, body) = match kind {
        NoticeKind::Firing => {
            (rule.summary.clone(), format!("Now {now_text} (alert at {}).", signals::describe(rule.signal, rule.threshold)))
        }
        NoticeKind::Resolved => (format!("Resolved: {}", rule.summary), format!("Back to {now_text}.")),
    };
    Notice { alert: rule.id.clone(), kind, severity: rule.severity, title, body }
}

fn view(rule: &Rule, st: &RuleState, now: Instant) -> AlertView {
    let snoozed = st.is_snoozed(now);
    let unix_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    AlertView {
        id: rule.id.clone(),
        summary: rule.summary.clone(),
        severity: rule.severity,
        signal: rule.signal,
        enabled: rule.enabled,
        state: st.phase,
        firing: st.phase.is_firing(),
        value: st.value,
        value_text: st.value.map(|v| signals::describe(rule.signal, v)),
        threshold: rule.threshold,
        recover_below: rule.recover_below,
        for_seconds: rule.for_seconds,
        state_seconds: now.saturating_duration_since(st.since).as_secs_f64(),
        snoozed,
        snoozed_until_unix: st.snoozed_until.filter(|_| snoozed).map(|t| (unix_now + t.saturating_duration_since(now)).as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notices_reach_subscribers_and_snoozes_show_in_the_view() {
        let mut rules = rules::defaults();
        let q = rules.iter_mut().find(|r| r.id == "queue_backlog").unwrap();
        q.for_seconds = 0.0;
        let alerts = Alerts::new(rules);
        let mut rx = alerts.subscribe();
        let t0 = Instant::now();
        let busy = Reading { waiting_requests: 20.0, ..Default::default() };
        let sent = alerts.evaluate(&busy, t0);
        assert_eq!(sent.len(), 1);
        let got = rx.recv().await.unwrap();
        assert_eq!((got.alert.as_str(), got.kind), ("queue_backlog", NoticeKind::Firing));
        assert_eq!(got.body, "Now 20 waiting (alert at 8 waiting).");
        assert!(alerts.firing().contains(&("queue_backlog".to_string(), true)));

        let v = alerts.snooze("queue_backlog", Some(Duration::from_secs(600))).unwrap();
        assert!(v.snoozed && v.firing);
        assert!(v.snoozed_until_unix.unwrap() > SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 590);
        assert!(alerts.snooze("nope", None).is_none());
        assert!(!alerts.snooze("queue_backlog", None).unwrap().snoozed);
    }

    #[test]
    fn a_thermal_notice_says_how_far_tokens_per_second_fell() {
        let alerts = Alerts::new(rules::defaults());
        let t0 = Instant::now();
        let mut sent = vec![];
        for t in 0..=60u64 {
            // serious from the start; decode slows from 40 to 25 tok/s as the clocks drop
            let r = Reading { thermal_pressure: Some(2.0), tokens_per_second: 40.0 - 15.0 * (t as f64 / 60.0), ..Default::default() };
            sent.extend(alerts.evaluate(&r, t0 + Duration::from_secs(t)));
        }
        let n = sent.iter().find(|n| n.alert == "thermal_throttling").expect("fires after 60 s");
        assert_eq!(n.title, "Thermal pressure is serious or above: the Mac is throttling");
        assert_eq!(n.body, "Now serious (alert at serious). Tokens/s 40.0 → 25.0 since it started (-38 %).");
        assert!(!sent.iter().any(|n| n.alert == "gpu_idle_while_generating"), "no GPU reading: never fires");
    }

    #[test]
    fn snoozes_are_saved_and_restored() {
        let dir = tempfile::tempdir().unwrap();
        let alerts = Alerts::new(rules::defaults());
        alerts.persist_in(StateStore::open(dir.path()));
        let until = alerts.snooze("queue_backlog", Some(Duration::from_secs(600))).unwrap().snoozed_until_unix.unwrap();
        alerts.snooze("engine_stalled", Some(Duration::from_secs(60)));
        alerts.snooze("engine_stalled", None);

        let store = StateStore::open(dir.path());
        store.update(|p| {
            p.snoozes.insert("gone_rule".into(), until);
            p.snoozes.insert("swap_growing".into(), 1);
        });
        let restarted = Alerts::new(rules::defaults());
        restarted.persist_in(store.clone());
        let view = restarted.view();
        let q = view.iter().find(|a| a.id == "queue_backlog").unwrap();
        assert!(q.snoozed, "{q:?}");
        assert!(q.snoozed_until_unix.unwrap().abs_diff(until) <= 1);
        assert!(view.iter().filter(|a| a.id != "queue_backlog").all(|a| !a.snoozed), "lifted, expired and unknown ones are not");
        assert_eq!(store.get().snoozes.keys().collect::<Vec<_>>(), ["queue_backlog"], "the rest are dropped from the file");
    }
}
