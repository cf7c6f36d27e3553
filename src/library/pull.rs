//! Pulling a model from the Hugging Face Hub into the standard hub cache
//! (`models--org--name/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/<revision>}`),
//! so huggingface_hub, mlx-lm and mlxbar's library all see the same files. Only what a model
//! needs is fetched (see `select`), partial blobs (`<etag>.incomplete`) resume with `Range`,
//! the free disk is checked (and reserved, see `disk`) before the first byte, everything is
//! written user-only, and a cancel takes effect at once (a stalled hub included), leaving
//! the partial blob to resume. `HF_TOKEN` never goes in clear over the network: over plain
//! http it is sent only to a loopback host (a local mirror), unless
//! `MLXBAR_HF_TOKEN_OVER_HTTP=1` says to (both with a warning in the pull's progress).
//!
//! Why reqwest against the hub's documented file API rather than the `hf-hub` crate (1.0.0,
//! read for this): its downloader recreates the `.incomplete` blob on every attempt
//! (`File::create`, no `Range`), so an interrupted multi-GB download starts over; it writes
//! with the process umask where mlxbar's files are user-only; and it brings reqwest 0.13
//! and hf-xet (a second HTTP stack and a large build) beside the reqwest 0.12 mlxbar
//! already has. It does honour HF_ENDPOINT, HF_TOKEN, the cache dir and offer progress;
//! the parts used here are few and stable:
//! `GET /api/models/{repo}/revision/{rev}` (commit `sha` and `siblings`),
//! `HEAD /{repo}/resolve/{commit}/{file}` (blob name from `X-Linked-Etag`/`ETag`, size from
//! `X-Linked-Size`/`Content-Length`, `X-Repo-Commit`), and `GET` of the same, with `Range`.
pub mod cli;
mod disk;
mod download;
mod jobs;
mod layout;
mod select;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use schemars::JsonSchema;
use serde::Serialize;

#[cfg(feature = "test-hooks")]
pub use disk::pretend_free_space;
pub use disk::{check_space, free_space, DISK_HEADROOM};
pub use jobs::{CancelError, PullError, Pulls};
pub use layout::{hub_cache_dir, repo_dir};
pub use select::{check_file_name, check_repo_id, check_revision, select_files};

/// What to pull and from where; `from_env` fills in what huggingface_hub would use.
#[derive(Clone)]
pub struct PullOptions {
    /// `org/name` on the hub.
    pub repo: String,
    /// Branch, tag or commit; `main` when none.
    pub revision: Option<String>,
    /// For a GGUF repo: the one `.gguf` to fetch.
    pub gguf_file: Option<String>,
    /// The hub cache to write (`HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// `HF_ENDPOINT` or https://huggingface.co.
    pub endpoint: String,
    /// `HF_TOKEN` (or the token file `huggingface-cli login` writes), sent as a Bearer token.
    pub token: Option<String>,
    /// `MLXBAR_HF_TOKEN_OVER_HTTP=1`: send the token to a plain-http endpoint beyond loopback.
    pub token_over_http: bool,
}

impl std::fmt::Debug for PullOptions {
    // The token never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullOptions")
            .field("repo", &self.repo)
            .field("revision", &self.revision)
            .field("gguf_file", &self.gguf_file)
            .field("cache_dir", &self.cache_dir)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("token_over_http", &self.token_over_http)
            .finish()
    }
}

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The opt-in to sending `HF_TOKEN` over plain http beyond loopback.
pub const TOKEN_OVER_HTTP: &str = "MLXBAR_HF_TOKEN_OVER_HTTP";

