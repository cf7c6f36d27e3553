//! One rule's state over time: a pure state machine stepped once per evaluation with the
//! signal's value, deciding when to fire, resolve and notify.
//!
//! ok → pending (value ≥ threshold) → firing (held for `for_seconds`)
//!    → resolving (value < recover_below) → ok (held for `recover_seconds`).
//! A firing notice goes out only if the rule is not snoozed and the last one is at least
//! `cooldown_seconds` old, so a flapping signal notifies at most once per cooldown; a
//! resolved notice follows only a firing notice that went out.
use std::time::{Duration, Instant};

use serde::Serialize;

use super::rules::Rule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Ok,
    Pending,
    Firing,
    Resolving,
}

impl Phase {
    /// Firing as users see it: resolving alerts still count until they resolve.
    pub fn is_firing(self) -> bool {
        matches!(self, Phase::Firing | Phase::Resolving)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    Firing,
    Resolved,
}

#[derive(Debug, Clone)]
pub struct RuleState {
    pub phase: Phase,
    /// When the current phase began.
    pub since: Instant,
    /// When the current episode started firing.
    pub fired_at: Option<Instant>,
    pub value: Option<f64>,
    pub snoozed_until: Option<Instant>,
    last_notice: Option<Instant>,
    /// This episode's firing notice went out (so its resolution is announced too).
    announced: bool,
}

impl RuleState {
    pub fn new(now: Instant) -> Self {
        RuleState { phase: Phase::Ok, since: now, fired_at: None, value: None, snoozed_until: None, last_notice: None, announced: false }
    }

    pub fn is_snoozed(&self, now: Instant) -> bool {
        self.snoozed_until.is_some_and(|t| now < t)
    }

    pub fn snooze(&mut self, now: Instant, length: Duration) {
        self.snoozed_until = Some(now + length);
    }

    pub fn unsnooze(&mut self) {
        self.snoozed_until = None;
    }

    /// Takes one reading (None: no data, which never fires and counts as recovered) and
    /// says which notice, if any, to send.
    pub fn step(&mut self, rule: &Rule, value: Option<f64>, now: Instant) -> Option<NoticeKind> {
        self.value = value;
        if !rule.enabled {
            *self = RuleState { snoozed_until: self.snoozed_until, last_notice: self.last_notice, ..RuleState::new(now) };
            return None;
        }
        let above = value.is_some_and(|v| v >= rule.threshold);
        let recovered = value.is_none_or(|v| v < rule.recover_below);
        let held = |since: Instant, secs: f64| now.saturating_duration_since(since) >= Duration::from_secs_f64(secs);
        // Zero-length `for`/`recover` windows pass through two phases in one step.
        for _ in 0..2 {
            match self.phase {
                Phase::Ok if above => self.enter(Phase::Pending, now),
                Phase::Ok => return None,
                Phase::Pending if !above => {
                    self.enter(Phase::Ok, now);
                    return None;
                }
                Phase::Pending if held(self.since, rule.for_seconds) => {
                    self.enter(Phase::Firing, now);
                    self.fired_at = Some(now);
                    let cooled = self.last_notice.is_none_or(|t| held(t, rule.cooldown_seconds));
                    self.announced = cooled && !self.is_snoozed(now);
                    if self.announced {
                        self.last_notice = Some(now);
                        return Some(NoticeKind::Firing);
                    }
                    return None;
                }
                Phase::Pending => return None,
                Phase::Firing if recovered => self.enter(Phase::Resolving, now),
                Phase::Firing => return None,
                Phase::Resolving if !recovered => {
                    self.phase = Phase::Firing;
                    return None;
                }
                Phase::Resolving if held(self.since, rule.recover_seconds) => {
                    let announce = self.announced && !self.is_snoozed(now);
                    self.enter(Phase::Ok, now);
                    self.fired_at = None;
                    self.announced = false;
                    return announce.then_some(NoticeKind::Resolved);
                }
                Phase::Resolving => return None,
            }
        }
        None
    }

