//! Rolling windows behind the live views (`/api/metrics/snapshot` and `/stream`): request
//! distributions over the last minutes (hdrhistogram, one set per minute, merged on read),
//! the last finished requests, counts by result, and a per-second series of throughput and
//! queue. Covers mlx-bun's metrics module field by field (see dashboards/README.md).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Distributions cover this many minutes.
pub const WINDOW_MINUTES: usize = 5;
/// The series covers this many seconds, one point a second.
pub const SERIES_SECONDS: usize = 600;
/// Finished requests listed in `recent`, newest last.
pub const RECENT_REQUESTS: usize = 20;

/// Latencies are recorded in microseconds (1 us .. 1 h).
const MICROS_MAX: u64 = 3_600_000_000;
/// Rates are recorded in hundredths of a token per second (0.01 .. 1M tok/s).
const RATE_SCALE: f64 = 100.0;
const RATE_MAX: u64 = 100_000_000;

/// One distribution over the window. Zeros when `count` is 0.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, schemars::JsonSchema)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Distributions {
    pub window_minutes: usize,
    /// Completed requests (stop or length) in the window; the per-request figures below
    /// are theirs.
    pub requests: u64,
    pub ttft_seconds: Percentiles,
    /// Gaps between consecutive tokens of every request, cancelled ones included.
    pub itl_seconds: Percentiles,
    pub e2e_seconds: Percentiles,
    pub queue_seconds: Percentiles,
    /// Uncached prompt tokens over prefill time, per request.
    pub prefill_tokens_per_second: Percentiles,
    /// Tokens after the first over the time after the first, per request (two tokens or more).
    pub decode_tokens_per_second: Percentiles,
    /// Prompt tokens served from the prefix cache over all prompt tokens; null without requests.
    pub cached_prompt_share: Option<f64>,
}

/// Per-second series, oldest first; the last point is the current, still filling second.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Throughput {
    pub resolution_seconds: u64,
    pub tokens_per_second: Vec<u64>,
    /// Completed requests per second.
    pub requests_per_second: Vec<u64>,
    /// Requests generating / queued, as sampled that second (the last sample wins).
    pub running: Vec<u64>,
    pub waiting: Vec<u64>,
}

/// Requests ended since start, by how they ended.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, schemars::JsonSchema)]
pub struct ByResult {
    pub stop: u64,
    pub length: u64,
    pub cancelled: u64,
    pub error: u64,
}

/// One request as it ended; numbers only, never prompt or completion text.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct FinishedRequest {
    /// Unix seconds.
    pub finished_at: f64,
    pub endpoint: &'static str,
    pub stream: bool,
    /// stop, length, cancelled or error.
    pub result: &'static str,
    /// Unknown (null) unless the engine finished the request.
    pub prompt_tokens: Option<u64>,
    pub cached_prompt_tokens: Option<u64>,
    pub completion_tokens: u64,
    pub queue_seconds: Option<f64>,
    /// Null when no token came.
    pub ttft_seconds: Option<f64>,
    pub prefill_tokens_per_second: Option<f64>,
    pub decode_tokens_per_second: Option<f64>,
    pub e2e_seconds: f64,
}

impl FinishedRequest {
    fn completed(&self) -> bool {
        matches!(self.result, "stop" | "length")
    }
}

struct MinuteHists {
    minute: u64,
    ttft: Histogram<u64>,
    itl: Histogram<u64>,
    e2e: Histogram<u64>,
    queue: Histogram<u64>,
    prefill_rate: Histogram<u64>,
    decode_rate: Histogram<u64>,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
}

fn latency_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MICROS_MAX, 3).unwrap()
}

fn rate_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, RATE_MAX, 2).unwrap()
}

impl MinuteHists {
    fn new(minute: u64) -> Self {
        MinuteHists {
            minute,
            ttft: latency_hist(),
            itl: latency_hist(),
            e2e: latency_hist(),
            queue: latency_hist(),
            prefill_rate: rate_hist(),
            decode_rate: rate_hist(),
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
        }
    }
}

/// One second of the series.
#[derive(Default, Clone, Copy)]
struct Second {
    at: u64,
    tokens: u64,
    requests: u64,
    running: u64,
    waiting: u64,
}

