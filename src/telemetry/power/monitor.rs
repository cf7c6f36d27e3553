//! The power sampler's thread and what it publishes: the latest [`PowerSample`], the last
//! hour of intervals (for [`PowerMonitor::energy_between`], a bench phase's joules) and the
//! energy-per-token [`Ledger`] the server steps once a second.
//!
//! The platform reader is made and used on this thread alone: macmon's `get_metrics` blocks
//! for its interval, and nothing here touches MLX (exo#2088: a sampler polling IOReport is
//! kept out of the inference path; see README).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::attribution::{energy_between, EnergyView, Ledger, Span, Tick};
use super::{platform, PowerSample};

/// Intervals kept for [`PowerMonitor::energy_between`].
const SPANS_KEPT: usize = 3600;

pub struct PowerMonitor {
    clock: Instant,
    latest: RwLock<Arc<PowerSample>>,
    spans: Mutex<VecDeque<Span>>,
    ledger: Mutex<Ledger>,
    stop: AtomicBool,
}

impl PowerMonitor {
    /// Samples every `interval` on a thread of its own ("mlxbar-power").
    pub fn start(interval: Duration) -> Arc<PowerMonitor> {
        let m = Arc::new(PowerMonitor::idle());
        let weak = Arc::downgrade(&m);
        std::thread::Builder::new()
            .name("mlxbar-power".into())
            .spawn(move || {
                let mut reader = platform::Reader::open();
                loop {
                    let iv = reader.next(interval);
                    let Some(m) = weak.upgrade() else { return };
                    if m.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    m.publish(m.latest().advance(platform::SOURCE, iv));
                }
            })
            .expect("power sampler thread");
        m
    }

    /// A monitor whose sampler is not running (tests, and the state before the first interval).
    pub fn idle() -> PowerMonitor {
        PowerMonitor {
            clock: Instant::now(),
            latest: RwLock::new(Arc::new(PowerSample { source: platform::SOURCE, ..Default::default() })),
            spans: Mutex::default(),
            ledger: Mutex::default(),
            stop: AtomicBool::new(false),
        }
    }

    /// A monitor that never samples: every figure unavailable for `reason`.
    pub fn disabled(reason: &str) -> PowerMonitor {
        let m = PowerMonitor::idle();
        m.publish(m.latest().advance(platform::SOURCE, super::Interval::nothing(0.0, reason)));
        m
    }

    /// Seconds on this monitor's clock (what [`PowerMonitor::energy_between`] takes).
    pub fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Takes a sample as the latest (the sampler thread's step; test hooks use it too).
    pub fn publish(&self, s: PowerSample) {
        if let Some(watts) = s.chip_watts {
            let mut spans = self.spans.lock().unwrap();
            spans.push_back(Span { end: self.now(), seconds: s.interval_seconds, watts });
            if spans.len() > SPANS_KEPT {
                spans.pop_front();
            }
        }
        *self.latest.write().unwrap() = Arc::new(s);
    }

    pub fn latest(&self) -> Arc<PowerSample> {
        self.latest.read().unwrap().clone()
    }

    /// The chip's joules between two readings of [`PowerMonitor::now`]; None without a
    /// power source or before the interval covering `to` has ended.
    pub fn energy_between(&self, from: f64, to: f64) -> Option<f64> {
        let mut spans = self.spans.lock().unwrap();
        energy_between(spans.make_contiguous(), from, to)
    }

    /// One look at the server (once a second): tokens generated so far and whether the
    /// engine has requests running.
    pub fn account(&self, tokens_total: u64, engine_busy: bool) {
        let tick = Tick { at: self.now(), chip_joules_total: self.latest().chip_joules_total, tokens_total, engine_busy };
        self.ledger.lock().unwrap().push(tick);
    }

    pub fn energy(&self) -> EnergyView {
        self.ledger.lock().unwrap().view()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::power::Component;

    #[test]
    fn a_disabled_sampler_says_so_for_every_figure() {
        let m = PowerMonitor::disabled("power_sampler = false in the config");
        let s = m.latest();
        assert!(Component::ALL.iter().all(|c| !s.available(*c)));
        assert_eq!(s.unavailable.len(), 8);
        assert!(s.unavailable.iter().all(|u| u.reason == "power_sampler = false in the config"));
        m.account(10, true);
        m.account(20, true);
        assert_eq!(m.energy().generation_joules_total, None, "no source: null, never 0 J");
        assert_eq!(m.energy_between(0.0, 0.0), None);
    }
}
