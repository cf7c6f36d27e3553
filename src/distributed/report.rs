//! Each rank's figures, carried to rank 0 with every pass (a few hundred bytes a rank):
//! what it holds, MLX's active memory there, its host's memory, and where its time went
//! (computing its layers, waiting on the link, receiving on the link into it). Rank 0
//! keeps the latest set ([`ClusterStats`]) for `/metrics` and the snapshot.
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::telemetry::memory::PressureLevel;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankReport {
    pub rank: usize,
    /// Layers held.
    pub layers: usize,
    pub weight_bytes: u64,
    /// KV of the running sequences on this rank's layers.
    pub kv_bytes: u64,
    /// MLX's active memory on this rank (weights, KV, a step's arrays).
    pub mlx_active_bytes: u64,
    /// Passes run since start.
    pub passes: u64,
    /// Time spent running this rank's layers (rank 0: and the embedding).
    pub compute_seconds: f64,
    /// Time spent receiving from the link once the rank before rang (rank 0: from sending a
    /// pass to the last rank's answer, the other ranks' compute included).
    pub link_wait_seconds: f64,
    pub link_sent_bytes: u64,
    /// The link into this rank (from the rank before it): time from its doorbell waking
    /// this rank to the whole message received (the message's transfer on that hop; the
    /// doorbell's own trip, one hop's latency, is not in it), summed.
    pub link_in_seconds: f64,
    /// Messages received on the link into this rank.
    pub link_in_messages: u64,
    /// This rank's host: memory pressure as its kernel judges it, and memory available and
    /// in all (read at most once a second).
    pub host_memory_pressure: PressureLevel,
    pub host_memory_available_bytes: u64,
    pub host_memory_total_bytes: u64,
}

/// One rank's running figures.
#[derive(Debug, Default)]
pub struct Meter {
    pub report: RankReport,
    /// When the host's memory was last read.
    memory_read: Option<Instant>,
}

/// How often a rank reads its host's memory (a pass can take a millisecond).
const MEMORY_EVERY: Duration = Duration::from_secs(1);

impl Meter {
    pub fn new(rank: usize, layers: usize, weight_bytes: u64) -> Meter {
        Meter { report: RankReport { rank, layers, weight_bytes, ..Default::default() }, memory_read: None }
    }

    /// A message came in on the link into this rank, `took` from its doorbell to its end.
    pub fn received(&mut self, took: Duration) {
        self.report.link_in_seconds += took.as_secs_f64();
        self.report.link_in_messages += 1;
    }

    pub fn computed(&mut self, took: Duration) {
        self.report.compute_seconds += took.as_secs_f64();
    }

    pub fn waited(&mut self, took: Duration) {
        self.report.link_wait_seconds += took.as_secs_f64();
    }

    pub fn sent(&mut self, bytes: usize) {
        self.report.link_sent_bytes += bytes as u64;
    }

    /// The report after a pass, with the rank's KV and MLX memory now.
    pub fn after_pass(&mut self, kv_bytes: usize) -> RankReport {
        self.report.passes += 1;
        self.report.kv_bytes = kv_bytes as u64;
        self.report.mlx_active_bytes = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
        if self.memory_read.is_none_or(|at| at.elapsed() >= MEMORY_EVERY) {
            self.memory_read = Some(Instant::now());
            if let Ok(m) = crate::telemetry::memory::read() {
                self.report.host_memory_pressure = m.pressure;
                self.report.host_memory_available_bytes = m.available;
                self.report.host_memory_total_bytes = m.total;
            }
        }
        self.report.clone()
    }
}

/// The cluster rank 0 serves with, as the snapshot shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ClusterView {
    /// "tensor" or "pipeline" ("auto" while a restarted rank 0 waits to form the cluster
    /// again: not chosen yet).
    pub parallel: &'static str,
    pub ranks: usize,
    /// Ranks serving: all, or none once one was lost (rank 0 cannot serve alone).
    pub healthy: usize,
    /// Why the cluster stopped serving, naming the rank lost.
    pub broken: Option<String>,
    /// Each rank's host, by rank.
    pub hosts: Vec<String>,
    /// Each rank's figures as of the last pass (none before the first).
    pub members: Vec<RankReport>,
    /// Pipeline: milliseconds a pass spends crossing the links (every hop, there and back),
    /// on average; null for tensor parallel or before the first pass.
    pub link_ms_per_pass: Option<f64>,
    /// The links that carried a message so far (pipeline: every hop of the ring; tensor
    /// parallel: rank 0's input handed on, so not the link back into rank 0).
    pub links: Vec<LinkView>,
    /// The link with the highest mean time a message.
    pub slowest_link: Option<LinkView>,
}

