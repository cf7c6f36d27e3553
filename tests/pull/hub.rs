//! A fake Hugging Face hub on 127.0.0.1 for the pull tests, serving a temp directory
//! (`<root>/<org>/<name>/<file>`) in the hub's URL layout: the model-info API
//! (`/api/models/{org}/{name}/revision/{rev}`: `sha` + `siblings`) and
//! `/{org}/{name}/resolve/{rev}/{file}` with ETag, X-Repo-Commit, Content-Length and Range.
//! Weights (`.safetensors`, `.gguf`) behave like LFS files: a 302 carrying X-Linked-Etag
//! (their sha256) and X-Linked-Size, to a "CDN" on another host name (`localhost`), as
//! the real hub does. Every request is logged; a file's next GET can be cut after N bytes,
//! or stalled after N bytes until released, and GETs can be held until released.
#![allow(dead_code)]
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use sha2::{Digest, Sha256};

#[derive(Clone, Debug)]
pub struct Hit {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

struct HubState {
    root: PathBuf,
    cdn: String,
    log: Mutex<Vec<Hit>>,
    /// file name -> cut its next GET after this many bytes.
    cut: Mutex<HashMap<String, usize>>,
    /// file name -> its next GET sends this many bytes, then waits while held.
    stall: Mutex<HashMap<String, usize>>,
    /// Files listed in a repo's siblings without being served (a 404 on resolve).
    phantom: Mutex<HashMap<String, Vec<String>>>,
    hold: tokio::sync::watch::Sender<bool>,
    /// Stalled GETs wait while this is true (see `stall_next_get`).
    stalled: tokio::sync::watch::Sender<bool>,
    /// Repos whose model info is a streamed JSON of this many bytes (never held in memory).
    huge_info: Mutex<HashMap<String, usize>>,
}

pub struct FakeHub {
    pub base: String,
    pub root: tempfile::TempDir,
    state: Arc<HubState>,
}

pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The repo's commit: a stable 40-hex id.
pub fn commit_of(repo: &str) -> String {
    sha256(repo.as_bytes())[..40].to_string()
}

/// The blob name the hub gives: the sha256 for LFS files, a git-oid-like id for the rest.
pub fn etag_of(file: &str, bytes: &[u8]) -> String {
    if is_lfs(file) {
        sha256(bytes)
    } else {
        sha256(bytes)[..40].to_string()
    }
}

fn is_lfs(file: &str) -> bool {
    file.ends_with(".safetensors") || file.ends_with(".gguf")
}

/// `n` bytes that differ from offset to offset, so a misplaced resume shows.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(u32::from(seed % 31)).to_le_bytes()[1]).collect()
}

