//! The server's pulls: each on its own thread, at most one running per repo, their progress
//! kept for `GET /api/models/pulls` and the live stream (finished ones too, the most recent
//! few, so a client sees how a pull ended). A finished pull tells the library (`on_done`).
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{pull, select, Cancelled, PullOptions, PullProgress, PullState};

/// Finished pulls kept for the list.
const KEEP_FINISHED: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("a pull of {0} is already running")]
    Running(String),
    #[error("{0}")]
    Invalid(String),
}

struct Job {
    progress: PullProgress,
    cancel: Arc<AtomicBool>,
}

pub struct Pulls {
    jobs: Mutex<Vec<Job>>,
    on_done: Arc<dyn Fn(&Path) + Send + Sync>,
}

impl Pulls {
    /// `on_done(snapshot_dir)` runs on the pull's thread once its files are in place.
    pub fn new(on_done: Arc<dyn Fn(&Path) + Send + Sync>) -> Arc<Pulls> {
        Arc::new(Pulls { jobs: Mutex::new(Vec::new()), on_done })
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts pulling in the background; the names are checked now so a bad one is a 400.
    pub fn start(self: &Arc<Self>, opts: PullOptions) -> Result<PullProgress, PullError> {
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
        let progress = PullProgress::new(&repo);
        {
            let mut jobs = self.jobs();
            if jobs.iter().any(|j| j.progress.repo == repo && j.progress.state == PullState::Running) {
                return Err(PullError::Running(repo));
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
                    this.update(p.clone());
                }
            };
            let result = pull(&opts, &report, &cancel);
            if let Ok(path) = &result {
                (this.on_done)(path);
            }
            let mut last = this.get(&opts.repo).unwrap_or_else(|| PullProgress::new(&opts.repo));
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
            this.update(last);
        });
        if let Err(e) = spawned {
            let mut failed = progress.clone();
            failed.state = PullState::Failed;
            failed.error = Some(format!("could not start the pull: {e}"));
            self.update(failed.clone());
            return Ok(failed);
        }
        Ok(progress)
    }

    fn update(&self, progress: PullProgress) {
        let mut jobs = self.jobs();
        if let Some(job) = jobs.iter_mut().find(|j| j.progress.repo == progress.repo) {
            // A finished state is final: a late progress report never revives it.
            if job.progress.state == PullState::Running {
                job.progress = progress;
            }
        }
    }

    fn get(&self, repo: &str) -> Option<PullProgress> {
        self.jobs().iter().find(|j| j.progress.repo == repo).map(|j| j.progress.clone())
    }

    /// Every pull this server started (running ones and the last few finished), oldest first.
    pub fn list(&self) -> Vec<PullProgress> {
        self.jobs().iter().map(|j| j.progress.clone()).collect()
    }

    /// Asks a running pull of `repo` to stop (its partial file stays, to resume); false when none runs.
    pub fn cancel(&self, repo: &str) -> bool {
        let jobs = self.jobs();
        let running = jobs.iter().find(|j| j.progress.repo == repo && j.progress.state == PullState::Running);
        running.inspect(|j| j.cancel.store(true, Ordering::Relaxed)).is_some()
    }
}