    fn enter(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.since = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::rules::{Rule, Severity, Signal};

    fn rule() -> Rule {
        Rule {
            id: "t".into(),
            summary: "t".into(),
            signal: Signal::QueueBacklog,
            severity: Severity::Warning,
            enabled: true,
            threshold: 10.0,
            recover_below: 5.0,
            for_seconds: 3.0,
            recover_seconds: 2.0,
            cooldown_seconds: 60.0,
            window_seconds: 0.0,
        }
    }

    /// Feeds one value a second; returns (second, notice) for each notice sent.
    fn run(rule: &Rule, state: &mut RuleState, t0: Instant, start: u64, values: &[f64]) -> Vec<(u64, NoticeKind)> {
        let mut out = vec![];
        for (i, v) in values.iter().enumerate() {
            let t = start + i as u64;
            if let Some(n) = state.step(rule, Some(*v), t0 + Duration::from_secs(t)) {
                out.push((t, n));
            }
        }
        out
    }

    #[test]
    fn fires_only_after_for_and_resolves_after_recovery_window() {
        let (r, t0) = (rule(), Instant::now());
        let mut s = RuleState::new(t0);
        // above from t=1; `for` is 3 s, so it fires at t=4
        let notices = run(&r, &mut s, t0, 0, &[0.0, 12.0, 12.0, 12.0, 12.0, 12.0]);
        assert_eq!(notices, vec![(4, NoticeKind::Firing)]);
        assert_eq!(s.phase, Phase::Firing);
        // 7 is below threshold but above recover_below: still firing (hysteresis)
        assert!(run(&r, &mut s, t0, 6, &[7.0, 7.0, 7.0, 7.0]).is_empty());
        assert_eq!(s.phase, Phase::Firing);
        // below 5 from t=10; resolves 2 s later
        assert_eq!(run(&r, &mut s, t0, 10, &[1.0, 1.0, 1.0, 1.0]), vec![(12, NoticeKind::Resolved)]);
        assert_eq!(s.phase, Phase::Ok);
    }

    #[test]
    fn a_short_spike_does_not_fire() {
        let (r, t0) = (rule(), Instant::now());
        let mut s = RuleState::new(t0);
        assert!(run(&r, &mut s, t0, 0, &[12.0, 12.0, 0.0, 12.0, 12.0, 0.0, 0.0]).is_empty());
        assert_eq!(s.phase, Phase::Ok);
    }

    #[test]
    fn flapping_notifies_once_per_cooldown() {
        let (mut r, t0) = (rule(), Instant::now());
        r.for_seconds = 0.0;
        r.recover_seconds = 0.0;
        let mut s = RuleState::new(t0);
        // up/down every second for 50 s: one firing notice and its resolution
        let flaps: Vec<f64> = (0..50).map(|i| if i % 2 == 0 { 20.0 } else { 0.0 }).collect();
        assert_eq!(run(&r, &mut s, t0, 0, &flaps), vec![(0, NoticeKind::Firing), (1, NoticeKind::Resolved)]);
        // after the cooldown it may notify again
        let again = run(&r, &mut s, t0, 60, &[20.0, 0.0]);
        assert_eq!(again, vec![(60, NoticeKind::Firing), (61, NoticeKind::Resolved)]);
    }

    #[test]
    fn snoozed_rules_stay_visible_but_silent() {
        let (r, t0) = (rule(), Instant::now());
        let mut s = RuleState::new(t0);
        s.snooze(t0, Duration::from_secs(100));
        assert!(run(&r, &mut s, t0, 0, &[20.0; 6]).is_empty());
        assert!(s.phase.is_firing(), "a snoozed alert is still firing, just quiet");
        assert!(run(&r, &mut s, t0, 6, &[0.0; 4]).is_empty(), "no resolved notice for an unannounced alert");
        // once the snooze is over it notifies again
        assert_eq!(run(&r, &mut s, t0, 100, &[20.0; 5]), vec![(103, NoticeKind::Firing)]);
        s.snooze(t0 + Duration::from_secs(105), Duration::from_secs(10));
        assert!(s.is_snoozed(t0 + Duration::from_secs(110)));
        s.unsnooze();
        assert!(!s.is_snoozed(t0 + Duration::from_secs(110)));
    }

    #[test]
    fn missing_data_never_fires_and_counts_as_recovered() {
        let (mut r, t0) = (rule(), Instant::now());
        r.for_seconds = 0.0;
        let mut s = RuleState::new(t0);
        assert_eq!(s.step(&r, None, t0), None);
        assert_eq!(s.step(&r, Some(11.0), t0), Some(NoticeKind::Firing));
        assert_eq!(s.step(&r, None, t0 + Duration::from_secs(1)), None);
        assert_eq!(s.phase, Phase::Resolving);
        assert_eq!(s.step(&r, None, t0 + Duration::from_secs(3)), Some(NoticeKind::Resolved));
    }

    #[test]
    fn disabling_a_rule_clears_it() {
        let (mut r, t0) = (rule(), Instant::now());
        r.for_seconds = 0.0;
        let mut s = RuleState::new(t0);
        s.step(&r, Some(11.0), t0);
        r.enabled = false;
        assert_eq!(s.step(&r, Some(11.0), t0), None);
        assert_eq!(s.phase, Phase::Ok);
    }
}
