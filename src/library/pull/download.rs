//! The hub's HTTP file API, and one blob's download: appended to `<etag>.incomplete`,
//! resumed with `Range` (after a dropped connection, within a pull or by the next one),
//! checked against the size (and the sha256 when the ETag is one, as for LFS files), then
//! renamed into place. Only the hub's own host gets the token: reqwest drops
//! `Authorization` when a redirect leaves for another host (the hub's CDN); and over plain
//! http only a loopback host does, unless the user opted in ([`token_policy`]).
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE, ETAG, RANGE};
use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use super::layout::partial_path;
use super::{Remote, TOKEN_OVER_HTTP};

/// Tries per file without progress before giving up (a try that moved bytes resets it).
const ATTEMPTS: u32 = 5;

pub struct Hub {
    endpoint: Url,
    token: Option<String>,
    client: reqwest::Client,
    /// HEAD without leaving the hub: the CDN redirect carries the blob's name and size.
    head_client: reqwest::Client,
}

pub struct ModelInfo {
    pub sha: Option<String>,
    pub files: Vec<String>,
}

pub struct Head {
    pub etag: String,
    pub size: u64,
    pub commit: Option<String>,
}

#[derive(serde::Deserialize)]
struct InfoJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(serde::Deserialize)]
struct Sibling {
    rfilename: String,
}

/// Whether the token may go to `endpoint`, and what to tell the user: over https, yes;
/// over plain http to a loopback host (a local mirror), yes, with a warning; beyond
/// loopback only with `over_http` (the opt-in), else it is not sent (a warning says so).
pub fn token_policy(endpoint: &Url, token: Option<String>, over_http: bool) -> (Option<String>, Option<String>) {
    let token = token.filter(|t| !t.is_empty());
    if token.is_none() || endpoint.scheme() != "http" {
        return (token, None);
    }
    let host = endpoint.host_str().unwrap_or_default().to_string();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.parse::<std::net::IpAddr>().map_or(bare.eq_ignore_ascii_case("localhost"), |ip| ip.is_loopback());
    if loopback {
        (token, Some(format!("HF_TOKEN is sent over plain http to {host}, a loopback address (it does not leave this machine)")))
    } else if over_http {
        (token, Some(format!("HF_TOKEN is sent over plain http to {host} ({TOKEN_OVER_HTTP}=1): anyone on the way can read it")))
    } else {
        (None, Some(format!("HF_TOKEN is not sent: HF_ENDPOINT {endpoint} is plain http, where anyone on the way could read it; use https, or set {TOKEN_OVER_HTTP}=1 to send it anyway")))
    }
}

