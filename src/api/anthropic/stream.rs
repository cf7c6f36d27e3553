//! Answers as Anthropic's named server-sent events: `message_start` (the message with no
//! content yet), `ping`, then per content block `content_block_start`, its deltas
//! (`thinking_delta` of a reasoning model's thinking, `text_delta`, or `input_json_delta`
//! pieces of a call's input) and `content_block_stop`,
//! then `message_delta` (stop reason, usage) and `message_stop`. An error mid-stream is an
//! `error` event.
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use super::response::{message_id, stop_reason, tool_use_id, usage};
use crate::inference::{Generation, Output};

fn event(name: &str, data: Value) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

/// What the open content block holds (a call's block is closed by the next call or the end).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    None,
    Thinking,
    Text,
    Call,
}

/// Where the stream is: the index of the open content block, if any, and of the next one.
struct Blocks {
    open: Option<usize>,
    next: usize,
}

impl Blocks {
    /// Events that close the open block (if any) and open a new one with `block`.
    fn start(&mut self, block: Value) -> Vec<SseEvent> {
        let mut out = self.stop();
        let index = self.next;
        self.next += 1;
        self.open = Some(index);
        out.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": block})));
        out
    }

    fn stop(&mut self) -> Vec<SseEvent> {
        self.open
            .take()
            .map(|index| event("content_block_stop", json!({"type": "content_block_stop", "index": index})))
            .into_iter()
            .collect()
    }
}

pub fn sse(generation: Generation) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": message_id(), "type": "message", "role": "assistant", "model": generation.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }}),
    );
    let opening = [start, event("ping", json!({"type": "ping"}))];
    let state = (generation, Blocks { open: None, next: 0 }, Kind::None, false);
    let body = stream::unfold(state, |(mut generation, mut blocks, mut kind, ended)| async move {
        if ended {
            return None;
        }
        let delta = |index: usize, delta: Value| {
            event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}))
        };
        let (events, ended) = match generation.next().await {
            Some(Ok(Output::Text { text, .. })) if text.is_empty() => (vec![], false),
            Some(Ok(Output::Reasoning { text })) => {
                let mut out = vec![];
                if kind != Kind::Thinking {
                    out = blocks.start(json!({"type": "thinking", "thinking": "", "signature": ""}));
                    kind = Kind::Thinking;
                }
                out.push(delta(blocks.open.unwrap_or_default(), json!({"type": "thinking_delta", "thinking": text})));
                (out, false)
            }
            Some(Ok(Output::Text { text, .. })) => {
                let mut out = vec![];
                if kind != Kind::Text {
                    out = blocks.start(json!({"type": "text", "text": ""}));
                    kind = Kind::Text;
                }
                out.push(delta(blocks.open.unwrap_or_default(), json!({"type": "text_delta", "text": text})));
                (out, false)
            }
            Some(Ok(Output::ToolCallStart { id, name, .. })) => {
                kind = Kind::Call;
                (blocks.start(json!({"type": "tool_use", "id": tool_use_id(&id), "name": name, "input": {}})), false)
            }
            Some(Ok(Output::ToolCallArguments { fragment, .. })) => {
                (vec![delta(blocks.open.unwrap_or_default(), json!({"type": "input_json_delta", "partial_json": fragment}))], false)
            }
            Some(Ok(Output::Done { finish, usage: u })) => {
                let mut out = blocks.stop();
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(finish, &u), "stop_sequence": u.stop_sequence}, "usage": usage(&u)}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
                (out, true)
            }
            Some(Err(e)) => (vec![event("error", super::errors::body(&e))], true),
            None => (vec![], true),
        };
        Some((events, (generation, blocks, kind, ended)))
    });
    let body = stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok);
    Sse::new(body).keep_alive(KeepAlive::default())
}
