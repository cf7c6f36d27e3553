//! `mlxbar pull` against a fake hub on 127.0.0.1 (tests/pull/hub.rs; no internet here): a
//! small MLX repo lands byte for byte in the standard hub cache layout (blobs, relative
//! snapshot symlinks, refs/main) with only the files a model needs; a cut download resumes
//! with Range, within a pull and from an earlier one's partial; a missing file's 404 names
//! it; a GGUF repo yields the asked file or the list of choices; the server's job list, its
//! cap, cancels by id (at once, a stalled hub included), and the disk space that pulls in
//! flight reserve.
#[path = "pull/hub.rs"]
mod hub;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hub::{commit_of, etag_of, pattern, sha256, FakeHub};
use mlxbar::library::pull::{pretend_free_space, pull, PullError, PullOptions, PullProgress, PullState, Pulls, DISK_HEADROOM};

const MLX_REPO: &str = "mlx-test/tiny-4bit";

fn mlx_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", br#"{"model_type": "llama", "hidden_size": 64}"#.to_vec()),
        ("tokenizer.json", br#"{"version": "1.0", "model": {"type": "BPE"}}"#.to_vec()),
        ("tokenizer_config.json", br#"{"chat_template": "{{ messages }}"}"#.to_vec()),
        ("model.safetensors", pattern(6 * 1024, 7)),
        ("README.md", b"# not needed to run".to_vec()),
        (".gitattributes", b"*.safetensors filter=lfs".to_vec()),
    ]
}

fn opts(hub: &FakeHub, repo: &str, cache: &Path) -> PullOptions {
    PullOptions {
        repo: repo.to_string(),
        revision: None,
        gguf_file: None,
        cache_dir: cache.to_path_buf(),
        endpoint: hub.base.clone(),
        token: Some("hf_test_token".to_string()),
        token_over_http: false,
    }
}

/// Pulls, collecting every progress report.
fn pull_logged(opts: &PullOptions) -> (anyhow::Result<PathBuf>, Vec<PullProgress>) {
    let seen = Mutex::new(Vec::new());
    let result = pull(opts, &|p| seen.lock().unwrap().push(p.clone()), &AtomicBool::new(false));
    (result, seen.into_inner().unwrap())
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_model_repo_lands_in_the_hub_cache_layout() {
    let hub = FakeHub::start();
    for (file, bytes) in mlx_files() {
        hub.add(MLX_REPO, file, &bytes);
    }
    let cache = tempfile::tempdir().unwrap();
    let (result, seen) = pull_logged(&opts(&hub, MLX_REPO, cache.path()));
    let snapshot = result.unwrap();

    let repo_dir = cache.path().join("models--mlx-test--tiny-4bit");
    let commit = commit_of(MLX_REPO);
    assert_eq!(snapshot, repo_dir.join("snapshots").join(&commit));
    let wanted = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];
    assert_eq!(names_in(&snapshot), wanted.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(), "only what a model needs");
    let files: std::collections::HashMap<_, _> = mlx_files().into_iter().collect();
    for name in wanted {
        let link = snapshot.join(name);
        let etag = etag_of(name, &files[name]);
        assert_eq!(std::fs::read_link(&link).unwrap(), PathBuf::from(format!("../../blobs/{etag}")), "{name}: a relative link to its blob");
        assert_eq!(std::fs::read(&link).unwrap(), files[name], "{name}: byte for byte");
    }
    assert_eq!(
        etag_of("model.safetensors", &files["model.safetensors"]),
        sha256(&files["model.safetensors"]),
        "LFS blobs are named by sha256"
    );
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), commit);
    let blobs = names_in(&repo_dir.join("blobs"));
    assert_eq!(blobs.len(), 4, "{blobs:?}");
    assert!(blobs.iter().all(|b| !b.ends_with(".incomplete")), "{blobs:?}");
    #[cfg(unix)]
    {
        for blob in &blobs {
            assert_eq!(mode(&repo_dir.join("blobs").join(blob)), 0o600, "{blob}");
        }
        for dir in [repo_dir.clone(), repo_dir.join("blobs"), snapshot.clone(), repo_dir.join("refs")] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
    }

    let last = seen.last().unwrap();
    let total: u64 = wanted.iter().map(|n| files[n].len() as u64).sum();
    assert_eq!((last.state, last.files_done, last.files_total), (PullState::Done, 4, 4));
    assert_eq!((last.bytes_done, last.bytes_total), (total, Some(total)));
    assert_eq!(last.path.as_deref(), Some(snapshot.as_path()));
    assert!(seen.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done), "progress only grows");

    // The token goes to the hub, never to the CDN another host serves the weights from.
    let hits = hub.hits();
    assert!(hits.iter().any(|h| h.path.starts_with("/cdn/")), "{hits:?}");
    for hit in &hits {
        let expected = if hit.path.starts_with("/cdn/") { None } else { Some("Bearer hf_test_token") };
        assert_eq!(hit.auth.as_deref(), expected, "{hit:?}");
    }
    assert!(!hits.iter().any(|h| h.path.contains("README") || h.path.contains(".gitattributes")), "{hits:?}");
    // Sent over plain http (to loopback), and the user is told.
    assert!(last.warnings.iter().any(|w| w.contains("HF_TOKEN is sent over plain http") && w.contains("loopback")), "{last:?}");

    // Again: nothing is downloaded twice.
    hub.clear_hits();
    let (again, _) = pull_logged(&opts(&hub, MLX_REPO, cache.path()));
    assert_eq!(again.unwrap(), snapshot);
    let gets: Vec<_> = hub.hits().into_iter().filter(|h| h.method == "GET" && !h.path.starts_with("/api/")).collect();
    assert!(gets.is_empty(), "cached files are not fetched again: {gets:?}");
}

