//! A streaming OpenAI client that times one chat completion: time to first token and the
//! decode rate after it, plus the Predicted Outputs counts where the server reports them.
//! Works against any OpenAI-compatible server; an HTTP error comes back as [`HttpStatus`].
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Target {
    pub label: String,
    /// Base URL, e.g. `http://127.0.0.1:8080` (a trailing `/v1` is accepted).
    pub base_url: String,
    pub model: String,
}

impl Target {
    /// `[LABEL=]URL[#MODEL]`.
    pub fn parse(spec: &str) -> Result<Target> {
        let (label, rest) = match spec.split_once('=') {
            Some((l, r)) if !l.contains("://") => (Some(l.to_string()), r),
            _ => (None, spec),
        };
        let (url, model) = match rest.split_once('#') {
            Some((u, m)) => (u, m.to_string()),
            None => (rest, "default".to_string()),
        };
        if !url.starts_with("http://") && !url.starts_with("https://") {
            bail!("'{spec}' is not [LABEL=]http://HOST:PORT[#MODEL]");
        }
        let base_url = url.trim_end_matches('/').trim_end_matches("/v1").to_string();
        Ok(Target { label: label.unwrap_or_else(|| base_url.clone()), base_url, model })
    }
}

#[derive(Debug, Clone)]
pub struct RunTiming {
    pub ttft: Duration,
    pub completion_tokens: usize,
    /// As the server counted them (None when it sends no usage in streams).
    pub prompt_tokens: Option<usize>,
    /// Tokens after the first, per second of streaming after the first.
    pub decode_tok_s: f64,
    pub total: Duration,
    /// Gaps between streamed chunks after the first (inter-token latency samples).
    pub gaps: Vec<Duration>,
    /// `usage.completion_tokens_details.{accepted,rejected}_prediction_tokens`, when the
    /// server reports them (a request with a `prediction` on a server that takes it).
    pub accepted_prediction_tokens: Option<usize>,
    pub rejected_prediction_tokens: Option<usize>,
    /// The server refused the request's `prediction` (HTTP 400/422), so it was sent again
    /// without one: these figures are of that request.
    pub prediction_refused: bool,
}

/// A non-success answer, kept apart so a caller can tell a refused request from a failure.
#[derive(Debug, thiserror::Error)]
#[error("{label}: HTTP {status}: {body}")]
pub struct HttpStatus {
    pub label: String,
    pub status: u16,
    pub body: String,
}

/// One streamed, greedy chat completion.
pub async fn timed_chat(client: &reqwest::Client, t: &Target, messages: &Value, max_tokens: usize) -> Result<RunTiming> {
    timed_chat_predicted(client, t, messages, max_tokens, None).await
}

/// [`timed_chat`] with `prediction` as the request's Predicted Outputs field
/// (`{"type": "content", "content": ...}`) when given.
pub async fn timed_chat_predicted(
    client: &reqwest::Client,
    t: &Target,
    messages: &Value,
    max_tokens: usize,
    prediction: Option<&Value>,
) -> Result<RunTiming> {
    let mut body = json!({
        "model": t.model, "messages": messages, "max_tokens": max_tokens,
        "temperature": 0.0, "stream": true, "stream_options": {"include_usage": true},
    });
    if let Some(p) = prediction {
        body["prediction"] = p.clone();
    }
    let start = Instant::now();
    let resp = client
        .post(format!("{}/v1/chat/completions", t.base_url))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("POST to {}", t.label))?;
    if !resp.status().is_success() {
        let status = resp.status().as_u16();
        return Err(HttpStatus { label: t.label.clone(), status, body: resp.text().await.unwrap_or_default() }.into());
    }
    read_timed_stream(&t.label, resp.bytes_stream(), start).await
}