impl PullOptions {
    pub fn from_env(repo: &str) -> PullOptions {
        PullOptions {
            repo: repo.trim().to_string(),
            revision: None,
            gguf_file: None,
            cache_dir: layout::hub_cache_dir(),
            endpoint: endpoint_from_env(),
            token: token_from_env(),
            token_over_http: non_empty_env(TOKEN_OVER_HTTP).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
        }
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn endpoint_from_env() -> String {
    non_empty_env("HF_ENDPOINT").map(|e| e.trim_end_matches('/').to_string()).unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
}

/// huggingface_hub's order: `HF_TOKEN`, then the file at `HF_TOKEN_PATH`, then `$HF_HOME/token`.
fn token_from_env() -> Option<String> {
    if let Some(token) = non_empty_env("HF_TOKEN") {
        return Some(token);
    }
    let path = non_empty_env("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| layout::hf_home().join("token"));
    std::fs::read_to_string(path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

#[derive(Serialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PullState {
    Running,
    Done,
    Failed,
    Cancelled,
}

/// Where a pull is: the CLI's bar, `GET /api/models/pulls` and the live stream show this.
#[derive(Serialize, JsonSchema, Clone, Debug)]
pub struct PullProgress {
    /// The server's name for this pull (`DELETE /api/models/pulls/{id}` cancels it); None
    /// for a pull of the CLI.
    pub id: Option<String>,
    pub repo: String,
    /// The file being fetched now.
    pub file: Option<String>,
    /// Bytes on disk of the chosen files (ones already cached count as done).
    pub bytes_done: u64,
    /// Their total size, once the hub said it.
    pub bytes_total: Option<u64>,
    pub files_done: usize,
    pub files_total: usize,
    pub state: PullState,
    pub error: Option<String>,
    /// The snapshot directory, when done.
    pub path: Option<PathBuf>,
    /// What the user should know (HF_TOKEN and plain http).
    pub warnings: Vec<String>,
}

impl PullProgress {
    pub fn new(repo: &str) -> PullProgress {
        PullProgress {
            id: None,
            repo: repo.to_string(),
            file: None,
            bytes_done: 0,
            bytes_total: None,
            files_done: 0,
            files_total: 0,
            state: PullState::Running,
            error: None,
            path: None,
            warnings: Vec::new(),
        }
    }
}

/// The error a pull returns when its cancel flag was set (the partial blob stays, to resume).
#[derive(Debug, thiserror::Error)]
#[error("the pull was cancelled")]
pub struct Cancelled;

/// Downloads `opts.repo` into `opts.cache_dir`; blocking (it runs its own small runtime, so
/// call it from a thread or `spawn_blocking`). Returns the snapshot directory. Setting
/// `cancel` ends it within [`CANCEL_POLL`], whatever it waits on.
pub fn pull(opts: &PullOptions, progress: &dyn Fn(&PullProgress), cancel: &AtomicBool) -> Result<PathBuf> {
    let mut tracker = Tracker::new(&opts.repo, progress);
    let result =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the download runtime").and_then(|rt| {
            rt.block_on(async {
                // Dropping `run` mid-download is safe: every chunk is written whole before the
                // next await, so the partial blob holds a prefix of the file.
                tokio::select! {
                    result = run(opts, &mut tracker) => result,
                    () = cancelled(cancel) => Err(Cancelled.into()),
                }
            })
        });
    match &result {
        Ok(path) => {
            tracker.p.state = PullState::Done;
            tracker.p.file = None;
            tracker.p.path = Some(path.clone());
        }
        Err(e) if e.is::<Cancelled>() => tracker.p.state = PullState::Cancelled,
        Err(e) => {
            tracker.p.state = PullState::Failed;
            tracker.p.error = Some(format!("{e:#}"));
        }
    }
    tracker.emit(true);
    result
}

/// How often a pull looks at its cancel flag.
pub const CANCEL_POLL: Duration = Duration::from_millis(50);

async fn cancelled(cancel: &AtomicBool) {
    while !cancel.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(CANCEL_POLL).await;
    }
}

/// One file the hub will serve: its blob name and size.
#[derive(Clone, Debug)]
struct Remote {
    file: String,
    etag: String,
    size: u64,
}

async fn run(opts: &PullOptions, tracker: &mut Tracker<'_>) -> Result<PathBuf> {
    select::check_repo_id(&opts.repo)?;
    let revision = opts.revision.as_deref().map(str::trim).filter(|r| !r.is_empty()).unwrap_or("main");
    select::check_revision(revision)?;
    if let Some(file) = &opts.gguf_file {
        select::check_file_name(file)?;
    }
    let (hub, warning) = download::Hub::new(&opts.endpoint, opts.token.clone(), opts.token_over_http)?;
    if let Some(warning) = warning {
        tracing::warn!("pull of {}: {warning}", opts.repo);
        tracker.p.warnings.push(warning);
        tracker.emit(true);
    }
    let info = hub.model_info(&opts.repo, revision).await?;
    let files = select::select_files(&info.files, opts.gguf_file.as_deref()).map_err(|e| anyhow::anyhow!("{}: {e}", opts.repo))?;

    // Sizes and blob names first: the disk check needs the total before any byte lands.
    let commit_hint = info.sha.clone().unwrap_or_else(|| revision.to_string());
    let mut remotes = Vec::with_capacity(files.len());
    let mut commit = info.sha.clone();
    for file in &files {
        let head = hub.head(&opts.repo, &commit_hint, revision, file).await?;
        commit = commit.or(head.commit);
        remotes.push(Remote { file: file.clone(), etag: head.etag, size: head.size });
    }
    let commit = commit.with_context(|| format!("the hub named no commit for {} at {revision}", opts.repo))?;
    select::check_commit(&commit)?;

    let repo_dir = layout::repo_dir(&opts.cache_dir, &opts.repo);
    let total: u64 = remotes.iter().map(|r| r.size).sum();
    let on_disk: u64 = remotes.iter().map(|r| layout::bytes_on_disk(&repo_dir, &r.etag, r.size)).sum();
    tracker.p.bytes_total = Some(total);
    tracker.p.files_total = remotes.len();
    tracker.p.bytes_done = on_disk;
    tracker.emit(true);
    let needed = total.saturating_sub(on_disk);
    let reservation =
        disk::reserve(&opts.cache_dir, needed).map_err(|e| anyhow::anyhow!("{}: {e} (in {})", opts.repo, opts.cache_dir.display()))?;

    crate::private_fs::create_dir_all(&repo_dir.join("blobs"))?;
    for remote in &remotes {
        let blob = layout::blob_path(&repo_dir, &remote.etag);
        let already = layout::bytes_on_disk(&repo_dir, &remote.etag, remote.size);
        tracker.p.file = Some(remote.file.clone());
        tracker.emit(true);
        if already != remote.size {
            let url = hub.resolve_url(&opts.repo, &commit, &remote.file)?;
            let before = tracker.p.bytes_done - already;
            let mut on_bytes = |have: u64| {
                tracker.p.bytes_done = before + have;
                reservation.set_remaining(total.saturating_sub(tracker.p.bytes_done));
                tracker.emit(false);
            };
            download::fetch_blob(&hub, url, &blob, remote, revision, &opts.repo, &mut on_bytes).await?;
        }
        layout::link(&repo_dir, &commit, &remote.file, &remote.etag)?;
        tracker.p.files_done += 1;
    }
    if revision != commit {
        layout::write_ref(&repo_dir, revision, &commit)?;
    }
    Ok(layout::snapshot_dir(&repo_dir, &commit))
}

/// Holds the progress and passes it on, at most every 100 ms unless forced: a chunk is a
/// few KB, and a multi-GB file would otherwise mean a million callbacks.
struct Tracker<'a> {
    p: PullProgress,
    sink: &'a dyn Fn(&PullProgress),
    last: Option<Instant>,
}

impl<'a> Tracker<'a> {
    fn new(repo: &str, sink: &'a dyn Fn(&PullProgress)) -> Self {
        Tracker { p: PullProgress::new(repo), sink, last: None }
    }

    fn emit(&mut self, force: bool) {
        if force || self.last.is_none_or(|t| t.elapsed() >= Duration::from_millis(100)) {
            self.last = Some(Instant::now());
            (self.sink)(&self.p);
        }
    }
}
