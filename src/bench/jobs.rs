//! Bench runs inside a server (`POST /api/bench`, the popover, the tray): one at a time,
//! holding the engine exclusively while it runs. The run talks to its own server over
//! loopback like any client, carrying a per-run token that lets its requests past the
//! exclusivity gate ([`BenchJobs::gate`]); everyone else waits (bounded) or gets 503.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::plan::{self, Plan};
use super::record::{new_run_id, now_unix, CellResult, RunRecord, RunState};
use super::runner::{self, Progress};
use super::store::BenchStore;
use super::{client::Target, report};
use crate::metrics::Metrics;
use crate::telemetry::power::monitor::PowerMonitor;

/// Header carrying the running bench's token on its own requests.
pub const BENCH_TOKEN_HEADER: &str = "x-mlxbar-bench";
/// Jobs kept in memory for `GET /api/bench`.
const RECENT_JOBS: usize = 20;

/// The run holding the engine.
#[derive(Clone)]
pub struct Active {
    pub id: String,
    token: String,
    started: Instant,
    progress: watch::Receiver<Progress>,
}

impl Active {
    pub fn requests_done(&self) -> usize {
        self.progress.borrow().requests_done
    }

    /// Seconds until the run is likely done, from its pace so far (1 s to 1 h).
    pub fn remaining_seconds(&self) -> u64 {
        let p = self.progress.borrow();
        let elapsed = self.started.elapsed().as_secs_f64();
        let estimate = if p.requests_done == 0 {
            30.0
        } else {
            elapsed / p.requests_done as f64 * p.requests_total.saturating_sub(p.requests_done) as f64
        };
        (estimate.ceil() as u64).clamp(1, 3600)
    }
}

pub struct Job {
    pub id: String,
    pub profile: String,
    pub started_unix: u64,
    progress: watch::Receiver<Progress>,
    cancel: CancellationToken,
    /// Turns true when the run has ended and its record is saved.
    ended: watch::Receiver<bool>,
    outcome: Mutex<Outcome>,
}

#[derive(Clone)]
struct Outcome {
    state: RunState,
    finished_unix: Option<u64>,
    error: Option<String>,
    cells: Vec<CellResult>,
}

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct JobView {
    pub id: String,
    pub profile: String,
    pub state: RunState,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    pub progress: Progress,
    pub error: Option<String>,
    /// Per-cell results (complete once the run is done).
    pub cells: Vec<CellResult>,
    pub report_url: String,
}

impl JobView {
    /// How the run ended, in a notification's title and body: per cell the aggregate
    /// tok/s and TTFT p50 (the first three cells; the popover shows them all).
    pub fn notice(&self) -> (String, String) {
        const SHOWN: usize = 3;
        let title = match self.state {
            RunState::Done => "Benchmark finished",
            RunState::Cancelled => "Benchmark cancelled",
            RunState::Failed => "Benchmark failed",
            RunState::Running => "Benchmark running",
        };
        let mut lines: Vec<String> = self
            .cells
            .iter()
            .take(SHOWN)
            .map(|c| {
                let errors = if c.errors > 0 { format!(", {} errors", c.errors) } else { String::new() };
                // tokens per joule beside tok/s where this machine reads power
                let tpj = c.tokens_per_joule.map(|v| format!(" ({v:.2} tok/J)")).unwrap_or_default();
                format!("{}: {:.1} tok/s{tpj}, TTFT {:.2} s{errors}", c.cell.spec().label(), c.aggregate_tok_s, c.ttft_p50)
            })
            .collect();
        if self.cells.len() > SHOWN {
            lines.push(format!("and {} more cells", self.cells.len() - SHOWN));
        }
        if let Some(e) = &self.error {
            lines.push(e.clone());
        }
        if lines.is_empty() {
            lines.push("No cell was measured.".into());
        }
        (title.to_string(), format!("{}: {}", self.profile, lines.join("; ")))
    }
}

