//! `mlxbar_cluster_*`: the ranks serving the default model together ([`crate::distributed`]),
//! as rank 0 sees them: how many and how many serve (MLX-Flash's `workers_total` and
//! `workers_healthy`), then per rank (a `rank` label, bounded by the host file: at most
//! [`MAX_RANKS`]) what it holds, its host's memory, where its time goes and how long the
//! link into it takes a message. Copied from the latest pass's reports at scrape time;
//! absent on a process serving alone.
use prometheus::{CounterVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::distributed::report::ClusterStats;

/// Ranks given a series of their own (a bound on the label's values).
pub const MAX_RANKS: usize = 64;

pub struct ClusterMetrics {
    pub ranks: IntGauge,
    pub ranks_healthy: IntGauge,
    pub layers: IntGaugeVec,
    pub weight_bytes: IntGaugeVec,
    pub kv_bytes: IntGaugeVec,
    pub mlx_active_bytes: IntGaugeVec,
    pub passes_total: IntCounterVec,
    pub compute_seconds_total: CounterVec,
    pub link_wait_seconds_total: CounterVec,
    pub link_sent_bytes_total: IntCounterVec,
    pub link_in_seconds_total: CounterVec,
    pub link_in_messages_total: IntCounterVec,
    pub host_memory_pressure_level: IntGaugeVec,
    pub host_memory_available_bytes: IntGaugeVec,
    pub host_memory_total_bytes: IntGaugeVec,
}

impl ClusterMetrics {
    pub fn register(r: &Registry) -> ClusterMetrics {
        let rank = &["rank"];
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("valid metric");
                r.register(Box::new(m.clone())).expect("unique metric");
                m
            }};
        }
        ClusterMetrics {
            ranks: reg!(IntGauge::new(
                "cluster_ranks",
                "Ranks the host file names for the default model (0: served by this process alone)."
            )),
            ranks_healthy: reg!(IntGauge::new(
                "cluster_ranks_healthy",
                "Ranks serving: all while the ring works, 0 once a rank is lost (the model cannot be served without it)."
            )),
            layers: reg!(IntGaugeVec::new(Opts::new("cluster_rank_layers", "Layers a rank holds."), rank)),
            weight_bytes: reg!(IntGaugeVec::new(Opts::new("cluster_rank_weight_bytes", "Bytes of weights a rank holds."), rank)),
            kv_bytes: reg!(IntGaugeVec::new(
                Opts::new("cluster_rank_kv_bytes", "Bytes of running sequences' KV on a rank's layers."),
                rank
            )),
            mlx_active_bytes: reg!(IntGaugeVec::new(
                Opts::new("cluster_rank_mlx_active_bytes", "MLX's active memory on a rank (weights, KV, a step's arrays)."),
                rank
            )),
            passes_total: reg!(IntCounterVec::new(Opts::new("cluster_rank_passes_total", "Model passes a rank ran."), rank)),
            compute_seconds_total: reg!(CounterVec::new(
                Opts::new("cluster_rank_compute_seconds_total", "Time a rank spent running its layers (rank 0: and the embedding)."),
                rank
            )),
            link_wait_seconds_total: reg!(CounterVec::new(
                Opts::new(
                    "cluster_rank_link_wait_seconds_total",
                    "Time a rank spent waiting on the ring (rank 0: for the last rank's answer; the others: for the next pass)."
                ),
                rank
            )),
            link_sent_bytes_total: reg!(IntCounterVec::new(
                Opts::new("cluster_rank_link_sent_bytes_total", "Bytes a rank sent on the ring."),
                rank
            )),
            link_in_seconds_total: reg!(CounterVec::new(
                Opts::new(
                    "cluster_rank_link_in_seconds_total",
                    "Time messages took on the link into a rank, from its doorbell waking it to their last byte (each message's transfer on that hop; over cluster_rank_link_in_messages_total, its time a message)."
                ),
                rank
            )),
            link_in_messages_total: reg!(IntCounterVec::new(
                Opts::new("cluster_rank_link_in_messages_total", "Messages received on the link into a rank."),
                rank
            )),
            host_memory_pressure_level: reg!(IntGaugeVec::new(
                Opts::new("cluster_rank_host_memory_pressure_level", "Memory pressure on a rank's host: 0 normal, 1 warn, 2 critical, -1 unknown."),
                rank
            )),
            host_memory_available_bytes: reg!(IntGaugeVec::new(
                Opts::new("cluster_rank_host_memory_available_bytes", "Memory available on a rank's host."),
                rank
            )),
            host_memory_total_bytes: reg!(IntGaugeVec::new(
                Opts::new("cluster_rank_host_memory_total_bytes", "Memory on a rank's host (its cgroup's limit where lower)."),
                rank
            )),
        }
    }

    /// Copies the latest reports (nothing on a process serving alone). `rejoining`: the
    /// ranks of a cluster this rank 0 restarted to form again, none serving until it has.
    pub fn observe(&self, rejoining: Option<usize>, stats: Option<&ClusterStats>) {
        let Some(stats) = stats else {
            if let Some(ranks) = rejoining {
                self.ranks.set(ranks as i64);
                self.ranks_healthy.set(0);
            }
            return;
        };
        self.ranks.set(stats.ranks as i64);
        self.ranks_healthy.set(stats.healthy() as i64);
        for r in stats.latest().iter().filter(|r| r.rank < MAX_RANKS) {
            let rank = r.rank.to_string();
            let l = &[rank.as_str()];
            self.layers.with_label_values(l).set(r.layers as i64);
            self.weight_bytes.with_label_values(l).set(r.weight_bytes as i64);
            self.kv_bytes.with_label_values(l).set(r.kv_bytes as i64);
            self.mlx_active_bytes.with_label_values(l).set(r.mlx_active_bytes as i64);
            super::advance_to(&self.passes_total.with_label_values(l), r.passes);
            super::advance_to(&self.link_sent_bytes_total.with_label_values(l), r.link_sent_bytes);
            super::advance_to(&self.link_in_messages_total.with_label_values(l), r.link_in_messages);
            self.host_memory_pressure_level.with_label_values(l).set(r.host_memory_pressure.as_number().map_or(-1, i64::from));
            self.host_memory_available_bytes.with_label_values(l).set(r.host_memory_available_bytes as i64);
            self.host_memory_total_bytes.with_label_values(l).set(r.host_memory_total_bytes as i64);
            let seconds = [
                (&self.compute_seconds_total, r.compute_seconds),
                (&self.link_wait_seconds_total, r.link_wait_seconds),
                (&self.link_in_seconds_total, r.link_in_seconds),
            ];
            for (c, total) in seconds {
                let c = c.with_label_values(l);
                c.inc_by((total - c.get()).max(0.0));
            }
        }
    }
}