impl FakeHub {
    /// Starts on its own thread and runtime, so blocking pulls can run on the test's.
    pub fn start() -> FakeHub {
        let root = tempfile::tempdir().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (hold, _) = tokio::sync::watch::channel(false);
        let state = Arc::new(HubState {
            root: root.path().to_path_buf(),
            cdn: format!("http://localhost:{port}"),
            log: Mutex::new(Vec::new()),
            cut: Mutex::new(HashMap::new()),
            stall: Mutex::new(HashMap::new()),
            phantom: Mutex::new(HashMap::new()),
            hold,
            stalled: tokio::sync::watch::channel(false).0,
            huge_info: Mutex::new(HashMap::new()),
        });
        let app = Router::new()
            .route("/api/models/{org}/{name}/revision/{rev}", get(info))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
            .route("/cdn/{org}/{name}/{*file}", get(cdn))
            .with_state(state.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        FakeHub { base: format!("http://127.0.0.1:{port}"), root, state }
    }

    /// Puts a file in `repo`.
    pub fn add(&self, repo: &str, file: &str, bytes: &[u8]) {
        let path = self.root.path().join(repo).join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// Lists `file` in `repo` without serving it.
    pub fn add_phantom(&self, repo: &str, file: &str) {
        self.state.phantom.lock().unwrap().entry(repo.to_string()).or_default().push(file.to_string());
    }

    /// Makes `repo`'s model info a valid-looking JSON of `bytes` bytes, streamed.
    pub fn huge_info(&self, repo: &str, bytes: usize) {
        self.state.huge_info.lock().unwrap().insert(repo.to_string(), bytes);
    }

    pub fn cut_next_get(&self, file: &str, after: usize) {
        self.state.cut.lock().unwrap().insert(file.to_string(), after);
    }

    /// The next GET of `file` sends `after` bytes at once, then the rest after
    /// [`FakeHub::release_stall`] (a download that stops mid-file, for a cancel to land in).
    pub fn stall_next_get(&self, file: &str, after: usize) {
        self.state.stalled.send_replace(true);
        self.state.stall.lock().unwrap().insert(file.to_string(), after);
    }

    pub fn release_stall(&self) {
        self.state.stalled.send_replace(false);
    }

    /// While held, file GETs wait (HEADs and the info API answer).
    pub fn hold(&self, on: bool) {
        self.state.hold.send_replace(on);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.log.lock().unwrap().clone()
    }

    pub fn clear_hits(&self) {
        self.state.log.lock().unwrap().clear();
    }
}

fn log(state: &HubState, method: &Method, path: String, headers: &HeaderMap) {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    state.log.lock().unwrap().push(Hit { method: method.to_string(), path, range: header("range"), auth: header("authorization") });
}

fn not_found(code: &str, message: &str) -> Response {
    (StatusCode::NOT_FOUND, [("x-error-code", code.to_string()), ("x-error-message", message.to_string())], "").into_response()
}

fn files_of(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = format!("{prefix}{}", entry.file_name().to_str().unwrap());
        if entry.file_type().unwrap().is_dir() {
            files_of(&entry.path(), &format!("{name}/"), out);
        } else {
            out.push(name);
        }
    }
}

async fn info(
    State(state): State<Arc<HubState>>,
    Path((org, name, rev)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{org}/{name}");
    log(&state, &method, format!("/api/models/{repo}/revision/{rev}"), &headers);
    if let Some(bytes) = state.huge_info.lock().unwrap().get(&repo).copied() {
        return huge_json(&commit_of(&repo), bytes);
    }
    let dir = state.root.join(&repo);
    if !dir.is_dir() {
        return not_found("RepoNotFound", "Repository not found");
    }
    let commit = commit_of(&repo);
    if rev != "main" && rev != commit {
        return not_found("RevisionNotFound", "Invalid rev id");
    }
    let mut files = Vec::new();
    files_of(&dir, "", &mut files);
    files.extend(state.phantom.lock().unwrap().get(&repo).cloned().unwrap_or_default());
    files.sort();
    let siblings: Vec<_> = files.iter().map(|f| serde_json::json!({"rfilename": f})).collect();
    Json(serde_json::json!({"id": repo, "sha": commit, "siblings": siblings})).into_response()
}

/// `{"sha": .., "siblings": [{"rfilename": "f0000000.json"}, ...]}` of about `bytes` bytes,
/// made chunk by chunk as it is sent (no Content-Length: only a streaming cap can stop it).
fn huge_json(commit: &str, bytes: usize) -> Response {
    const ENTRY: usize = 30;
    let head = Bytes::from(format!("{{\"sha\":\"{commit}\",\"siblings\":[{{\"rfilename\":\"first.json\"}}"));
    let chunk: Bytes = (0..2048).map(|i| format!(",{{\"rfilename\":\"f{i:07}.json\"}}")).collect::<String>().into();
    let chunks = bytes / (ENTRY * 2048);
    let body = futures::stream::iter(
        std::iter::once(head).chain(std::iter::repeat_n(chunk, chunks)).chain(std::iter::once(Bytes::from_static(b"]}"))),
    )
    .map(Ok::<_, std::io::Error>);
    ([("content-type", "application/json")], Body::from_stream(body)).into_response()
}

async fn resolve(
    State(state): State<Arc<HubState>>,
    Path((org, name, rev, file)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{org}/{name}");
    log(&state, &method, format!("/{repo}/resolve/{rev}/{file}"), &headers);
    let commit = commit_of(&repo);
    let Ok(bytes) = std::fs::read(state.root.join(&repo).join(&file)) else {
        return not_found("EntryNotFound", &format!("{file} does not exist on \"{rev}\""));
    };
    if rev != "main" && rev != commit {
        return not_found("RevisionNotFound", "Invalid rev id");
    }
    let etag = etag_of(&file, &bytes);
    if is_lfs(&file) {
        let location = format!("{}/cdn/{repo}/{file}", state.cdn);
        return (
            StatusCode::FOUND,
            [
                ("location", location),
                ("x-linked-etag", format!("\"{etag}\"")),
                ("x-linked-size", bytes.len().to_string()),
                ("x-repo-commit", commit),
                ("etag", "\"not-the-blob\"".to_string()),
            ],
        )
            .into_response();
    }
    serve(&state, &method, &headers, &file, bytes, &etag, Some(&commit)).await
}

async fn cdn(
    State(state): State<Arc<HubState>>,
    Path((org, name, file)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{org}/{name}");
    log(&state, &method, format!("/cdn/{repo}/{file}"), &headers);
    let Ok(bytes) = std::fs::read(state.root.join(&repo).join(&file)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let etag = etag_of(&file, &bytes);
    serve(&state, &method, &headers, &file, bytes, &etag, None).await
}

async fn serve(
    state: &HubState,
    method: &Method,
    headers: &HeaderMap,
    file: &str,
    bytes: Vec<u8>,
    etag: &str,
    commit: Option<&str>,
) -> Response {
    let total = bytes.len();
    let start = headers.get("range").and_then(|v| v.to_str().ok()?.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
    let mut out = HeaderMap::new();
    out.insert("etag", format!("\"{etag}\"").parse().unwrap());
    out.insert("accept-ranges", "bytes".parse().unwrap());
    if let Some(commit) = commit {
        out.insert("x-repo-commit", commit.parse().unwrap());
    }
    let (status, body) = match start {
        Some(s) if s >= total => {
            out.insert("content-range", format!("bytes */{total}").parse().unwrap());
            return (StatusCode::RANGE_NOT_SATISFIABLE, out).into_response();
        }
        Some(s) => {
            out.insert("content-range", format!("bytes {s}-{}/{total}", total - 1).parse().unwrap());
            (StatusCode::PARTIAL_CONTENT, bytes[s..].to_vec())
        }
        None => (StatusCode::OK, bytes),
    };
    out.insert("content-length", body.len().to_string().parse().unwrap());
    if method == Method::HEAD {
        return (status, out).into_response();
    }
    let mut hold = state.hold.subscribe();
    let stall = state.stall.lock().unwrap().remove(file);
    if let Some(after) = stall {
        let hold = state.stalled.subscribe();
        let first = Bytes::copy_from_slice(&body[..after.min(body.len())]);
        let rest = Bytes::copy_from_slice(&body[after.min(body.len())..]);
        let stream = futures::stream::unfold(0u8, move |step| {
            let (first, rest, mut hold) = (first.clone(), rest.clone(), hold.clone());
            async move {
                match step {
                    0 => Some((Ok::<_, std::io::Error>(first), 1)),
                    1 => {
                        let _ = hold.wait_for(|held| !*held).await;
                        Some((Ok(rest), 2))
                    }
                    _ => None,
                }
            }
        });
        return (status, out, Body::from_stream(stream)).into_response();
    }
    let _ = hold.wait_for(|held| !*held).await;
    let cut = state.cut.lock().unwrap().remove(file);
    let body = match cut {
        // The connection dies after `after` bytes: sent, flushed (the stream pauses once, so
        // hyper writes them out), then an error that aborts the response.
        Some(after) => {
            let first = Bytes::copy_from_slice(&body[..after.min(body.len())]);
            let stream = futures::stream::unfold(0u8, move |step| {
                let first = first.clone();
                async move {
                    match step {
                        0 => Some((Ok(first), 1)),
                        1 => {
                            tokio::task::yield_now().await;
                            Some((Err(std::io::Error::other("connection cut by the test")), 2))
                        }
                        _ => None,
                    }
                }
            });
            Body::from_stream(stream)
        }
        None => Body::from(body),
    };
    (status, out, body).into_response()
}
