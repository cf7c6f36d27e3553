//! `mlxbar_batch_size`: a Prometheus histogram of how many sequences each decode step ran
//! together. The engine counts steps per exact batch size (lock-free, see
//! `engine::stats::BatchSizes`); the scrape copies those counts here and this collector
//! folds them into cumulative buckets, so the engine needs no Prometheus types and a
//! scrape sees every step, not a sample.
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, Metric, MetricFamily, MetricType};

/// Bucket bounds: every size up to 4, then steps of about 1.5x up to `max_batch`'s limit.
const BOUNDS: [usize; 16] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256];

pub struct BatchSizeHistogram {
    desc: Desc,
    /// Steps per exact batch size (index = size), as last copied from the engine.
    counts: Arc<Mutex<Vec<u64>>>,
}

impl BatchSizeHistogram {
    /// The collector and the handle a scrape writes the engine's counts into.
    pub fn new() -> (BatchSizeHistogram, Arc<Mutex<Vec<u64>>>) {
        let desc = Desc::new(
            "batch_size".into(),
            "Sequences decoded together per decode step (one observation per step).".into(),
            vec![],
            Default::default(),
        )
        .expect("valid metric description");
        let counts = Arc::new(Mutex::new(Vec::new()));
        (BatchSizeHistogram { desc, counts: counts.clone() }, counts)
    }
}

/// Cumulative bucket counts, the total count and the sum of sizes for `counts[size]`.
fn fold(counts: &[u64]) -> (Vec<u64>, u64, f64) {
    let cumulative = BOUNDS.iter().map(|&b| counts.iter().take(b + 1).sum()).collect();
    let total = counts.iter().sum();
    let sum = counts.iter().enumerate().map(|(size, &n)| size as f64 * n as f64).sum();
    (cumulative, total, sum)
}

impl Collector for BatchSizeHistogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (cumulative, total, sum) = fold(&counts);
        let mut h = Histogram::default();
        h.set_sample_count(total);
        h.set_sample_sum(sum);
        h.set_bucket(
            BOUNDS
                .iter()
                .zip(cumulative)
                .map(|(&bound, n)| {
                    let mut b = Bucket::default();
                    b.set_upper_bound(bound as f64);
                    b.set_cumulative_count(n);
                    b
                })
                .collect(),
        );
        let mut m = Metric::default();
        m.set_histogram(h);
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(vec![m]);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_over_exact_sizes() {
        // 2 steps of 1, 5 of 3, 1 of 7.
        let mut counts = vec![0u64; 8];
        counts[1] = 2;
        counts[3] = 5;
        counts[7] = 1;
        let (cumulative, total, sum) = fold(&counts);
        assert_eq!(&cumulative[..7], &[2, 2, 7, 7, 7, 8, 8]);
        assert_eq!(*cumulative.last().unwrap(), 8);
        assert_eq!(total, 8);
        assert_eq!(sum, 2.0 + 15.0 + 7.0);
    }

    #[test]
    fn exposition_is_a_prometheus_histogram() {
        let (collector, counts) = BatchSizeHistogram::new();
        *counts.lock().unwrap() = vec![0, 4, 0, 1];
        let registry = prometheus::Registry::new_custom(Some("mlxbar".into()), None).unwrap();
        registry.register(Box::new(collector)).unwrap();
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("# TYPE mlxbar_batch_size histogram"), "{text}");
        assert!(text.contains("mlxbar_batch_size_bucket{le=\"2\"} 4"), "{text}");
        assert!(text.contains("mlxbar_batch_size_bucket{le=\"3\"} 5"), "{text}");
        assert!(text.contains("mlxbar_batch_size_bucket{le=\"+Inf\"} 5"), "{text}");
        assert!(text.contains("mlxbar_batch_size_count 5"), "{text}");
        assert!(text.contains("mlxbar_batch_size_sum 7"), "{text}");
    }
}