#[test]
fn a_cut_download_resumes_with_range() {
    let hub = FakeHub::start();
    let weights = pattern(8 * 1024, 3);
    hub.add(MLX_REPO, "config.json", b"{}");
    hub.add(MLX_REPO, "model.safetensors", &weights);
    hub.cut_next_get("model.safetensors", 3000);
    let cache = tempfile::tempdir().unwrap();
    let snapshot = pull_logged(&opts(&hub, MLX_REPO, cache.path())).0.unwrap();
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), weights);
    let gets: Vec<_> = hub.hits().into_iter().filter(|h| h.method == "GET" && h.path.starts_with("/cdn/")).collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(gets[1].range.as_deref(), Some("bytes=3000-"), "the second try asks for the rest only");
}

#[test]
fn an_earlier_pulls_partial_file_is_resumed_and_a_corrupt_one_is_refused() {
    let hub = FakeHub::start();
    let weights = pattern(8 * 1024, 5);
    hub.add(MLX_REPO, "config.json", b"{}");
    hub.add(MLX_REPO, "model.safetensors", &weights);
    let cache = tempfile::tempdir().unwrap();
    let blobs = cache.path().join("models--mlx-test--tiny-4bit/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = blobs.join(format!("{}.incomplete", sha256(&weights)));

    std::fs::write(&partial, &weights[..2000]).unwrap();
    let snapshot = pull_logged(&opts(&hub, MLX_REPO, cache.path())).0.unwrap();
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), weights);
    assert!(!partial.exists());
    let gets: Vec<_> = hub.hits().into_iter().filter(|h| h.method == "GET" && h.path.starts_with("/cdn/")).collect();
    assert_eq!(gets.iter().map(|h| h.range.as_deref()).collect::<Vec<_>>(), [Some("bytes=2000-")]);

    // A partial whose bytes are wrong fails the sha256 check and is thrown away; the next pull is whole.
    let fresh = tempfile::tempdir().unwrap();
    let blobs = fresh.path().join("models--mlx-test--tiny-4bit/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = blobs.join(format!("{}.incomplete", sha256(&weights)));
    std::fs::write(&partial, vec![0u8; 2000]).unwrap();
    let err = pull_logged(&opts(&hub, MLX_REPO, fresh.path())).0.unwrap_err();
    assert!(format!("{err:#}").contains("model.safetensors arrived corrupted"), "{err:#}");
    assert!(!partial.exists());
    let snapshot = pull_logged(&opts(&hub, MLX_REPO, fresh.path())).0.unwrap();
    assert_eq!(std::fs::read(snapshot.join("model.safetensors")).unwrap(), weights);
}

