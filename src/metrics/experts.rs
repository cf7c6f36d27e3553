//! `mlxbar_expert_*`: a streamed mixture-of-experts model's expert cache, MLX-Flash's
//! `mlx_flash_cache_*` series in mlxbar's namespace (dashboards/README.md maps them), one
//! `model` label per streamed model of the library (bounded). Copied from the engine's
//! [`ExpertView`] at scrape time; the load histogram takes the reads timed since the last
//! scrape.
use prometheus::{exponential_buckets, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::engine::experts::ExpertView;

pub struct ExpertMetrics {
    pub hits_total: IntCounterVec,
    pub misses_total: IntCounterVec,
    pub hit_ratio: GaugeVec,
    pub entries: IntGaugeVec,
    pub total_experts: IntGaugeVec,
    pub bytes: IntGaugeVec,
    pub budget_bytes: IntGaugeVec,
    pub read_bytes_total: IntCounterVec,
    pub load_seconds: HistogramVec,
}

impl ExpertMetrics {
    pub fn register(r: &Registry) -> ExpertMetrics {
        let model = &["model"];
        let counter = |name: &str, help: &str| -> IntCounterVec {
            let c = IntCounterVec::new(Opts::new(name, help), model).expect("valid counter");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str| -> IntGaugeVec {
            let g = IntGaugeVec::new(Opts::new(name, help), model).expect("valid gauge");
            r.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let hit_ratio = GaugeVec::new(
            Opts::new(
                "expert_cache_hit_ratio",
                "Share of router selections whose expert was in memory, since load (MLX-Flash's target: above 0.85 after warm-up).",
            ),
            model,
        )
        .expect("valid gauge");
        r.register(Box::new(hit_ratio.clone())).expect("unique metric");
        // 100 µs to ~6.5 s: a page-cached read of a small expert to a cold SSD read of a large one.
        let load_seconds = HistogramVec::new(
            HistogramOpts::new("expert_load_seconds", "Time to read one expert from disk into memory (all its projections).")
                .buckets(exponential_buckets(1e-4, 2.0, 17).expect("valid buckets")),
            model,
        )
        .expect("valid histogram");
        r.register(Box::new(load_seconds.clone())).expect("unique metric");
        ExpertMetrics {
            hits_total: counter("expert_cache_hits_total", "Router selections whose expert was already in memory."),
            misses_total: counter("expert_cache_misses_total", "Router selections whose expert had to be read from disk."),
            hit_ratio,
            entries: gauge("expert_cache_entries", "Experts in memory now."),
            total_experts: gauge("expert_cache_total_experts", "Experts of all sparse layers (what a resident model would hold)."),
            bytes: gauge("expert_cache_bytes", "Bytes of experts in memory now."),
            budget_bytes: gauge(
                "expert_cache_budget_bytes",
                "Bytes the expert cache may hold (the memory budget's, or expert_cache_bytes).",
            ),
            read_bytes_total: counter("expert_read_bytes_total", "Bytes of experts read from the model's files."),
            load_seconds,
        }
    }

    /// Copies a streamed model's figures, and observes its reads timed since the last scrape.
    pub fn observe(&self, model: &str, v: &ExpertView, loads: &[f64]) {
        let l = &[model];
        super::advance_to(&self.hits_total.with_label_values(l), v.hits);
        super::advance_to(&self.misses_total.with_label_values(l), v.misses);
        super::advance_to(&self.read_bytes_total.with_label_values(l), v.read_bytes);
        match v.hit_ratio {
            Some(r) => self.hit_ratio.with_label_values(l).set(r),
            // No lookup yet: no sample, rather than a 0 that would read as thrashing.
            None => {
                let _ = self.hit_ratio.remove_label_values(l);
            }
        }
        self.entries.with_label_values(l).set(v.resident_experts as i64);
        self.total_experts.with_label_values(l).set(v.total_experts as i64);
        self.bytes.with_label_values(l).set(v.resident_bytes as i64);
        self.budget_bytes.with_label_values(l).set(v.budget_bytes as i64);
        let h = self.load_seconds.with_label_values(l);
        for &s in loads {
            h.observe(s);
        }
    }

    /// Drops a model's series once it is unloaded (or reloaded resident).
    pub fn forget(&self, model: &str) {
        let l = &[model];
        let _ = self.hit_ratio.remove_label_values(l);
        for g in [&self.entries, &self.total_experts, &self.bytes, &self.budget_bytes] {
            let _ = g.remove_label_values(l);
        }
    }
}
