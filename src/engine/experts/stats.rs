//! What a streamed model's expert cache reports, for /metrics, the snapshot and the
//! popover: lookups (a router selection whose expert was in memory is a hit), what is
//! resident, bytes and time spent reading, and how each sparse layer's selections spread
//! over its experts (routing entropy: near log2(experts) when routing is uniform, low when
//! a few experts take most tokens — which is when a small cache serves well).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Debug)]
pub struct ExpertStats {
    budget: u64,
    expert_bytes: u64,
    num_experts: u32,
    layers: Vec<u32>,
    hits: AtomicU64,
    misses: AtomicU64,
    loads: AtomicU64,
    read_bytes: AtomicU64,
    load_micros: AtomicU64,
    entries: AtomicU64,
    bytes: AtomicU64,
    /// Each load's seconds since the last [`ExpertStats::drain_load_seconds`] (the
    /// metrics' histogram takes them at scrape time; capped so an unscraped server does not
    /// grow it).
    recent_loads: Mutex<Vec<f64>>,
    /// Per sparse layer (in `layers` order), selections per expert.
    routing: Mutex<Vec<Vec<u64>>>,
    /// Reads of the last [`RATE_WINDOW`]: when, how many bytes.
    reads: Mutex<VecDeque<(Instant, u64)>>,
}

/// The read rate is over this much of the recent past.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

const RECENT_LOADS_CAP: usize = 4096;

/// A copy of the figures, as the snapshot and the popover show them.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct ExpertView {
    /// Experts of all sparse layers, and how many are in memory now.
    pub total_experts: u64,
    pub resident_experts: u64,
    pub resident_bytes: u64,
    pub budget_bytes: u64,
    /// Bytes one expert takes in memory.
    pub expert_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// hits / (hits + misses); None before the first lookup.
    pub hit_ratio: Option<f64>,
    pub loads: u64,
    pub read_bytes: u64,
    /// Bytes read a second over the last 10 seconds.
    pub read_bytes_per_second: f64,
    pub load_seconds: f64,
    /// Each sparse layer's routing entropy.
    pub routing_entropy: Vec<LayerEntropy>,
}

/// How one sparse layer's selections spread over its experts.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct LayerEntropy {
    pub layer: u32,
    /// Shannon entropy (bits) of its selections over its experts; None before any.
    pub bits: Option<f64>,
}

impl ExpertStats {
    pub fn new(budget: u64, layers: &[u32], num_experts: u32, expert_bytes: u64) -> Self {
        ExpertStats {
            budget,
            expert_bytes,
            num_experts,
            layers: layers.to_vec(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            load_micros: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            recent_loads: Mutex::new(Vec::new()),
            routing: Mutex::new(vec![vec![0; num_experts as usize]; layers.len()]),
            reads: Mutex::new(VecDeque::new()),
        }
    }

    pub fn record_lookups(&self, hits: u64, misses: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(misses, Ordering::Relaxed);
    }

    pub fn record_load(&self, bytes: u64, took: Duration) {
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.load_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        let mut recent = self.recent_loads.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() < RECENT_LOADS_CAP {
            recent.push(took.as_secs_f64());
        }
        let now = Instant::now();
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.push_back((now, bytes));
        while reads.front().is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW) {
            reads.pop_front();
        }
    }

    /// Bytes a second read over the last [`RATE_WINDOW`] before `now`.
    fn read_rate(&self, now: Instant) -> f64 {
        let reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: u64 = reads.iter().filter(|(at, _)| now.saturating_duration_since(*at) <= RATE_WINDOW).map(|r| r.1).sum();
        bytes as f64 / RATE_WINDOW.as_secs_f64()
    }

    pub fn set_resident(&self, entries: usize, bytes: u64) {
        self.entries.store(entries as u64, Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Counts `chosen` (every token's experts, flat) as selections of `layer`.
    pub fn record_routing(&self, layer: u32, chosen: &[u32]) {
        let Some(i) = self.layers.iter().position(|&l| l == layer) else { return };
        let mut routing = self.routing.lock().unwrap_or_else(|e| e.into_inner());
        for &e in chosen {
            if let Some(c) = routing[i].get_mut(e as usize) {
                *c += 1;
            }
        }
    }

    /// The load times recorded since the last call.
    pub fn drain_load_seconds(&self) -> Vec<f64> {
        std::mem::take(&mut *self.recent_loads.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn view(&self) -> ExpertView {
        let (hits, misses) = (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed));
        let routing = self.routing.lock().unwrap_or_else(|e| e.into_inner());
        ExpertView {
            total_experts: self.layers.len() as u64 * self.num_experts as u64,
            resident_experts: self.entries.load(Ordering::Relaxed),
            resident_bytes: self.bytes.load(Ordering::Relaxed),
            budget_bytes: self.budget,
            expert_bytes: self.expert_bytes,
            hits,
            misses,
            hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
            loads: self.loads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            read_bytes_per_second: self.read_rate(Instant::now()),
            load_seconds: self.load_micros.load(Ordering::Relaxed) as f64 / 1e6,
            routing_entropy: self
                .layers
                .iter()
                .zip(routing.iter())
                .map(|(&layer, counts)| LayerEntropy { layer, bits: entropy_bits(counts) })
                .collect(),
        }
    }
}

/// Shannon entropy in bits of the distribution `counts` make; None when they are all zero.
pub fn entropy_bits(counts: &[u64]) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    Some(
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / total as f64;
                -p * p.log2()
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_of_uniform_and_peaked_routing() {
        assert_eq!(entropy_bits(&[0, 0]), None);
        assert!((entropy_bits(&[5, 5, 5, 5]).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(entropy_bits(&[9, 0, 0]), Some(0.0));
        assert!((entropy_bits(&[3, 1]).unwrap() - 0.811_278_124_459_132_8).abs() < 1e-12);
    }

    #[test]
    fn view_counts_lookups_and_routing() {
        let s = ExpertStats::new(100, &[0, 2], 4, 10);
        s.record_lookups(3, 1);
        s.record_routing(2, &[1, 1, 3, 3]);
        s.record_routing(7, &[0]);
        s.record_load(40, Duration::from_millis(5));
        let v = s.view();
        assert_eq!((v.total_experts, v.hits, v.misses, v.loads, v.read_bytes), (8, 3, 1, 1, 40));
        assert_eq!(v.hit_ratio, Some(0.75));
        assert_eq!(v.routing_entropy, vec![LayerEntropy { layer: 0, bits: None }, LayerEntropy { layer: 2, bits: Some(1.0) }]);
        assert_eq!(v.read_bytes_per_second, 4.0, "40 bytes over the last 10 s");
        assert_eq!(s.read_rate(Instant::now() + RATE_WINDOW * 2), 0.0, "nothing read since");
        assert_eq!(s.drain_load_seconds().len(), 1);
        assert!(s.drain_load_seconds().is_empty());
    }
}