impl Job {
    pub fn view(&self) -> JobView {
        let o = self.outcome.lock().unwrap().clone();
        JobView {
            id: self.id.clone(),
            profile: self.profile.clone(),
            state: o.state,
            started_unix: self.started_unix,
            finished_unix: o.finished_unix,
            progress: self.progress.borrow().clone(),
            error: o.error,
            cells: o.cells,
            report_url: format!("/api/bench/{}/report", self.id),
        }
    }

    pub fn is_running(&self) -> bool {
        !*self.ended.borrow()
    }

    /// Waits until the run has ended and its record is saved.
    pub async fn ended(&self) -> JobView {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|e| *e).await;
        self.view()
    }

    /// Cancels the run and waits (bounded) until its requests are dropped and it is saved.
    pub async fn cancel(&self) {
        self.cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.ended()).await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("bench run {0} is already running; cancel it with DELETE /api/bench/{0} or wait for it")]
    Busy(String),
    #[error("no bench profile named '{0}'; GET /api/bench/profiles lists them")]
    UnknownProfile(String),
    /// The run's results could not be saved: refused before it takes the engine.
    #[error("bench results cannot be saved: {0}; set data_dir (or MLXBAR_DATA_DIR) to a writable folder")]
    DataDir(String),
}

pub struct BenchJobs {
    store: BenchStore,
    /// Where the run sends its requests: this server, over loopback.
    self_url: String,
    api_key: Option<String>,
    metrics: Arc<Metrics>,
    /// The server's power sampler: a run's joules per token come from it.
    power: Arc<PowerMonitor>,
    active: watch::Sender<Option<Active>>,
    jobs: Mutex<VecDeque<Arc<Job>>>,
    /// Requests the gate holds right now.
    waiting: std::sync::atomic::AtomicUsize,
}

impl BenchJobs {
    pub fn new(
        store: BenchStore,
        self_url: String,
        api_key: Option<String>,
        metrics: Arc<Metrics>,
        power: Arc<PowerMonitor>,
    ) -> Arc<BenchJobs> {
        Arc::new(BenchJobs {
            store,
            self_url,
            api_key,
            metrics,
            power,
            active: watch::channel(None).0,
            jobs: Mutex::new(VecDeque::new()),
            waiting: Default::default(),
        })
    }

    pub fn store(&self) -> &BenchStore {
        &self.store
    }

    pub fn profiles(&self) -> (Vec<Plan>, Vec<String>) {
        plan::available(&self.store.plans_dir())
    }

