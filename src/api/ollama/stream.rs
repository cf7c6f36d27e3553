//! Answers as Ollama streams them: `application/x-ndjson`, one JSON object per line, each
//! a piece of the text (`done: false`), the model's tool calls in one object once they are
//! whole (Ollama's calls carry parsed arguments, so they are not streamed piecewise), then
//! the final object (`done: true`, `done_reason`, counts and durations). An error mid-stream
//! is an `{"error": "…"}` line, which Ollama's clients raise.
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::response::{chunk, finish, with_thinking, Clock, Shape};
use crate::engine::tools::ToolCall;
use crate::inference::{Generation, Output};

pub const CONTENT_TYPE: &str = "application/x-ndjson";

fn line(v: Value) -> Bytes {
    let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// One object as a whole NDJSON answer (`stream: true` answers that have one line).
pub fn single(v: Value) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], Body::from(line(v))).into_response()
}

pub fn ndjson(generation: Generation, shape: Shape, model: String, clock: Clock) -> Response {
    // The calls begun so far (sent whole at the end), and whether the stream has ended.
    let state = (generation, Vec::<ToolCall>::new(), false);
    let body = stream::unfold(state, move |(mut generation, mut calls, ended)| {
        let model = model.clone();
        async move {
            if ended {
                return None;
            }
            let (lines, ended) = match generation.next().await {
                Some(Ok(Output::Text { text, logprobs })) if text.is_empty() && logprobs.is_empty() => (vec![], false),
                Some(Ok(Output::Text { text, logprobs })) => {
                    (vec![line(Value::Object(chunk(shape, &model, &text, &[], &logprobs)))], false)
                }
                Some(Ok(Output::Reasoning { text })) => {
                    let mut o = chunk(shape, &model, "", &[], &[]);
                    with_thinking(&mut o, shape, &text);
                    (vec![line(Value::Object(o))], false)
                }
                Some(Ok(Output::ToolCallStart { id, name, .. })) => {
                    calls.push(ToolCall { id, name, arguments: String::new() });
                    (vec![], false)
                }
                Some(Ok(Output::ToolCallArguments { index, fragment })) => {
                    if let Some(call) = calls.get_mut(index) {
                        call.arguments.push_str(&fragment);
                    }
                    (vec![], false)
                }
                Some(Ok(Output::Done { finish: reason, usage })) => {
                    // A call `num_predict` cut short is not a call.
                    calls.retain(|c| serde_json::from_str::<Value>(&c.arguments).is_ok());
                    let mut out = vec![];
                    if !calls.is_empty() {
                        out.push(line(Value::Object(chunk(shape, &model, "", &calls, &[]))));
                    }
                    let mut last = chunk(shape, &model, "", &[], &[]);
                    finish(&mut last, reason, &usage, clock);
                    out.push(line(Value::Object(last)));
                    (out, true)
                }
                Some(Err(e)) => (vec![line(super::errors::body(&e))], true),
                None => (vec![], true),
            };
            Some((lines, (generation, calls, ended)))
        }
    });
    let body = body.flat_map(stream::iter).map(Ok::<_, Infallible>);
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], Body::from_stream(body)).into_response()
}