/// One link of the ring: into rank `to` from the rank before it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct LinkView {
    pub from: usize,
    pub to: usize,
    /// Mean milliseconds a message took, from its doorbell waking the rank to its last byte.
    pub ms_per_message: f64,
    pub messages: u64,
}

impl LinkView {
    /// The links into each rank that carried a message, from the ranks' reports.
    fn of(members: &[RankReport], ranks: usize) -> Vec<LinkView> {
        members
            .iter()
            .filter(|m| m.link_in_messages > 0)
            .map(|m| LinkView {
                from: (m.rank + ranks - 1) % ranks,
                to: m.rank,
                ms_per_message: m.link_in_seconds / m.link_in_messages as f64 * 1e3,
                messages: m.link_in_messages,
            })
            .collect()
    }
}

impl ClusterView {
    /// A cluster rank 0 restarted to form again (`--on-rank-lost rejoin`), not formed yet.
    pub fn rejoining(spec: &super::ClusterSpec, why: String) -> ClusterView {
        ClusterView {
            parallel: match spec.parallel {
                super::Parallel::Tensor => "tensor",
                super::Parallel::Pipeline => "pipeline",
                super::Parallel::Auto => "auto",
            },
            ranks: spec.size(),
            healthy: 0,
            broken: Some(why),
            hosts: spec.hosts.hosts.iter().map(|h| h.ssh.clone()).collect(),
            members: vec![],
            link_ms_per_pass: None,
            links: vec![],
            slowest_link: None,
        }
    }
}

/// What to do once the ring breaks, given why.
pub type OnBroken = Box<dyn Fn(&str) + Send>;

/// Rank 0's view of the cluster, for `/metrics`, the snapshot and the alerts.
pub struct ClusterStats {
    pub ranks: usize,
    /// Each rank's host (the host file's `ssh`).
    hosts: Vec<String>,
    tensor: bool,
    latest: Mutex<Vec<RankReport>>,
    /// Why the ring broke, once it has.
    broken: Mutex<Option<String>>,
    news: Condvar,
    /// Called once, when the ring breaks.
    on_broken: Mutex<Option<OnBroken>>,
    /// Tensor parallel: when the pass under way must have come back by, and its timeout.
    deadline: Mutex<Option<(Instant, Duration)>>,
    armed: Condvar,
}

impl ClusterStats {
    pub fn new(hosts: Vec<String>, tensor: bool) -> ClusterStats {
        ClusterStats {
            ranks: hosts.len(),
            hosts,
            tensor,
            latest: Mutex::new(vec![]),
            broken: Mutex::new(None),
            news: Condvar::new(),
            on_broken: Mutex::new(None),
            deadline: Mutex::new(None),
            armed: Condvar::new(),
        }
    }

    /// The cluster for the snapshot and the popover.
    pub fn view(&self) -> ClusterView {
        let members = self.latest();
        // Pipeline: a pass is rank 0's layers, then its wait for the others; what of that
        // wait the others did not spend computing went on the links (every hop, there and
        // back). Tensor parallel waits inside its all_sums, where it cannot be told apart.
        let link_ms_per_pass = match (self.tensor, members.iter().find(|m| m.rank == 0)) {
            (false, Some(zero)) if zero.passes > 0 => {
                let others: f64 = members.iter().filter(|m| m.rank > 0).map(|m| m.compute_seconds).sum();
                Some(((zero.link_wait_seconds - others) / zero.passes as f64 * 1e3).max(0.0))
            }
            _ => None,
        };
        let links = LinkView::of(&members, self.ranks);
        let slowest_link = links.iter().max_by(|a, b| a.ms_per_message.total_cmp(&b.ms_per_message)).cloned();
        ClusterView {
            parallel: if self.tensor { "tensor" } else { "pipeline" },
            ranks: self.ranks,
            healthy: self.healthy(),
            broken: self.broken(),
            hosts: self.hosts.clone(),
            members,
            link_ms_per_pass,
            links,
            slowest_link,
        }
    }