impl Hub {
    /// The hub at `endpoint`, and a warning about the token if there is one to give.
    pub fn new(endpoint: &str, token: Option<String>, token_over_http: bool) -> Result<(Hub, Option<String>)> {
        let endpoint = Url::parse(endpoint.trim_end_matches('/')).with_context(|| format!("HF_ENDPOINT '{endpoint}' is not a URL"))?;
        anyhow::ensure!(matches!(endpoint.scheme(), "http" | "https"), "HF_ENDPOINT '{endpoint}' is not http(s)");
        let (token, warning) = token_policy(&endpoint, token, token_over_http);
        let builder = || {
            reqwest::Client::builder()
                .user_agent(concat!("mlxbar/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(Duration::from_secs(30))
                .read_timeout(Duration::from_secs(60))
        };
        let head_client = builder()
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                // Renamed repos redirect within the hub (followed); the CDN is elsewhere (not).
                let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
                if attempt.previous().len() > 5 {
                    attempt.error("too many redirects")
                } else if same_origin {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()?;
        Ok((Hub { endpoint, token, client: builder().build()?, head_client }, warning))
    }

    fn url(&self, segments: &[&str]) -> Result<Url> {
        let mut url = self.endpoint.clone();
        url.path_segments_mut().map_err(|()| anyhow::anyhow!("HF_ENDPOINT cannot take a path"))?.pop_if_empty().extend(segments);
        Ok(url)
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// `GET /api/models/{repo}/revision/{revision}`: the commit and the file list.
    pub async fn model_info(&self, repo: &str, revision: &str) -> Result<ModelInfo> {
        let mut segments = vec!["api", "models"];
        segments.extend(repo.split('/'));
        segments.extend(["revision", revision]);
        let url = self.url(&segments)?;
        let resp =
            self.auth(self.client.get(url.clone())).send().await.with_context(|| format!("asking {} about {repo}", self.endpoint))?;
        let status = resp.status();
        if !status.is_success() {
            let why = hub_message(resp.headers());
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => anyhow::anyhow!(
                    "{repo} needs access ({status}{why}): set HF_TOKEN to a token that may read it (gated repos: accept the terms on the hub first)"
                ),
                StatusCode::NOT_FOUND => anyhow::anyhow!("no model {repo} at revision '{revision}' on {} ({status}{why})", self.endpoint),
                _ => anyhow::anyhow!("{url} answered {status}{why}"),
            });
        }
        let body = read_capped(resp, MAX_JSON_BYTES).await.with_context(|| format!("reading {url}"))?;
        let info: InfoJson = serde_json::from_slice(&body).with_context(|| format!("reading {url}"))?;
        let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        // Every name the hub sends may become a path: the rule the user's `file` passes.
        for file in &files {
            super::select::check_file_name(file).with_context(|| format!("the hub listed a file of {repo} that mlxbar refuses"))?;
        }
        Ok(ModelInfo { sha: info.sha, files })
    }

    /// `/{repo}/resolve/{revision}/{file}`.
    pub fn resolve_url(&self, repo: &str, revision: &str, file: &str) -> Result<Url> {
        let mut segments: Vec<&str> = repo.split('/').collect();
        segments.extend(["resolve", revision]);
        segments.extend(file.split('/'));
        self.url(&segments)
    }

    /// The blob name and size of one file (`shown_revision` is the one the user named).
    pub async fn head(&self, repo: &str, revision: &str, shown_revision: &str, file: &str) -> Result<Head> {
        let url = self.resolve_url(repo, revision, file)?;
        let resp = self
            .auth(self.head_client.head(url.clone()))
            .send()
            .await
            .with_context(|| format!("asking {} about {repo}/{file}", self.endpoint))?;
        let status = resp.status();
        let headers = resp.headers();
        if status == StatusCode::NOT_FOUND {
            bail!("{file} is missing from {repo} at revision '{shown_revision}' (404 Not Found from {url}{})", hub_message(headers));
        }
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            bail!("{repo}/{file} needs access ({status}{}): set HF_TOKEN to a token that may read it", hub_message(headers));
        }
        if !(status.is_success() || status.is_redirection()) {
            bail!("{url} answered {status}{}", hub_message(headers));
        }
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
        let etag = header("x-linked-etag")
            .or_else(|| header(ETAG.as_str()))
            .map(normalize_etag)
            .with_context(|| format!("the hub sent no ETag for {repo}/{file}"))?;
        // The blob's name becomes a path: the hub's are hex (git oid or sha256).
        anyhow::ensure!(
            !etag.is_empty() && etag.len() <= 128 && etag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "the hub sent '{etag}' as the ETag of {repo}/{file}, which cannot name a blob"
        );
        let size = header("x-linked-size")
            .or_else(|| header(CONTENT_LENGTH.as_str()))
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("the hub sent no size for {repo}/{file}"))?;
        let commit = header("x-repo-commit").map(str::to_string);
        Ok(Head { etag, size, commit })
    }
}

/// The most a JSON answer of the hub may weigh: the largest repos' file lists are a few MB.
pub const MAX_JSON_BYTES: usize = 16 << 20;