    pub fn active(&self) -> Option<Active> {
        self.active.borrow().clone()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Newest first.
    pub fn jobs(&self) -> Vec<Arc<Job>> {
        self.jobs.lock().unwrap().iter().rev().cloned().collect()
    }

    pub fn job(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs.lock().unwrap().iter().find(|j| j.id == id).cloned()
    }

    /// Cancels the running job, if any (on shutdown), and waits until it has ended.
    pub async fn cancel_active(&self) {
        if let Some(job) = self.active().and_then(|a| self.job(&a.id)) {
            job.cancel().await;
        }
    }

    /// Starts `profile` in the background; must be called inside a tokio runtime.
    pub fn start(self: &Arc<Self>, profile: &str) -> Result<Arc<Job>, StartError> {
        let plan = plan::find(&self.store.plans_dir(), profile).ok_or_else(|| StartError::UnknownProfile(profile.to_string()))?;
        self.store.check_writable().map_err(|e| StartError::DataDir(format!("{e:#}")))?;
        let id = new_run_id();
        let token = hex::encode(rand::random::<[u8; 16]>());
        let (progress_tx, progress_rx) = watch::channel(Progress::default());
        let (ended_tx, ended_rx) = watch::channel(false);
        let claimed = self.active.send_if_modified(|a| {
            if a.is_some() {
                return false;
            }
            *a = Some(Active { id: id.clone(), token: token.clone(), started: Instant::now(), progress: progress_rx.clone() });
            true
        });
        if !claimed {
            return Err(StartError::Busy(self.active().map(|a| a.id).unwrap_or_default()));
        }
        self.metrics.bench_running.set(1);
        let job = Arc::new(Job {
            id: id.clone(),
            profile: plan.name.clone(),
            started_unix: now_unix(),
            progress: progress_rx,
            cancel: CancellationToken::new(),
            ended: ended_rx,
            outcome: Mutex::new(Outcome { state: RunState::Running, finished_unix: None, error: None, cells: vec![] }),
        });
        {
            let mut jobs = self.jobs.lock().unwrap();
            jobs.push_back(job.clone());
            while jobs.len() > RECENT_JOBS {
                jobs.pop_front();
            }
        }
        let this = self.clone();
        let j = job.clone();
        tokio::spawn(async move {
            let record = this.execute(&j, plan, token, progress_tx).await;
            let outcome = Outcome {
                state: record.state,
                finished_unix: record.finished_unix,
                error: record.error.clone(),
                cells: record.cells.clone(),
            };
            let store = this.store.clone();
            let html = report::html(&record);
            if let Err(e) =
                tokio::task::spawn_blocking(move || store.save(&record, &html)).await.map_err(anyhow::Error::from).and_then(|r| r)
            {
                tracing::error!("saving bench run {}: {e:#}", j.id);
            }
            // In this order: whoever sees the run ended finds it in history and the
            // engine free.
            this.active.send_replace(None);
            this.metrics.bench_running.set(0);
            *j.outcome.lock().unwrap() = outcome;
            let _ = ended_tx.send(true);
        });
        Ok(job)
    }

    async fn execute(&self, job: &Job, plan: Plan, token: String, progress: watch::Sender<Progress>) -> RunRecord {
        let mut record = RunRecord::start(job.id.clone(), &plan, job.started_unix);
        let client = match self.client(&token) {
            Ok(c) => c,
            Err(e) => {
                record.state = RunState::Failed;
                record.error = Some(format!("{e:#}"));
                return record;
            }
        };
        let target = Target { label: "mlxbar".into(), base_url: self.self_url.clone(), model: "default".into() };
        record.targets = vec![runner::describe(&client, &target).await];
        let targets = record.targets.clone();
        let run = runner::run_plan(&client, &targets, &plan, &progress, &mut record.cells, &self.power);
        record.state = tokio::select! {
            r = run => match r {
                Ok(()) => RunState::Done,
                Err(e) => {
                    record.error = Some(format!("{e:#}"));
                    RunState::Failed
                }
            },
            _ = job.cancel.cancelled() => RunState::Cancelled,
        };
        record.finished_unix = Some(now_unix());
        record
    }

    fn client(&self, token: &str) -> Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(BENCH_TOKEN_HEADER, token.parse()?);
        if let Some(key) = &self.api_key {
            headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {key}").parse()?);
        }
        Ok(reqwest::Client::builder().default_headers(headers).timeout(Duration::from_secs(3600)).build()?)
    }

    /// The exclusivity gate for generation requests: `Ok` when no run holds the engine,
    /// when the request carries the run's token, or when the run ends within `wait`;
    /// otherwise the seconds after which to retry.
    pub async fn gate(&self, token: Option<&[u8]>, wait: Duration) -> Result<(), u64> {
        let Some(active) = self.active() else { return Ok(()) };
        if token.is_some_and(|t| bool::from(subtle::ConstantTimeEq::ct_eq(t, active.token.as_bytes()))) {
            return Ok(());
        }
        // Counted while waiting; the guard uncounts it also when the client disconnects
        // and this future is dropped mid-wait.
        let _waiting = WaitingGuard::enter(self);
        let mut rx = self.active.subscribe();
        let idle = tokio::time::timeout(wait, rx.wait_for(Option::is_none)).await.is_ok_and(|r| r.is_ok());
        if idle {
            Ok(())
        } else {
            Err(self.active().map(|a| a.remaining_seconds()).unwrap_or(1))
        }
    }
}

/// One request counted in `waiting` and `mlxbar_bench_waiting_requests` for as long as it lives.
struct WaitingGuard<'a>(&'a BenchJobs);