#[test]
fn a_missing_file_or_repo_is_named() {
    let hub = FakeHub::start();
    hub.add(MLX_REPO, "config.json", b"{}");
    hub.add(MLX_REPO, "model.safetensors", &pattern(1024, 1));
    hub.add_phantom(MLX_REPO, "tokenizer.json");
    let cache = tempfile::tempdir().unwrap();
    let (result, seen) = pull_logged(&opts(&hub, MLX_REPO, cache.path()));
    let err = format!("{:#}", result.unwrap_err());
    assert!(err.contains("tokenizer.json") && err.contains("404") && err.contains(MLX_REPO), "{err}");
    let last = seen.last().unwrap();
    assert_eq!(last.state, PullState::Failed);
    assert!(last.error.as_deref().unwrap().contains("tokenizer.json"), "{last:?}");

    let err = format!("{:#}", pull_logged(&opts(&hub, "mlx-test/no-such-model", cache.path())).0.unwrap_err());
    assert!(err.contains("mlx-test/no-such-model") && err.contains("404"), "{err}");
    let mut at_rev = opts(&hub, MLX_REPO, cache.path());
    at_rev.revision = Some("v9".into());
    let err = format!("{:#}", pull_logged(&at_rev).0.unwrap_err());
    assert!(err.contains("'v9'"), "{err}");
}

#[test]
fn a_gguf_repo_yields_the_asked_file_or_the_choices() {
    let hub = FakeHub::start();
    let repo = "gguf-test/tiny-GGUF";
    let q8 = pattern(3000, 8);
    hub.add(repo, "tiny-Q8_0.gguf", &q8);
    hub.add(repo, "tiny-F16.gguf", &pattern(5000, 16));
    hub.add(repo, "README.md", b"two quantizations");
    let cache = tempfile::tempdir().unwrap();

    let err = format!("{:#}", pull_logged(&opts(&hub, repo, cache.path())).0.unwrap_err());
    assert!(err.contains("tiny-Q8_0.gguf") && err.contains("tiny-F16.gguf") && err.contains("--file"), "{err}");
    assert!(!cache.path().join("models--gguf-test--tiny-GGUF").exists(), "nothing fetched when the choice is open");

    let mut asked = opts(&hub, repo, cache.path());
    asked.gguf_file = Some("nope.gguf".into());
    let err = format!("{:#}", pull_logged(&asked).0.unwrap_err());
    assert!(err.contains("nope.gguf") && err.contains("tiny-Q8_0.gguf"), "{err}");

    asked.gguf_file = Some("tiny-Q8_0.gguf".into());
    let snapshot = pull_logged(&asked).0.unwrap();
    assert_eq!(names_in(&snapshot), BTreeSet::from(["tiny-Q8_0.gguf".to_string()]));
    assert_eq!(std::fs::read(snapshot.join("tiny-Q8_0.gguf")).unwrap(), q8);
}

