//! Energy per token, as pure bookkeeping: which joules generation spent, and what a window
//! of time cost.
//!
//! [`Ledger`] is stepped once a second with the chip's energy counter, the tokens generated
//! so far and whether the engine had work: the energy of a second in which the engine had
//! work (or produced tokens) is generation's, split over the tokens of those seconds; the
//! other seconds give the idle power reported beside it. [`energy_between`] integrates the
//! sampler's piecewise-constant power over any span (a bench phase).
use std::collections::VecDeque;

use serde::Serialize;

/// The tokens-per-joule and idle-power figures look back this far.
pub const WINDOW_SECONDS: f64 = 60.0;

/// One look at the server, once a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    /// Seconds on a monotonic clock.
    pub at: f64,
    /// The chip's energy counter ([`super::PowerSample::chip_joules_total`]).
    pub chip_joules_total: Option<f64>,
    /// Tokens generated since start.
    pub tokens_total: u64,
    /// The engine had requests running (prefill or decode) at this look.
    pub engine_busy: bool,
}

/// One second between two ticks.
#[derive(Debug, Clone, Copy)]
struct Step {
    at: f64,
    seconds: f64,
    joules: f64,
    tokens: u64,
    generating: bool,
}

/// What the snapshot shows of energy per token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct EnergyView {
    /// Energy spent in seconds the engine was generating, since start; null without a
    /// power source.
    pub generation_joules_total: Option<f64>,
    /// Tokens generated in those seconds.
    pub generation_tokens_total: u64,
    /// Tokens over joules of the generating seconds of the last minute; null when none.
    pub tokens_per_joule_last_minute: Option<f64>,
    /// Mean chip power in those generating seconds.
    pub generating_watts: Option<f64>,
    /// Mean chip power in the last minute's worth of idle seconds; null before any.
    pub idle_watts: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    prev: Option<Tick>,
    /// Generating seconds of the last [`WINDOW_SECONDS`].
    recent: VecDeque<Step>,
    /// The last [`WINDOW_SECONDS`] seconds of idle steps, however old.
    idle: VecDeque<Step>,
    generation_joules: Option<f64>,
    generation_tokens: u64,
}

impl Ledger {
    pub fn push(&mut self, t: Tick) {
        let Some(prev) = self.prev.replace(t) else { return };
        let seconds = t.at - prev.at;
        let (Some(a), Some(b)) = (prev.chip_joules_total, t.chip_joules_total) else { return };
        if seconds <= 0.0 || b < a {
            return;
        }
        let tokens = t.tokens_total.saturating_sub(prev.tokens_total);
        let step = Step { at: t.at, seconds, joules: b - a, tokens, generating: prev.engine_busy || t.engine_busy || tokens > 0 };
        if step.generating {
            *self.generation_joules.get_or_insert(0.0) += step.joules;
            self.generation_tokens += tokens;
            self.recent.push_back(step);
        } else {
            self.generation_joules.get_or_insert(0.0);
            self.idle.push_back(step);
            while self.idle.iter().map(|s| s.seconds).sum::<f64>() - self.idle[0].seconds >= WINDOW_SECONDS {
                self.idle.pop_front();
            }
        }
        while self.recent.front().is_some_and(|s| t.at - s.at >= WINDOW_SECONDS) {
            self.recent.pop_front();
        }
    }

    pub fn view(&self) -> EnergyView {
        let sum = |steps: &VecDeque<Step>| steps.iter().fold((0.0, 0.0, 0u64), |(j, s, n), x| (j + x.joules, s + x.seconds, n + x.tokens));
        let (gen_j, gen_s, gen_n) = sum(&self.recent);
        let (idle_j, idle_s, _) = sum(&self.idle);
        EnergyView {
            generation_joules_total: self.generation_joules,
            generation_tokens_total: self.generation_tokens,
            tokens_per_joule_last_minute: (gen_j > 0.0 && gen_n > 0).then(|| gen_n as f64 / gen_j),
            generating_watts: (gen_s > 0.0).then(|| gen_j / gen_s),
            idle_watts: (idle_s > 0.0).then(|| idle_j / idle_s),
        }
    }
}

/// One sampler interval: it ended at `end` (seconds on a monotonic clock), lasted
/// `seconds`, and the chip drew `watts` on average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub end: f64,
    pub seconds: f64,
    pub watts: f64,
}