impl<'a> WaitingGuard<'a> {
    fn enter(jobs: &'a BenchJobs) -> Self {
        jobs.waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        jobs.metrics.bench_waiting_requests.inc();
        WaitingGuard(jobs)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.metrics.bench_waiting_requests.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::CellSpecField;

    fn cell(concurrency: usize, tok_s: f64, ttft: f64, errors: usize) -> CellResult {
        CellResult {
            target: "mlxbar".into(),
            cell: CellSpecField { concurrency, prompt_tokens: 128, output_tokens: 64, prediction: false },
            requests: 3,
            errors,
            error: None,
            prompt_tokens_counted: Some(128),
            completion_tokens: 192,
            ttft_p50: ttft,
            ttft_p90: ttft,
            itl_p50: 0.05,
            itl_p90: 0.06,
            tpot_p50: 0.05,
            e2e_p50: 3.0,
            e2e_p90: 3.1,
            stream_tok_s_p50: tok_s,
            aggregate_tok_s: tok_s,
            prompt_tok_s_p50: 400.0,
            peak_mlx_bytes: None,
            peak_rss_bytes: None,
            pressure_max: None,
            wall_seconds: 3.1,
            ..Default::default()
        }
    }

    fn view(state: RunState, cells: Vec<CellResult>, error: Option<&str>) -> JobView {
        JobView {
            id: "r1".into(),
            profile: "quick".into(),
            state,
            started_unix: 0,
            finished_unix: Some(1),
            progress: Progress::default(),
            error: error.map(str::to_owned),
            cells,
            report_url: "/api/bench/r1/report".into(),
        }
    }

    #[tokio::test]
    async fn a_waiting_client_that_disconnects_is_no_longer_counted() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let jobs =
            BenchJobs::new(BenchStore::new(dir.path()), "http://127.0.0.1:1".into(), None, metrics.clone(), Arc::new(PowerMonitor::idle()));
        let progress = watch::channel(Progress::default()).1;
        jobs.active.send_replace(Some(Active { id: "r1".into(), token: "t".into(), started: Instant::now(), progress }));
        let waiter = {
            let jobs = jobs.clone();
            tokio::spawn(async move { jobs.gate(None, Duration::from_secs(3600)).await })
        };
        let counted = async {
            while jobs.waiting() == 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), counted).await.expect("the request is counted while it waits");
        assert_eq!(metrics.bench_waiting_requests.get(), 1);
        // The client goes away: axum drops the handler's future, as abort does here.
        waiter.abort();
        let _ = waiter.await;
        assert_eq!((jobs.waiting(), metrics.bench_waiting_requests.get()), (0, 0));
    }

    #[test]
    fn a_finished_run_reads_as_its_cells() {
        let (title, body) = view(RunState::Done, vec![cell(1, 20.64, 0.271, 0), cell(8, 54.6, 2.0, 1)], None).notice();
        assert_eq!(title, "Benchmark finished");
        assert_eq!(body, "quick: 1×128→64: 20.6 tok/s, TTFT 0.27 s; 8×128→64: 54.6 tok/s, TTFT 2.00 s, 1 errors");
        let mut powered = cell(1, 20.64, 0.271, 0);
        powered.tokens_per_joule = Some(2.346);
        let (_, body) = view(RunState::Done, vec![powered], None).notice();
        assert_eq!(body, "quick: 1×128→64: 20.6 tok/s (2.35 tok/J), TTFT 0.27 s");
    }

    #[test]
    fn long_failed_and_empty_runs_stay_short_and_say_why() {
        let many = (1..=5).map(|n| cell(n, 10.0, 0.5, 0)).collect();
        let (_, body) = view(RunState::Done, many, None).notice();
        assert!(body.ends_with("; and 2 more cells"), "{body}");
        let (title, body) = view(RunState::Failed, vec![], Some("every request failed")).notice();
        assert_eq!((title.as_str(), body.as_str()), ("Benchmark failed", "quick: every request failed"));
        let (title, body) = view(RunState::Cancelled, vec![], None).notice();
        assert_eq!((title.as_str(), body.as_str()), ("Benchmark cancelled", "quick: No cell was measured."));
    }
}
