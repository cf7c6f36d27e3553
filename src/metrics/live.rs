//! Rolling windows behind the live views (`/api/metrics/snapshot` and `/stream`): latency
//! percentiles over the last minutes (hdrhistogram, one per minute, merged on read) and a
//! per-second throughput series.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles cover this many minutes.
pub const WINDOW_MINUTES: usize = 5;
/// The throughput series covers this many seconds, one point a second.
pub const SERIES_SECONDS: usize = 600;

#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Distributions {
    pub window_minutes: usize,
    pub ttft_seconds: Percentiles,
    pub itl_seconds: Percentiles,
    pub e2e_seconds: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub resolution_seconds: u64,
    /// Oldest first; the last point is the current, still filling second.
    pub tokens_per_second: Vec<u64>,
    pub requests_per_second: Vec<u64>,
}

struct MinuteHists {
    minute: u64,
    ttft: Histogram<u64>,
    itl: Histogram<u64>,
    e2e: Histogram<u64>,
}

impl MinuteHists {
    fn new(minute: u64) -> Self {
        // microseconds, 1 us .. 1 h, 3 significant digits
        let h = || Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        MinuteHists { minute, ttft: h(), itl: h(), e2e: h() }
    }
}

struct Inner {
    minutes: Vec<MinuteHists>,
    /// (second index, tokens, requests)
    seconds: Vec<(u64, u64, u64)>,
}

pub struct LiveStats {
    start: Instant,
    inner: Mutex<Inner>,
    version: AtomicU64,
    errors: AtomicU64,
    requests: AtomicU64,
    tokens: AtomicU64,
}

impl Default for LiveStats {
    fn default() -> Self {
        LiveStats { start: Instant::now(), inner: Mutex::new(Inner { minutes: vec![], seconds: vec![] }), version: AtomicU64::new(0), errors: AtomicU64::new(0), requests: AtomicU64::new(0), tokens: AtomicU64::new(0) }
    }
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 3_600_000_000)
}

impl LiveStats {
    /// Bumped on every recorded event: the stream sends a snapshot when it moved.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    fn now_secs(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner, u64) -> R) -> R {
        let now = self.now_secs();
        let r = f(&mut self.inner.lock().unwrap(), now);
        self.version.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn second(inner: &mut Inner, now: u64) -> &mut (u64, u64, u64) {
        if inner.seconds.last().is_none_or(|s| s.0 != now) {
            inner.seconds.push((now, 0, 0));
            let keep_from = now.saturating_sub(SERIES_SECONDS as u64 - 1);
            inner.seconds.retain(|s| s.0 >= keep_from);
        }
        inner.seconds.last_mut().unwrap()
    }

    fn minute(inner: &mut Inner, now: u64) -> &mut MinuteHists {
        let m = now / 60;
        if inner.minutes.last().is_none_or(|h| h.minute != m) {
            inner.minutes.push(MinuteHists::new(m));
            inner.minutes.retain(|h| h.minute + WINDOW_MINUTES as u64 > m);
        }
        inner.minutes.last_mut().unwrap()
    }

    /// A request that ended in an error (the alert engine watches these).
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Requests finished and tokens generated since start (the popover's "served" line).
    pub fn totals(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.tokens.load(Ordering::Relaxed))
    }

    /// A generated token, and the gap since the request's previous one.
    pub fn token(&self, gap: Option<Duration>) {
        self.tokens.fetch_add(1, Ordering::Relaxed);
        self.with(|inner, now| {
            Self::second(inner, now).1 += 1;
            if let Some(g) = gap {
                let _ = Self::minute(inner, now).itl.record(micros(g));
            }
        });
    }

    /// A finished request's time to first token and end-to-end time.
    pub fn request(&self, ttft: Duration, e2e: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.with(|inner, now| {
            Self::second(inner, now).2 += 1;
            let h = Self::minute(inner, now);
            let _ = h.ttft.record(micros(ttft));
            let _ = h.e2e.record(micros(e2e));
        });
    }

    pub fn distributions(&self) -> Distributions {
        let now = self.now_secs();
        let inner = self.inner.lock().unwrap();
        let live: Vec<&MinuteHists> = inner.minutes.iter().filter(|h| h.minute + WINDOW_MINUTES as u64 > now / 60).collect();
        let merged = |pick: fn(&MinuteHists) -> &Histogram<u64>| {
            let mut all = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
            for h in &live {
                all.add(pick(h)).unwrap();
            }
            if all.is_empty() {
                return Percentiles::default();
            }
            let q = |x: f64| all.value_at_quantile(x) as f64 / 1e6;
            Percentiles { count: all.len(), p50: q(0.5), p90: q(0.9), p99: q(0.99) }
        };
        Distributions { window_minutes: WINDOW_MINUTES, ttft_seconds: merged(|h| &h.ttft), itl_seconds: merged(|h| &h.itl), e2e_seconds: merged(|h| &h.e2e) }
    }

    /// The last [`SERIES_SECONDS`] seconds (fewer right after start), zeros filled in.
    pub fn throughput(&self) -> Throughput {
        let now = self.now_secs();
        let inner = self.inner.lock().unwrap();
        let first = now.saturating_sub(SERIES_SECONDS as u64 - 1);
        let len = (now - first + 1) as usize;
        let (mut tokens, mut requests) = (vec![0; len], vec![0; len]);
        for &(s, t, r) in &inner.seconds {
            if s >= first && s <= now {
                tokens[(s - first) as usize] = t;
                requests[(s - first) as usize] = r;
            }
        }
        Throughput { resolution_seconds: 1, tokens_per_second: tokens, requests_per_second: requests }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_recorded_latencies() {
        let s = LiveStats::default();
        for ms in 1..=100 {
            s.request(Duration::from_millis(ms), Duration::from_millis(10 * ms));
        }
        let d = s.distributions();
        assert_eq!(d.ttft_seconds.count, 100);
        assert!((d.ttft_seconds.p50 - 0.050).abs() < 0.001, "{:?}", d.ttft_seconds);
        assert!((d.ttft_seconds.p90 - 0.090).abs() < 0.001);
        assert!((d.e2e_seconds.p99 - 0.990).abs() < 0.01);
        assert_eq!(d.itl_seconds.count, 0);
    }

    #[test]
    fn throughput_counts_this_second_and_versions_move() {
        let s = LiveStats::default();
        let v0 = s.version();
        s.token(None);
        s.token(Some(Duration::from_millis(40)));
        s.request(Duration::from_millis(100), Duration::from_millis(200));
        assert!(s.version() > v0);
        let t = s.throughput();
        assert_eq!(*t.tokens_per_second.last().unwrap(), 2);
        assert_eq!(*t.requests_per_second.last().unwrap(), 1);
        assert!(t.tokens_per_second.len() <= SERIES_SECONDS);
        assert_eq!(s.distributions().itl_seconds.count, 1);
    }
}
