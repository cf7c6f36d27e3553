//! `POST /api/pull` over mlxbar's Hugging Face pull (`crate::library::pull`): the model is a
//! hub repo id (`org/name`, optionally with Ollama's `hf.co/` prefix and the `:latest` tag;
//! other tags pick nothing here and are refused). Progress comes as Ollama's NDJSON lines:
//! `{"status": "pulling manifest"}`, `{"status": "downloading <file>", "digest", "total",
//! "completed"}` as bytes arrive, `{"status": "success"}` once the library has the model, or
//! an `{"error": …}` line. `stream: false` answers `{"status": "success"}` (or the error)
//! once the pull ended. The pull runs on its own thread; a client that leaves does not stop
//! it (`DELETE /api/models/pulls/{id}` does).
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::request::PullRequest;
use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::library::pull::{PullOptions, PullProgress, PullState, Pulls};

/// How often the pull's progress is read for the next line.
const TICK: Duration = Duration::from_millis(200);

/// The hub repo an Ollama model name stands for.
pub fn repo_of(name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    let name = name.strip_prefix("hf.co/").or_else(|| name.strip_prefix("huggingface.co/")).unwrap_or(name);
    let repo = match name.rsplit_once(':') {
        Some((repo, "latest")) => repo,
        Some((_, tag)) => {
            return Err(ApiError::bad_request(format!(
                "model: the tag ':{tag}' names nothing on Hugging Face; send the repo id (org/name), or POST /api/models/pull with its \"file\" for one GGUF of a repo"
            )))
        }
        None => name,
    };
    Ok(repo.to_string())
}

fn line(v: Value) -> Bytes {
    let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Where the pull is, as Ollama says it; nothing while nothing changed since `last`. A
/// finished pull reports its bytes one last time (when they moved since the last line), so
/// a client's bar reaches its end even when the files came faster than a tick.
fn status(p: &PullProgress, last: Option<&PullProgress>) -> Vec<Value> {
    let moved = last.is_none_or(|l| (l.bytes_done, &l.file, l.bytes_total) != (p.bytes_done, &p.file, p.bytes_total));
    let progress =
        |name: &str| json!({"status": format!("downloading {name}"), "digest": name, "total": p.bytes_total, "completed": p.bytes_done});
    match p.state {
        PullState::Done if moved && p.bytes_total.is_some() => vec![progress(&p.repo), json!({"status": "success"})],
        PullState::Done => vec![json!({"status": "success"})],
        PullState::Failed => vec![json!({"error": p.error.clone().unwrap_or_else(|| "the pull failed".into())})],
        PullState::Cancelled => vec![json!({"error": "the pull was cancelled"})],
        PullState::Running => p.file.as_deref().filter(|_| moved).map(progress).into_iter().collect(),
    }
}

/// The pull's progress until it ends (its record gone counts as an end).
async fn next(pulls: &Pulls, id: &str, last: Option<&PullProgress>) -> (Vec<Value>, Option<PullProgress>) {
    loop {
        let Some(p) = pulls.get(id) else { return (vec![json!({"error": "the pull's record is gone"})], None) };
        let out = status(&p, last);
        match (p.state == PullState::Running, out.is_empty()) {
            (true, true) => tokio::time::sleep(TICK).await,
            (true, false) => return (out, Some(p)),
            (false, _) => return (out, None),
        }
    }
}

pub async fn pull(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<PullRequest>) -> Result<Response, ApiError> {
    if req.insecure == Some(true) {
        return Err(ApiError::bad_request("insecure: mlxbar pulls over the hub's own TLS (HF_ENDPOINT says where); leave insecure out"));
    }
    let name = req.model.or(req.name).ok_or_else(|| ApiError::bad_request("model is required"))?;
    let opts = PullOptions::from_env(&repo_of(&name)?);
    let started = state.pulls.start(opts, state.config.max_concurrent_pulls).map_err(crate::api::pull::refused)?;
    let id = started.id.clone().unwrap_or_default();
    let pulls = state.pulls.clone();
    if !req.stream {
        let mut last = None;
        loop {
            let (lines, progress) = next(&pulls, &id, last.as_ref()).await;
            if progress.is_none() {
                return match lines.into_iter().last() {
                    Some(v) if v.get("error").is_some() => {
                        let mut e = ApiError::bad_request(v["error"].as_str().unwrap_or("the pull failed"));
                        e.status = StatusCode::BAD_GATEWAY;
                        Err(e)
                    }
                    _ => Ok(axum::Json(json!({"status": "success"})).into_response()),
                };
            }
            last = progress;
        }
    }
    let first = stream::iter([line(json!({"status": "pulling manifest"}))]);
    let rest = stream::unfold(Some(None), move |last: Option<Option<PullProgress>>| {
        let (pulls, id) = (pulls.clone(), id.clone());
        async move {
            let last = last?;
            let (lines, progress) = next(&pulls, &id, last.as_ref()).await;
            Some((lines, progress.map(Some)))
        }
    });
    let body = first.chain(rest.flat_map(|lines| stream::iter(lines.into_iter().map(line)))).map(Ok::<_, std::convert::Infallible>);
    Ok(([(header::CONTENT_TYPE, super::stream::CONTENT_TYPE)], Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_names_map_to_repo_ids() {
        assert_eq!(repo_of("hf.co/org/name:latest").unwrap(), "org/name");
        assert_eq!(repo_of("org/name").unwrap(), "org/name");
        assert!(repo_of("org/name:Q4_K_M").is_err());
    }
}