/// The body, refused once it passes `cap` bytes (checked as it streams, never held whole).
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>> {
    let too_big = || anyhow::anyhow!("the hub's answer is larger than the {} MB cap for its JSON", cap >> 20);
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > cap {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The hub's own explanation (`X-Error-Message`), as ": <message>".
fn hub_message(headers: &HeaderMap) -> String {
    headers.get("x-error-message").and_then(|v| v.to_str().ok()).map(|m| format!(": {m}")).unwrap_or_default()
}

/// `W/"abc"` and `"abc"` -> `abc`.
fn normalize_etag(raw: &str) -> String {
    raw.trim_start_matches("W/").trim_matches('"').to_string()
}

fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.chars().all(|c| c.is_ascii_hexdigit())
}

/// Downloads `remote` into `blob`, through its partial; `on_bytes(have)` as bytes land.
#[allow(clippy::too_many_arguments)]
pub async fn fetch_blob(
    hub: &Hub,
    url: Url,
    blob: &Path,
    remote: &Remote,
    shown_revision: &str,
    repo: &str,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<()> {
    let partial = partial_path(blob);
    let mut file = open_partial(&partial)?;
    lock(&file).map_err(|_| anyhow::anyhow!("another process is downloading {repo}/{} ({} is locked)", remote.file, partial.display()))?;
    let mut have = file.metadata()?.len();
    if have > remote.size {
        file.set_len(0)?;
        have = 0;
    }
    let verify = is_sha256(&remote.etag);
    let mut hasher = Sha256::new();
    if verify && have > 0 {
        // Resuming: the bytes already here go into the checksum first.
        file.rewind()?;
        let mut reader = (&file).take(have);
        std::io::copy(&mut reader, &mut HashWriter(&mut hasher))?;
    }
    file.seek(std::io::SeekFrom::Start(have))?;
    on_bytes(have);

    let mut failures = 0;
    let mut last_error: Option<anyhow::Error> = None;
    while have < remote.size {
        if failures >= ATTEMPTS {
            let e = last_error.unwrap_or_else(|| anyhow::anyhow!("no progress"));
            return Err(
                e.context(format!("downloading {repo}/{} stopped at {have} of {} bytes; pull again to resume", remote.file, remote.size))
            );
        }
        if failures > 0 {
            tokio::time::sleep(Duration::from_millis(200 << failures.min(4))).await;
        }
        let mut req = hub.auth(hub.client.get(url.clone()));
        if have > 0 {
            req = req.header(RANGE, format!("bytes={have}-"));
        }
        let mut resp = match req.send().await {
            Ok(resp) => resp,
            Err(e) => {
                failures += 1;
                last_error = Some(e.into());
                continue;
            }
        };
        let status = resp.status();
        match status {
            StatusCode::PARTIAL_CONTENT => {
                let start = resp.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).and_then(range_start);
                if start != Some(have) {
                    // Not the range asked for: start the file over.
                    restart(&mut file, &mut hasher, &mut have)?;
                    failures += 1;
                    continue;
                }
            }
            StatusCode::OK => {
                if have > 0 {
                    // The server ignored the Range: the body is the whole file.
                    restart(&mut file, &mut hasher, &mut have)?;
                }
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                restart(&mut file, &mut hasher, &mut have)?;
                failures += 1;
                continue;
            }
            StatusCode::NOT_FOUND => {
                bail!("{} is missing from {repo} at revision '{shown_revision}' (404 Not Found from {url})", remote.file)
            }
            s if s.is_client_error() => bail!("downloading {repo}/{}: {url} answered {s}{}", remote.file, hub_message(resp.headers())),
            s => {
                failures += 1;
                last_error = Some(anyhow::anyhow!("{url} answered {s}"));
                continue;
            }
        }
        on_bytes(have);
        let before = have;
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if have + chunk.len() as u64 > remote.size {
                        restart(&mut file, &mut hasher, &mut have)?;
                        bail!("{url} sent more than the {} bytes the hub announced for {}", remote.size, remote.file);
                    }
                    file.write_all(&chunk).with_context(|| format!("writing {}", partial.display()))?;
                    if verify {
                        hasher.update(&chunk);
                    }
                    have += chunk.len() as u64;
                    on_bytes(have);
                }
                Ok(None) => break,
                Err(e) => {
                    last_error = Some(e.into());
                    break;
                }
            }
        }
        if have > before {
            failures = 0;
        }
        if have < remote.size {
            failures += 1;
        }
    }
    file.sync_all()?;
    if verify {
        let got = hex::encode(hasher.finalize());
        if got != remote.etag {
            drop(file);
            let _ = std::fs::remove_file(&partial);
            bail!("{repo}/{} arrived corrupted (sha256 {got}, the hub says {}); pull again", remote.file, remote.etag);
        }
    }
    std::fs::rename(&partial, blob).with_context(|| format!("moving {} into place", blob.display()))?;
    Ok(())
}

