//! Answers as OpenAI's server-sent events: chat opens with the assistant role, then one
//! chunk per text delta (content, with its logprobs), reasoning delta (`reasoning_content`) or tool-call delta (the call's index, id
//! and name first, then pieces of its arguments), a last chunk with the finish reason, the
//! usage chunk if asked, and `[DONE]`. An error mid-stream is an error object, then `[DONE]`.
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use super::response::{chat_logprobs, completion_logprobs, finish_reason, Endpoint, ResponseMeta};
use crate::inference::{Generation, Output};

pub fn sse(
    meta: ResponseMeta,
    generation: Generation,
    include_usage: bool,
    logprobs: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |v: Value| SseEvent::default().data(v.to_string());
    let opening = (meta.endpoint == Endpoint::Chat).then(|| {
        data(meta.chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
            include_usage,
        ))
    });
    // Bytes of completion text sent so far (the legacy logprobs' text_offset).
    let state = (generation, meta, 0usize, false);
    let body = stream::unfold(state, move |(mut generation, meta, mut offset, ended)| async move {
        if ended {
            return None;
        }
        let done_marker = || SseEvent::default().data("[DONE]");
        let chunk = |delta: Value, lp: Value, finish: Value| match meta.endpoint {
            Endpoint::Chat => meta.chunk(json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}), include_usage),
            Endpoint::Completions => {
                let text = delta.get("content").cloned().unwrap_or(json!(""));
                meta.chunk(json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}), include_usage)
            }
        };
        let (events, ended) = match generation.next().await {
            Some(Ok(Output::Text { text, logprobs: lps })) => {
                let lp = match (logprobs, meta.endpoint) {
                    (false, _) => Value::Null,
                    (true, Endpoint::Chat) => chat_logprobs(&lps),
                    (true, Endpoint::Completions) => completion_logprobs(&lps, offset),
                };
                offset += text.len();
                (vec![data(chunk(json!({"content": text}), lp, Value::Null))], false)
            }
            // vLLM's and llama.cpp's field for a reasoning model's thinking (only chat has it).
            Some(Ok(Output::Reasoning { text })) => {
                (vec![data(chunk(json!({"reasoning_content": text}), Value::Null, Value::Null))], false)
            }
            Some(Ok(Output::ToolCallStart { index, id, name })) => {
                let call = json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}});
                (vec![data(chunk(json!({"tool_calls": [call]}), Value::Null, Value::Null))], false)
            }
            Some(Ok(Output::ToolCallArguments { index, fragment })) => {
                let call = json!({"index": index, "function": {"arguments": fragment}});
                (vec![data(chunk(json!({"tool_calls": [call]}), Value::Null, Value::Null))], false)
            }
            Some(Ok(Output::Done { finish, usage })) => {
                let mut out = vec![data(chunk(json!({}), Value::Null, json!(finish_reason(finish))))];
                if include_usage {
                    out.push(data(meta.usage_chunk(&usage)));
                }
                out.push(done_marker());
                (out, true)
            }
            Some(Err(e)) => (vec![data(e.body()), done_marker()], true),
            None => (vec![done_marker()], true),
        };
        Some((events, (generation, meta, offset, ended)))
    });
    let body = stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok);
    Sse::new(body).keep_alive(KeepAlive::default())
}