    /// Every rank's report from the last pass, in rank order.
    pub fn latest(&self) -> Vec<RankReport> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_latest(&self, mut reports: Vec<RankReport>) {
        reports.sort_by_key(|r| r.rank);
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = reports;
    }

    /// Ranks serving: all of them while the ring works; once it broke, none can (rank 0
    /// alone cannot serve the model).
    pub fn healthy(&self) -> usize {
        match self.broken() {
            Some(_) => 0,
            None => self.ranks,
        }
    }

    /// Why the ring broke, once it has.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks the ring broken; the first reason stands (what follows is its echo).
    pub fn set_broken(&self, why: &str) {
        let mut broken = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        if broken.is_some() {
            return;
        }
        *broken = Some(why.to_string());
        drop(broken);
        self.news.notify_all();
        // Taken out first: it runs once, and outside the lock.
        let f = self.on_broken.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            f(why);
        }
    }

    /// Calls `f` with why once the ring breaks (at once if it has), once.
    pub fn on_broken(&self, f: OnBroken) {
        let mut slot = self.on_broken.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the slot's lock: set_broken takes the slot after it set why.
        match self.broken() {
            Some(why) => {
                drop(slot);
                f(&why);
            }
            None => *slot = Some(f),
        }
    }

    /// Tensor parallel: the pass about to start must be back within `timeout`.
    pub fn arm(&self, timeout: Duration) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now() + timeout, timeout));
        self.armed.notify_all();
    }

    /// The pass came back (or failed otherwise).
    pub fn disarm(&self) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.armed.notify_all();
    }

    /// Tensor parallel's passes wait inside MLX's collectives, which have no timeout: a
    /// thread gives the cluster up when an armed pass is not back by its deadline (its
    /// requests then end: [`ClusterStats::on_broken`]). Ends with the ring or the stats.
    pub fn watch_deadlines(self: &Arc<Self>, timeout: Duration) {
        let stats = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("mlxbar-pass-deadline".into()).spawn(move || loop {
            let Some(stats) = stats.upgrade() else { return };
            if stats.broken().is_some() {
                return;
            }
            let guard = stats.deadline.lock().unwrap_or_else(|e| e.into_inner());
            let wait = match *guard {
                Some((at, _)) => at.saturating_duration_since(Instant::now()),
                None => timeout,
            };
            let (guard, _) = stats.armed.wait_timeout(guard, wait).unwrap_or_else(|e| e.into_inner());
            if let Some((at, took)) = *guard {
                if Instant::now() >= at {
                    drop(guard);
                    stats.set_broken(&format!(
                        "the cluster gave a pass up after {} s without an answer (a rank hung: --pass-timeout); restart every rank",
                        took.as_secs()
                    ));
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            self.set_broken(&format!("the cluster cannot time its passes ({e}); restart every rank"));
        }
    }

    /// Why the ring broke, waiting up to `wait` to hear it.
    pub fn await_broken(&self, wait: Duration) -> Option<String> {
        let guard = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self.news.wait_timeout_while(guard, wait, |b| b.is_none()).unwrap_or_else(|e| e.into_inner());
        guard.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_named_by_the_ranks_they_join_and_the_slowest_found() {
        let stats = ClusterStats::new(vec!["a".into(), "b".into(), "c".into()], false);
        let rank = |rank, secs, n| RankReport { rank, link_in_seconds: secs, link_in_messages: n, passes: 1, ..Default::default() };
        stats.set_latest(vec![rank(2, 0.006, 4), rank(0, 0.004, 2), rank(1, 0.0, 0)]);
        let view = stats.view();
        let ms: Vec<_> = view.links.iter().map(|l| (l.from, l.to, (l.ms_per_message * 1e3).round() / 1e3)).collect();
        assert_eq!(ms, [(2, 0, 2.0), (1, 2, 1.5)], "rank 1 had no message in; rank 0's link comes from the last rank");
        assert_eq!(view.slowest_link.map(|l| l.to), Some(0));
    }
}