/// Times a completion's SSE body (any byte stream: a response, or a test's bytes), parsed
/// by eventsource-stream: LF or CRLF line ends, multi-line `data:`, comments.
async fn read_timed_stream<S, B, E>(label: &str, body: S, start: Instant) -> Result<RunTiming>
where
    S: futures::Stream<Item = std::result::Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Display + std::fmt::Debug + Send + Sync + 'static,
{
    let mut events = body.eventsource();
    let (mut first, mut last, mut chunks, mut usage_tokens, mut prompt_tokens) = (None, None::<Instant>, 0usize, None, None);
    let (mut accepted, mut rejected) = (None, None);
    let mut gaps = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.with_context(|| format!("{label}: reading the stream"))?;
        let data = event.data.trim();
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).with_context(|| format!("{label}: bad chunk {data}"))?;
        if let Some(n) = v.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            usage_tokens = Some(n as usize);
        }
        if let Some(n) = v.pointer("/usage/prompt_tokens").and_then(Value::as_u64) {
            prompt_tokens = Some(n as usize);
        }
        let details = |key: &str| v.pointer(&format!("/usage/completion_tokens_details/{key}")).and_then(Value::as_u64);
        accepted = details("accepted_prediction_tokens").map(|n| n as usize).or(accepted);
        rejected = details("rejected_prediction_tokens").map(|n| n as usize).or(rejected);
        let content = v.pointer("/choices/0/delta/content").and_then(Value::as_str).unwrap_or("");
        if !content.is_empty() {
            let now = Instant::now();
            first.get_or_insert(now);
            if let Some(prev) = last {
                gaps.push(now - prev);
            }
            last = Some(now);
            chunks += 1;
        }
    }
    let (Some(first), Some(last)) = (first, last) else { bail!("{label}: no tokens streamed") };
    // Servers that send no usage in streams (llama-cpp-python) send one chunk per token.
    let tokens = usage_tokens.unwrap_or(chunks).max(chunks);
    let decode = (last - first).as_secs_f64();
    Ok(RunTiming {
        ttft: first - start,
        completion_tokens: tokens,
        prompt_tokens,
        decode_tok_s: if decode > 0.0 { (tokens.saturating_sub(1)) as f64 / decode } else { 0.0 },
        total: start.elapsed(),
        gaps,
        accepted_prediction_tokens: accepted,
        rejected_prediction_tokens: rejected,
        prediction_refused: false,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{read_timed_stream, Target};

    /// Feeds `parts` as a body's byte chunks.
    fn body(parts: &[&'static str]) -> impl futures::Stream<Item = Result<&'static [u8], std::convert::Infallible>> + Unpin {
        futures::stream::iter(parts.iter().map(|p| Ok(p.as_bytes())).collect::<Vec<_>>())
    }

    #[test]
    fn parses_target_specs() {
        let t = Target::parse("llama.cpp=http://127.0.0.1:8081/v1#smollm2").unwrap();
        assert_eq!((t.label.as_str(), t.base_url.as_str(), t.model.as_str()), ("llama.cpp", "http://127.0.0.1:8081", "smollm2"));
        let t = Target::parse("http://127.0.0.1:9000/").unwrap();
        assert_eq!((t.label.as_str(), t.model.as_str()), ("http://127.0.0.1:9000", "default"));
        assert!(Target::parse("localhost:9000").is_err());
    }

    #[tokio::test]
    async fn reads_crlf_events_and_multi_line_data() {
        // CRLF line ends, an event split across chunks, a comment, and a chunk whose JSON
        // spans two `data:` lines (joined with a newline, which JSON takes as whitespace).
        let parts = [
            ": keep-alive\r\n\r\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r",
            "\ndata: {\"choices\":[{\"delta\":\r\ndata: {\"content\":\"lo\"}}]}\r\n\r\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\r\n\r\n",
        ];
        let t = read_timed_stream("test", body(&parts), Instant::now()).await.unwrap();
        assert_eq!((t.completion_tokens, t.prompt_tokens, t.gaps.len()), (2, Some(9), 1));
        // gaps.len() == 1: both content chunks were seen, though neither ended in "\n\n"
        // and one split its JSON over two lines.
        assert_eq!((t.accepted_prediction_tokens, t.rejected_prediction_tokens), (None, None), "no details: not reported");
    }

    #[tokio::test]
    async fn reads_predicted_outputs_counts_from_usage() {
        let parts = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"a = 1\\nb\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" = 2\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":7,\"completion_tokens_details\":{\"accepted_prediction_tokens\":5,\"rejected_prediction_tokens\":1}}}\n\n",
            "data: [DONE]\n\n",
        ];
        let t = read_timed_stream("test", body(&parts), Instant::now()).await.unwrap();
        assert_eq!((t.completion_tokens, t.accepted_prediction_tokens, t.rejected_prediction_tokens), (7, Some(5), Some(1)));
    }

    #[test]
    fn https_targets_get_past_the_client_builder() {
        // reqwest is built with rustls: an https URL is a connection attempt (refused here,
        // nothing listens on the port), not a scheme the client cannot speak.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t = Target::parse(&format!("https://127.0.0.1:{port}")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = rt.block_on(reqwest::Client::new().get(format!("{}/v1/models", t.base_url)).send()).unwrap_err();
        // Without TLS the connector refuses the scheme itself ("invalid URL, scheme is not
        // http"), also a connect error: only a refused TCP connection shows it tried.
        let mut source: Option<&dyn std::error::Error> = Some(&err);
        let refused = std::iter::from_fn(|| {
            let e = source?;
            source = e.source();
            Some(e)
        })
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused));
        assert!(err.is_connect() && refused, "{err:?}");
    }
}