/// `bytes 100-199/200` -> 100.
fn range_start(content_range: &str) -> Option<u64> {
    content_range.trim().strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

fn restart(file: &mut std::fs::File, hasher: &mut Sha256, have: &mut u64) -> Result<()> {
    file.set_len(0)?;
    file.rewind()?;
    *hasher = Sha256::new();
    *have = 0;
    Ok(())
}

/// The partial blob, user-only, opened to append to (and read, to checksum what is there).
fn open_partial(path: &Path) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).with_context(|| format!("opening {}", path.display()))
}

/// An exclusive advisory lock, so two pulls (the CLI and the server) never append to the same
/// partial; released when the file closes.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn lock(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock takes a file descriptor, which `file` keeps open for the whole call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn lock(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_and_ranges_parse_as_the_hub_sends_them() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(range_start("bytes 100-199/200"), Some(100));
        assert_eq!(range_start("bytes */200"), None);
        assert!(is_sha256(&"a".repeat(64)) && !is_sha256(&"a".repeat(40)));
    }

    #[test]
    fn urls_encode_what_would_change_their_meaning() {
        let hub = Hub::new("http://127.0.0.1:9/mirror/", None, false).unwrap().0;
        assert_eq!(
            hub.resolve_url("org/name", "refs/pr/1", "q/a b.gguf").unwrap().as_str(),
            "http://127.0.0.1:9/mirror/org/name/resolve/refs%2Fpr%2F1/q/a%20b.gguf"
        );
        assert!(Hub::new("ftp://x", None, false).is_err());
    }

    #[test]
    fn the_token_goes_in_clear_only_to_loopback_or_when_asked() {
        let policy = |url: &str, over_http: bool| token_policy(&Url::parse(url).unwrap(), Some("hf_x".into()), over_http);
        assert_eq!(policy("https://huggingface.co", false), (Some("hf_x".into()), None));
        let (sent, warning) = policy("http://mirror.example:8080", false);
        assert_eq!(sent, None, "not sent in clear beyond loopback");
        let warning = warning.unwrap();
        assert!(warning.contains("not sent") && warning.contains(TOKEN_OVER_HTTP), "{warning}");
        let (sent, warning) = policy("http://mirror.example:8080", true);
        assert_eq!(sent.as_deref(), Some("hf_x"), "the opt-in sends it");
        assert!(warning.unwrap().contains("anyone on the way can read it"));
        for local in ["http://127.0.0.1:9", "http://[::1]:9", "http://localhost:9"] {
            let (sent, warning) = policy(local, false);
            assert_eq!(sent.as_deref(), Some("hf_x"), "{local}");
            assert!(warning.unwrap().contains("loopback"), "{local}");
        }
        assert_eq!(token_policy(&Url::parse("http://mirror.example").unwrap(), None, false), (None, None), "no token, nothing to say");
        let (hub, warning) = Hub::new("http://mirror.example", Some("hf_x".into()), false).unwrap();
        assert!(hub.token.is_none() && warning.is_some());
    }
}