/// Joules between `from` and `to`: each interval's mean power times its overlap with the
/// span. None when the intervals do not cover the span (the sampler was not running, or
/// its interval covering `to` has not ended yet).
pub fn energy_between(spans: &[Span], from: f64, to: f64) -> Option<f64> {
    if to < from {
        return None;
    }
    let covered_from = spans.iter().map(|s| s.end - s.seconds).fold(f64::INFINITY, f64::min);
    let covered_to = spans.iter().map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
    if covered_from > from || covered_to < to {
        return None;
    }
    Some(spans.iter().map(|s| s.watts * ((s.end.min(to) - (s.end - s.seconds).max(from)).max(0.0))).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(at: f64, joules: f64, tokens: u64, busy: bool) -> Tick {
        Tick { at, chip_joules_total: Some(joules), tokens_total: tokens, engine_busy: busy }
    }

    #[test]
    fn generating_seconds_are_split_over_their_tokens_and_idle_stands_beside() {
        // Idle at 0.34 W (macmon readme's idle M-series CPU+GPU+ANE+DRAM), then 10 s
        // generating at 20.5 W and 41 tok/s, then idle again.
        let mut l = Ledger::default();
        let (mut at, mut j, mut n) = (0.0, 0.0, 0);
        l.push(tick(at, j, n, false));
        for _ in 0..5 {
            (at, j) = (at + 1.0, j + 0.34);
            l.push(tick(at, j, n, false));
        }
        for _ in 0..10 {
            (at, j, n) = (at + 1.0, j + 20.5, n + 41);
            l.push(tick(at, j, n, true));
        }
        // the second after the engine went idle still counts (it had work at its start)
        (at, j) = (at + 1.0, j + 2.0);
        l.push(tick(at, j, n, false));
        for _ in 0..3 {
            (at, j) = (at + 1.0, j + 0.34);
            l.push(tick(at, j, n, false));
        }
        let v = l.view();
        assert!((v.generation_joules_total.unwrap() - 207.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.generation_tokens_total, 410);
        assert!((v.tokens_per_joule_last_minute.unwrap() - 410.0 / 207.0).abs() < 1e-9);
        assert!((v.idle_watts.unwrap() - 0.34).abs() < 1e-9);
        assert!((v.generating_watts.unwrap() - 207.0 / 11.0).abs() < 1e-9);
    }

    #[test]
    fn no_source_means_no_figures_and_old_generation_leaves_the_minute() {
        let mut l = Ledger::default();
        l.push(Tick { at: 0.0, chip_joules_total: None, tokens_total: 0, engine_busy: true });
        l.push(Tick { at: 1.0, chip_joules_total: None, tokens_total: 5, engine_busy: true });
        assert_eq!(l.view(), EnergyView::default(), "no power source: null, never 0 J");
        let mut l = Ledger::default();
        l.push(tick(0.0, 0.0, 0, true));
        l.push(tick(1.0, 10.0, 20, true));
        l.push(tick(2.0, 20.0, 40, false));
        assert_eq!(l.view().tokens_per_joule_last_minute, Some(2.0));
        for s in 3..=70 {
            l.push(tick(s as f64, 20.0 + (s - 2) as f64, 40, false));
        }
        let v = l.view();
        assert_eq!(v.tokens_per_joule_last_minute, None, "nothing generated in the last minute");
        assert_eq!((v.generation_joules_total, v.generation_tokens_total), (Some(20.0), 40), "the totals stay");
        assert_eq!(v.idle_watts, Some(1.0));
    }

    #[test]
    fn energy_between_integrates_the_overlap() {
        // three 1 s intervals ending at 1, 2, 3 s at 10, 20, 30 W
        let spans = [
            Span { end: 1.0, seconds: 1.0, watts: 10.0 },
            Span { end: 2.0, seconds: 1.0, watts: 20.0 },
            Span { end: 3.0, seconds: 1.0, watts: 30.0 },
        ];
        assert_eq!(energy_between(&spans, 0.5, 2.5), Some(5.0 + 20.0 + 15.0));
        assert_eq!(energy_between(&spans, 1.0, 1.0), Some(0.0));
        assert_eq!(energy_between(&spans, 2.5, 3.5), None, "the interval covering 3.5 s has not ended");
        assert_eq!(energy_between(&[], 0.0, 1.0), None);
    }
}
