//! The server's pulls: each on its own thread with an id, at most one running per repo and
//! at most `max_running` in all, their progress kept for `GET /api/models/pulls` and the
//! live stream (finished ones too, the most recent few, so a client sees how a pull ended).
//! A finished pull tells the library (`on_done`); a cancelled one leaves its partial blob,
//! which the next pull of the repo resumes.
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{pull, select, Cancelled, PullOptions, PullProgress, PullState};

/// Finished pulls kept for the list.
const KEEP_FINISHED: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("a pull of {0} is already running")]
    Running(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{running} pulls are running, the most allowed (max_concurrent_pulls); start this one when one ends")]
    TooMany { running: usize },
}

/// Why a cancel did nothing.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no pull '{0}'; GET /api/models/pulls lists them")]
    NotFound(String),
    #[error("the pull '{id}' is not running (it is {state})")]
    NotRunning { id: String, state: &'static str },
}

struct Job {
    progress: PullProgress,
    cancel: Arc<AtomicBool>,
}

pub struct Pulls {
    jobs: Mutex<Vec<Job>>,
    on_done: Arc<dyn Fn(&Path) + Send + Sync>,
    /// Numbers the pulls: their ids.
    started: AtomicU64,
}

impl Pulls {
    /// `on_done(snapshot_dir)` runs on the pull's thread once its files are in place.
    pub fn new(on_done: Arc<dyn Fn(&Path) + Send + Sync>) -> Arc<Pulls> {
        Arc::new(Pulls { jobs: Mutex::new(Vec::new()), on_done, started: AtomicU64::new(0) })
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts pulling in the background, unless `max_running` pulls run already; the names
    /// are checked now so a bad one is a 400.
    pub fn start(self: &Arc<Self>, opts: PullOptions, max_running: usize) -> Result<PullProgress, PullError> {
        let invalid = |e: anyhow::Error| PullError::Invalid(e.to_string());
        select::check_repo_id(&opts.repo).map_err(invalid)?;
        if let Some(revision) = &opts.revision {
            select::check_revision(revision).map_err(invalid)?;
        }
        if let Some(file) = &opts.gguf_file {
            select::check_file_name(file).map_err(invalid)?;
        }
        let repo = opts.repo.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let id = format!("pull-{}", self.started.fetch_add(1, Ordering::Relaxed) + 1);
        let progress = PullProgress { id: Some(id.clone()), ..PullProgress::new(&repo) };
        {
            let mut jobs = self.jobs();
            if jobs.iter().any(|j| j.progress.repo == repo && j.progress.state == PullState::Running) {
                return Err(PullError::Running(repo));
            }
            let running = jobs.iter().filter(|j| j.progress.state == PullState::Running).count();
            if running >= max_running {
                return Err(PullError::TooMany { running });
            }
            jobs.retain(|j| j.progress.repo != repo);
            let finished = jobs.iter().filter(|j| j.progress.state != PullState::Running).count();
            let mut drop_oldest = (finished + 1).saturating_sub(KEEP_FINISHED);
            jobs.retain(|j| {
                let drop = drop_oldest > 0 && j.progress.state != PullState::Running;
                drop_oldest -= usize::from(drop);
                !drop
            });
            jobs.push(Job { progress: progress.clone(), cancel: cancel.clone() });
        }
        let this = Arc::clone(self);
        let spawned = std::thread::Builder::new().name(format!("pull {repo}")).spawn(move || {
            // The final state is set below, after on_done: "done" means the library has it.
            let report = |p: &PullProgress| {
                if p.state == PullState::Running {
                    this.update(&id, p.clone());
                }
            };
            let result = pull(&opts, &report, &cancel);
            if let Ok(path) = &result {
                (this.on_done)(path);
            }
            let mut last = this.get(&id).unwrap_or_else(|| PullProgress::new(&opts.repo));
            last.file = None;
            match &result {
                Ok(path) => {
                    last.state = PullState::Done;
                    last.path = Some(path.clone());
                }
                Err(e) if e.is::<Cancelled>() => last.state = PullState::Cancelled,
                Err(e) => {
                    last.state = PullState::Failed;
                    last.error = Some(format!("{e:#}"));
                }
            }
            if let Err(e) = &result {
                tracing::warn!("pull of {} ended: {e:#}", opts.repo);
            }
            this.update(&id, last);
        });
        if let Err(e) = spawned {
            let mut failed = progress.clone();
            failed.state = PullState::Failed;
            failed.error = Some(format!("could not start the pull: {e}"));
            self.update(progress.id.as_deref().unwrap_or_default(), failed.clone());
            return Ok(failed);
        }
        Ok(progress)
    }

    fn update(&self, id: &str, mut progress: PullProgress) {
        let mut jobs = self.jobs();
        if let Some(job) = jobs.iter_mut().find(|j| j.progress.id.as_deref() == Some(id)) {
            // A finished state is final: a late progress report never revives it.
            if job.progress.state == PullState::Running {
                progress.id = Some(id.to_string());
                job.progress = progress;
            }
        }
    }

    /// The pull with this id.
    pub fn get(&self, id: &str) -> Option<PullProgress> {
        self.jobs().iter().find(|j| j.progress.id.as_deref() == Some(id)).map(|j| j.progress.clone())
    }

    /// Every pull this server started (running ones and the last few finished), oldest first.
    pub fn list(&self) -> Vec<PullProgress> {
        self.jobs().iter().map(|j| j.progress.clone()).collect()
    }

    /// Stops the running pull `id` (its partial blob stays, to resume) and waits up to
    /// `wait` for it to end: its progress then (state `cancelled`, or `done` if it finished
    /// first; still `running` only if it did not end in time).
    pub fn cancel(&self, id: &str, wait: Duration) -> Result<PullProgress, CancelError> {
        {
            let jobs = self.jobs();
            let job = jobs.iter().find(|j| j.progress.id.as_deref() == Some(id)).ok_or_else(|| CancelError::NotFound(id.to_string()))?;
            if job.progress.state != PullState::Running {
                return Err(CancelError::NotRunning { id: id.to_string(), state: state_word(job.progress.state) });
            }
            job.cancel.store(true, Ordering::Relaxed);
        }
        let deadline = Instant::now() + wait;
        loop {
            let now = self.get(id).ok_or_else(|| CancelError::NotFound(id.to_string()))?;
            if now.state != PullState::Running || Instant::now() >= deadline {
                return Ok(now);
            }
            std::thread::sleep(super::CANCEL_POLL);
        }
    }
}

fn state_word(state: PullState) -> &'static str {
    match state {
        PullState::Running => "running",
        PullState::Done => "done",
        PullState::Failed => "failed",
        PullState::Cancelled => "cancelled",
    }
}