#[derive(Default)]
struct Inner {
    minutes: Vec<MinuteHists>,
    seconds: Vec<Second>,
    recent: VecDeque<FinishedRequest>,
    by_result: ByResult,
    /// The last scheduler sample, so an unchanged one does not count as news.
    scheduler: (u64, u64),
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
        LiveStats {
            start: Instant::now(),
            inner: Mutex::default(),
            version: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        }
    }
}

/// Now, in Unix seconds (the live views' timestamps).
pub fn unix_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn micros(seconds: f64) -> u64 {
    ((seconds * 1e6) as u64).clamp(1, MICROS_MAX)
}

fn rate_units(tokens_per_second: f64) -> u64 {
    ((tokens_per_second * RATE_SCALE) as u64).clamp(1, RATE_MAX)
}

/// One kind of histogram of every minute in the window, merged and summarized.
fn merge(minutes: &[&MinuteHists], pick: fn(&MinuteHists) -> &Histogram<u64>, unit: f64) -> Percentiles {
    let Some(first) = minutes.first() else { return Percentiles::default() };
    let mut all = Histogram::<u64>::new_from(pick(first));
    for h in minutes {
        all.add(pick(h)).unwrap();
    }
    summarize(&all, unit)
}

fn summarize(h: &Histogram<u64>, unit: f64) -> Percentiles {
    if h.is_empty() {
        return Percentiles::default();
    }
    let q = |x: f64| h.value_at_quantile(x) as f64 / unit;
    Percentiles { count: h.len(), mean: h.mean() / unit, p50: q(0.5), p90: q(0.9), p95: q(0.95), p99: q(0.99), max: h.max() as f64 / unit }
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

    fn second(inner: &mut Inner, now: u64) -> &mut Second {
        if inner.seconds.last().is_none_or(|s| s.at != now) {
            // A new second starts with the queue as last sampled.
            let (running, waiting) = inner.scheduler;
            inner.seconds.push(Second { at: now, running, waiting, ..Default::default() });
            let keep_from = now.saturating_sub(SERIES_SECONDS as u64 - 1);
            inner.seconds.retain(|s| s.at >= keep_from);
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

    /// A request that ended in an error (the alert engine watches these). Counted even
    /// with per-request metrics off.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Requests completed and tokens generated since start (the popover's "served" line).
    pub fn totals(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.tokens.load(Ordering::Relaxed))
    }

    /// A generated token, and the gap since the request's previous one.
    pub fn token(&self, gap: Option<Duration>) {
        self.tokens.fetch_add(1, Ordering::Relaxed);
        self.with(|inner, now| {
            Self::second(inner, now).tokens += 1;
            if let Some(g) = gap {
                let _ = Self::minute(inner, now).itl.record(micros(g.as_secs_f64()));
            }
        });
    }

    /// A request as it ended. Completed ones feed the distributions; every one is counted
    /// by result and listed in `recent`.
    pub fn finished(&self, r: FinishedRequest) {
        if r.completed() {
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
        self.with(|inner, now| {
            let by = &mut inner.by_result;
            *match r.result {
                "stop" => &mut by.stop,
                "length" => &mut by.length,
                "cancelled" => &mut by.cancelled,
                _ => &mut by.error,
            } += 1;
            if r.completed() {
                Self::second(inner, now).requests += 1;
                let h = Self::minute(inner, now);
                let _ = h.e2e.record(micros(r.e2e_seconds));
                for (hist, v) in [(&mut h.ttft, r.ttft_seconds), (&mut h.queue, r.queue_seconds)] {
                    if let Some(v) = v {
                        let _ = hist.record(micros(v));
                    }
                }
                for (hist, v) in [(&mut h.prefill_rate, r.prefill_tokens_per_second), (&mut h.decode_rate, r.decode_tokens_per_second)] {
                    if let Some(v) = v {
                        let _ = hist.record(rate_units(v));
                    }
                }
                h.prompt_tokens += r.prompt_tokens.unwrap_or(0);
                h.cached_prompt_tokens += r.cached_prompt_tokens.unwrap_or(0);
            }
            inner.recent.push_back(r);
            if inner.recent.len() > RECENT_REQUESTS {
                inner.recent.pop_front();
            }
        });
    }

    /// The scheduler's queue, sampled once a second; news only when it changed.
    pub fn sample_scheduler(&self, running: usize, waiting: usize) {
        let now = self.now_secs();
        let mut inner = self.inner.lock().unwrap();
        let sample = (running as u64, waiting as u64);
        let changed = inner.scheduler != sample;
        inner.scheduler = sample;
        let second = Self::second(&mut inner, now);
        (second.running, second.waiting) = sample;
        drop(inner);
        if changed {
            self.version.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn by_result(&self) -> ByResult {
        self.inner.lock().unwrap().by_result
    }

    /// The last [`RECENT_REQUESTS`] requests that ended, oldest first.
    pub fn recent(&self) -> Vec<FinishedRequest> {
        self.inner.lock().unwrap().recent.iter().cloned().collect()
    }

    pub fn distributions(&self) -> Distributions {
        let now = self.now_secs();
        let inner = self.inner.lock().unwrap();
        let live = Self::window(&inner, now);
        let merged = |pick: fn(&MinuteHists) -> &Histogram<u64>, unit| merge(&live, pick, unit);
        let (prompt, cached) = live.iter().fold((0, 0), |(p, c), h| (p + h.prompt_tokens, c + h.cached_prompt_tokens));
        let e2e = merged(|h| &h.e2e, 1e6);
        Distributions {
            window_minutes: WINDOW_MINUTES,
            requests: e2e.count,
            ttft_seconds: merged(|h| &h.ttft, 1e6),
            itl_seconds: merged(|h| &h.itl, 1e6),
            e2e_seconds: e2e,
            queue_seconds: merged(|h| &h.queue, 1e6),
            prefill_tokens_per_second: merged(|h| &h.prefill_rate, RATE_SCALE),
            decode_tokens_per_second: merged(|h| &h.decode_rate, RATE_SCALE),
            cached_prompt_share: (prompt > 0).then(|| cached as f64 / prompt as f64),
        }
    }

    /// TTFT over the window alone (what the alert engine reads every second).
    pub fn ttft_seconds(&self) -> Percentiles {
        let now = self.now_secs();
        let inner = self.inner.lock().unwrap();
        merge(&Self::window(&inner, now), |h| &h.ttft, 1e6)
    }

    fn window(inner: &Inner, now: u64) -> Vec<&MinuteHists> {
        inner.minutes.iter().filter(|h| h.minute + WINDOW_MINUTES as u64 > now / 60).collect()
    }

    /// The last [`SERIES_SECONDS`] seconds (fewer right after start). A second without a
    /// record has no tokens and the queue of the second before it.
    pub fn throughput(&self) -> Throughput {
        let now = self.now_secs();
        let inner = self.inner.lock().unwrap();
        let first = now.saturating_sub(SERIES_SECONDS as u64 - 1);
        let len = (now - first + 1) as usize;
        let mut t = Throughput {
            resolution_seconds: 1,
            tokens_per_second: vec![0; len],
            requests_per_second: vec![0; len],
            running: vec![0; len],
            waiting: vec![0; len],
        };
        let mut recorded = inner.seconds.iter().filter(|s| s.at <= now).peekable();
        let mut queue = (0, 0);
        for (i, at) in (first..=now).enumerate() {
            while let Some(s) = recorded.next_if(|s| s.at <= at) {
                queue = (s.running, s.waiting);
                if s.at == at {
                    t.tokens_per_second[i] = s.tokens;
                    t.requests_per_second[i] = s.requests;
                }
            }
            (t.running[i], t.waiting[i]) = queue;
        }
        t
    }

    /// Tokens per second over the last five whole seconds (the still-filling one left out;
    /// fewer right after start).
    pub fn tokens_per_second_now(&self) -> f64 {
        const SECONDS: u64 = 5;
        let now = self.now_secs();
        let whole = now.min(SECONDS);
        if whole == 0 {
            return 0.0;
        }
        let inner = self.inner.lock().unwrap();
        let tokens: u64 = inner.seconds.iter().filter(|s| s.at < now && s.at >= now - whole).map(|s| s.tokens).sum();
        tokens as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(result: &'static str, ttft_ms: u64, e2e_ms: u64) -> FinishedRequest {
        FinishedRequest {
            finished_at: 0.0,
            endpoint: "chat",
            stream: false,
            result,
            prompt_tokens: Some(100),
            cached_prompt_tokens: Some(25),
            completion_tokens: 10,
            queue_seconds: Some(0.001),
            ttft_seconds: Some(ttft_ms as f64 / 1e3),
            prefill_tokens_per_second: Some(750.0),
            decode_tokens_per_second: Some(42.5),
            e2e_seconds: e2e_ms as f64 / 1e3,
        }
    }

    #[test]
    fn distributions_of_completed_requests() {
        let s = LiveStats::default();
        for ms in 1..=100 {
            s.finished(done("stop", ms, 10 * ms));
        }
        let d = s.distributions();
        assert_eq!(d.requests, 100);
        assert_eq!(d.ttft_seconds.count, 100);
        assert!((d.ttft_seconds.p50 - 0.050).abs() < 0.001, "{:?}", d.ttft_seconds);
        assert!((d.ttft_seconds.p90 - 0.090).abs() < 0.001);
        assert!((d.ttft_seconds.p95 - 0.095).abs() < 0.001);
        assert!((d.ttft_seconds.mean - 0.0505).abs() < 0.001);
        assert!((d.ttft_seconds.max - 0.100).abs() < 0.001);
        assert_eq!(s.ttft_seconds(), d.ttft_seconds);
        assert!((d.e2e_seconds.p99 - 0.990).abs() < 0.01);
        assert!((d.queue_seconds.p50 - 0.001).abs() < 1e-5);
        // Rates keep two significant digits.
        assert!((d.decode_tokens_per_second.p50 - 42.5).abs() < 0.5, "{:?}", d.decode_tokens_per_second);
        assert!((d.prefill_tokens_per_second.max - 750.0).abs() < 10.0);
        assert_eq!(d.cached_prompt_share, Some(0.25));
        assert_eq!(d.itl_seconds.count, 0);
        assert_eq!(s.totals().0, 100);
    }

    #[test]
    fn failed_requests_are_listed_and_counted_but_not_in_distributions() {
        let s = LiveStats::default();
        assert_eq!(s.distributions().cached_prompt_share, None);
        s.finished(done("length", 20, 200));
        let mut cancelled = done("cancelled", 5, 50);
        (cancelled.prompt_tokens, cancelled.queue_seconds) = (None, None);
        s.finished(cancelled.clone());
        s.finished(done("error", 5, 50));
        assert_eq!(s.by_result(), ByResult { stop: 0, length: 1, cancelled: 1, error: 1 });
        assert_eq!(s.distributions().requests, 1);
        assert_eq!(s.totals().0, 1);
        let recent = s.recent();
        assert_eq!(recent.len(), 3);
        assert_eq!(recent[1], cancelled);
        for _ in 0..RECENT_REQUESTS {
            s.finished(done("stop", 1, 2));
        }
        let recent = s.recent();
        assert_eq!(recent.len(), RECENT_REQUESTS);
        assert!(recent.iter().all(|r| r.result == "stop"), "the oldest leave first");
    }

    #[test]
    fn series_counts_this_second_and_carries_the_queue() {
        let s = LiveStats::default();
        let v0 = s.version();
        s.token(None);
        s.token(Some(Duration::from_millis(40)));
        s.finished(done("stop", 100, 200));
        assert!(s.version() > v0);
        s.sample_scheduler(3, 2);
        let v1 = s.version();
        s.sample_scheduler(3, 2);
        assert_eq!(s.version(), v1, "an unchanged queue is not news");
        let t = s.throughput();
        assert_eq!(*t.tokens_per_second.last().unwrap(), 2);
        assert_eq!(*t.requests_per_second.last().unwrap(), 1);
        assert_eq!((*t.running.last().unwrap(), *t.waiting.last().unwrap()), (3, 2));
        assert!(t.tokens_per_second.len() <= SERIES_SECONDS);
        assert_eq!(s.distributions().itl_seconds.count, 1);
    }
}