fn wait_for(pulls: &Pulls, repo: &str, what: impl Fn(&PullProgress) -> bool) -> PullProgress {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let job = pulls.list().into_iter().find(|p| p.repo == repo);
        if let Some(job) = job.filter(|j| what(j)) {
            return job;
        }
        assert!(Instant::now() < deadline, "pull of {repo}: {:?}", pulls.list());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn server_pulls_run_in_the_background_one_per_repo() {
    let hub = FakeHub::start();
    hub.add(MLX_REPO, "config.json", b"{}");
    hub.add(MLX_REPO, "model.safetensors", &pattern(4096, 2));
    let cache = tempfile::tempdir().unwrap();
    let done = Arc::new(Mutex::new(Vec::<PathBuf>::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let pulls = {
        let (done, calls) = (done.clone(), calls.clone());
        Pulls::new(Arc::new(move |p: &Path| {
            calls.fetch_add(1, Ordering::SeqCst);
            done.lock().unwrap().push(p.to_path_buf());
        }))
    };

    let bad = pulls.start(opts(&hub, "../etc", cache.path()), 2).unwrap_err();
    assert!(matches!(bad, PullError::Invalid(_)), "{bad}");

    // Held at the first file: a second pull of the repo is refused; a cancel ends it at once,
    // though the hub still holds the download.
    hub.hold(true);
    let started = pulls.start(opts(&hub, MLX_REPO, cache.path()), 2).unwrap();
    assert_eq!(started.state, PullState::Running);
    let id = started.id.clone().expect("a server pull has an id");
    let again = pulls.start(opts(&hub, MLX_REPO, cache.path()), 2).unwrap_err();
    assert!(matches!(again, PullError::Running(_)), "{again}");
    wait_for(&pulls, MLX_REPO, |p| p.file.is_some());
    let cancelled = pulls.cancel(&id, Duration::from_secs(10)).unwrap();
    assert_eq!(cancelled.state, PullState::Cancelled, "{cancelled:?}");
    assert_eq!(cancelled.id.as_deref(), Some(id.as_str()));
    assert!(pulls.cancel(&id, Duration::from_secs(1)).unwrap_err().to_string().contains("not running"));
    assert!(pulls.cancel("pull-999", Duration::from_secs(1)).unwrap_err().to_string().contains("no pull"));
    hub.hold(false);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let restarted = pulls.start(opts(&hub, MLX_REPO, cache.path()), 2).unwrap();
    assert_ne!(restarted.id, started.id, "each pull its own id");
    let finished = wait_for(&pulls, MLX_REPO, |p| p.state != PullState::Running);
    assert_eq!(finished.state, PullState::Done, "{finished:?}");
    let snapshot = cache.path().join("models--mlx-test--tiny-4bit/snapshots").join(commit_of(MLX_REPO));
    assert_eq!(finished.path.as_deref(), Some(snapshot.as_path()));
    assert_eq!(*done.lock().unwrap(), vec![snapshot], "the library is told once, before the job says done");
    assert_eq!(pulls.list().len(), 1, "one entry per repo");
    assert!(pulls.cancel(restarted.id.as_deref().unwrap(), Duration::from_secs(1)).is_err(), "nothing runs");
}

/// Two pulls that each fit the disk but not together: the second is refused while the first
/// holds its reservation, and fits once the first is cancelled. And at most `max_running` run.
#[test]
fn pulls_in_flight_reserve_their_disk_space_and_are_capped() {
    mlxbar::engine::faults::arm();
    let hub = FakeHub::start();
    let (first, second) = ("mlx-test/reserve-a", "mlx-test/reserve-b");
    for repo in [first, second] {
        hub.add(repo, "config.json", b"{}");
        hub.add(repo, "model.safetensors", &pattern(64 * 1024, 4));
    }
    let cache = tempfile::tempdir().unwrap();
    pretend_free_space(cache.path(), DISK_HEADROOM + 100 * 1024);
    let pulls = Pulls::new(Arc::new(|_: &Path| {}));

    hub.hold(true);
    let id = pulls.start(opts(&hub, first, cache.path()), 2).unwrap().id.unwrap();
    wait_for(&pulls, first, |p| p.file.is_some());
    let capped = pulls.start(opts(&hub, second, cache.path()), 1).unwrap_err();
    assert!(matches!(capped, PullError::TooMany { running: 1 }), "{capped}");
    pulls.start(opts(&hub, second, cache.path()), 2).unwrap();
    let refused = wait_for(&pulls, second, |p| p.state != PullState::Running);
    assert_eq!(refused.state, PullState::Failed, "{refused:?}");
    let why = refused.error.unwrap();
    assert!(why.contains("not enough disk") && why.contains("pulls in flight still need"), "{why}");

    assert_eq!(pulls.cancel(&id, Duration::from_secs(10)).unwrap().state, PullState::Cancelled);
    hub.hold(false);
    pulls.start(opts(&hub, second, cache.path()), 2).unwrap();
    let done = wait_for(&pulls, second, |p| p.state != PullState::Running);
    assert_eq!(done.state, PullState::Done, "{done:?}");
}

/// A hub (or a mirror, or whatever HF_ENDPOINT points at) names the files: `..`, absolute
/// names and a 100 MB file list must not reach the disk, and nothing outside the cache moves.
#[test]
fn names_and_answers_from_the_hub_are_checked_before_the_disk() {
    let hub = FakeHub::start();
    let outside = tempfile::tempdir().unwrap();
    let cache_parent = tempfile::tempdir().unwrap();
    let cache = cache_parent.path().join("hub");
    let sentinel = outside.path().join("evil.gguf");
    std::fs::write(&sentinel, b"keep me").unwrap();
    let sibling_sentinel = cache_parent.path().join("evil.gguf");
    std::fs::write(&sibling_sentinel, b"keep me too").unwrap();

    let repo = "evil-test/names-GGUF";
    hub.add(repo, "tiny-Q8_0.gguf", &pattern(3000, 8));
    let abs = sentinel.to_str().unwrap().to_string();
    for bad in ["../../../../evil.gguf", abs.as_str(), "q/../../../evil.gguf"] {
        let evil = format!("evil-test/names-{}", &sha256(bad.as_bytes())[..8]);
        hub.add(&evil, "tiny-Q8_0.gguf", &pattern(3000, 8));
        hub.add_phantom(&evil, bad);
        let mut asked = opts(&hub, &evil, &cache);
        asked.gguf_file = Some("evil.gguf".into());
        let (result, seen) = pull_logged(&asked);
        let err = format!("{:#}", result.unwrap_err());
        assert!(err.contains(bad) && err.contains("not a file name inside a repo") && err.contains(&evil), "{bad}: {err}");
        assert_eq!(seen.last().unwrap().state, PullState::Failed);
        // The whole list is refused, not just the asked file: the good file is not fetched either.
        let mut good = opts(&hub, &evil, &cache);
        good.gguf_file = Some("tiny-Q8_0.gguf".into());
        assert!(pull_logged(&good).0.is_err(), "{bad}");
    }
    assert!(!hub.hits().iter().any(|h| h.path.contains("/resolve/") || h.path.starts_with("/cdn/")), "{:?}", hub.hits());
    assert_eq!(std::fs::read(&sentinel).unwrap(), b"keep me");
    assert_eq!(std::fs::read(&sibling_sentinel).unwrap(), b"keep me too");
    assert_eq!(names_in(outside.path()), BTreeSet::from(["evil.gguf".to_string()]));

    // 100 MB of model info, streamed without a Content-Length: refused at the cap, quickly.
    hub.huge_info(MLX_REPO, 100 << 20);
    let started = Instant::now();
    let err = format!("{:#}", pull_logged(&opts(&hub, MLX_REPO, &cache)).0.unwrap_err());
    assert!(err.contains("16 MB cap"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(!cache.join("models--mlx-test--tiny-4bit").exists(), "nothing written");
    assert_eq!(names_in(cache_parent.path()), BTreeSet::from(["evil.gguf".to_string()]), "nothing beside the cache");
}
