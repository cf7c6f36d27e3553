//! Answers as the Responses API's server-sent events, each named by its `type` and numbered
//! by `sequence_number`: `response.created` and `response.in_progress`; per output item
//! `response.output_item.added`, then for reasoning `response.content_part.added`, the
//! `response.reasoning_text.delta`s, `.done` and `response.content_part.done` (then, when
//! `reasoning.summary` was asked, the `response.reasoning_summary_*` events of its one
//! summary part), for text
//! `response.content_part.added`, the
//! `response.output_text.delta`s, `response.output_text.done` and
//! `response.content_part.done`, for a call the `response.function_call_arguments.delta`s
//! and `.done`; `response.output_item.done`; at the end `response.completed` (or
//! `response.incomplete`) with the whole Response. An error mid-stream is
//! `response.failed`, the Response with its `error`.
use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use super::errors::{response_error, responses_words};
use super::response::{
    call_item, call_item_id, logprobs, message_id, message_item, reasoning_id, reasoning_item, reasoning_part, status, summary_part,
    text_part, usage, Meta,
};
use crate::inference::{Finish, Generation, Output, TextLogprobs};

/// The output item being written.
enum Open {
    Reasoning { id: String, text: String },
    Text { id: String, text: String, logprobs: Vec<TextLogprobs> },
    Call { call_id: String, name: String, arguments: String },
}

/// Where the stream is: the next sequence number, the items finished, the one open.
struct Writer {
    meta: Meta,
    sequence: u64,
    done: Vec<Value>,
    open: Option<Open>,
}

impl Writer {
    fn event(&mut self, kind: &str, mut data: Value) -> SseEvent {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        SseEvent::default().event(kind).data(data.to_string())
    }

    fn lifecycle(&mut self, kind: &str, response: Value) -> SseEvent {
        self.event(kind, json!({"response": response}))
    }

    /// Opens an item at the next output index.
    fn open(&mut self, open: Open) -> Vec<SseEvent> {
        let index = self.done.len();
        let item = match &open {
            Open::Reasoning { id, .. } => reasoning_item(id, "in_progress", vec![]),
            Open::Text { id, .. } => message_item(id, "in_progress", vec![]),
            Open::Call { call_id, name, .. } => call_item(call_id, name, "", "in_progress"),
        };
        let mut out = vec![self.event("response.output_item.added", json!({"output_index": index, "item": item}))];
        let part = match &open {
            Open::Reasoning { id, .. } => Some((id, reasoning_part(""))),
            Open::Text { id, .. } => Some((id, text_part("", self.meta.echo.logprobs.then_some(&[])))),
            Open::Call { .. } => None,
        };
        if let Some((id, part)) = part {
            out.push(
                self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part})),
            );
        }
        self.open = Some(open);
        out
    }

    /// Closes the open item (if any) with `status`, keeping it for the final Response.
    fn close(&mut self, status: &str) -> Vec<SseEvent> {
        let index = self.done.len();
        let (events, item) = match self.open.take() {
            None => return vec![],
            Some(Open::Reasoning { id, text }) => {
                let part = reasoning_part(&text);
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = json!(text);
                let mut part_done = at;
                part_done["part"] = part.clone();
                let mut events =
                    vec![self.event("response.reasoning_text.done", done), self.event("response.content_part.done", part_done)];
                if self.meta.echo.summary && !text.is_empty() {
                    // The summary is the whole text (no summarizer): its events come at once.
                    let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
                    let with = |key: &str, v: Value| {
                        let mut o = at.clone();
                        o[key] = v;
                        o
                    };
                    events.push(self.event("response.reasoning_summary_part.added", with("part", summary_part(""))));
                    events.push(self.event("response.reasoning_summary_text.delta", with("delta", json!(text))));
                    events.push(self.event("response.reasoning_summary_text.done", with("text", json!(text))));
                    events.push(self.event("response.reasoning_summary_part.done", with("part", summary_part(&text))));
                }
                let mut item = reasoning_item(&id, status, vec![part]);
                self.meta.echo.dress_reasoning(&mut item, &text);
                (events, item)
            }
            Some(Open::Text { id, text, logprobs: lps }) => {
                let part = text_part(&text, self.meta.echo.logprobs.then_some(lps.as_slice()));
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = json!(text);
                done["logprobs"] = if self.meta.echo.logprobs { logprobs(&lps) } else { json!([]) };
                let mut part_done = at;
                part_done["part"] = part.clone();
                let events = vec![self.event("response.output_text.done", done), self.event("response.content_part.done", part_done)];
                (events, message_item(&id, status, vec![part]))
            }
            Some(Open::Call { call_id, name, arguments }) => {
                let done = json!({"item_id": call_item_id(&call_id), "output_index": index, "name": name, "arguments": arguments});
                (vec![self.event("response.function_call_arguments.done", done)], call_item(&call_id, &name, &arguments, status))
            }
        };
        let mut events = events;
        events.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
        self.done.push(item);
        events
    }

    fn on(&mut self, out: Output) -> Vec<SseEvent> {
        match out {
            Output::Text { text, logprobs: lps } if text.is_empty() && lps.is_empty() => vec![],
            Output::Text { text, logprobs: lps } => {
                let mut events = vec![];
                if !matches!(self.open, Some(Open::Text { .. })) {
                    events.extend(self.close("completed"));
                    events.extend(self.open(Open::Text { id: message_id(), text: String::new(), logprobs: vec![] }));
                }
                let index = self.done.len();
                let asked = self.meta.echo.logprobs;
                let Some(Open::Text { id, text: all, logprobs: kept }) = &mut self.open else { unreachable!("opened above") };
                all.push_str(&text);
                let delta_logprobs = if asked { logprobs(&lps) } else { json!([]) };
                kept.extend(lps);
                let data =
                    json!({"item_id": id.clone(), "output_index": index, "content_index": 0, "delta": text, "logprobs": delta_logprobs});
                events.push(self.event("response.output_text.delta", data));
                events
            }
            Output::Reasoning { text } => {
                let mut events = vec![];
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    events.extend(self.close("completed"));
                    events.extend(self.open(Open::Reasoning { id: reasoning_id(), text: String::new() }));
                }
                let index = self.done.len();
                let Some(Open::Reasoning { id, text: all }) = &mut self.open else { unreachable!("opened above") };
                all.push_str(&text);
                let data = json!({"item_id": id.clone(), "output_index": index, "content_index": 0, "delta": text});
                events.push(self.event("response.reasoning_text.delta", data));
                events
            }
            Output::ToolCallStart { id, name, .. } => {
                let mut events = self.close("completed");
                events.extend(self.open(Open::Call { call_id: id, name, arguments: String::new() }));
                events
            }
            Output::ToolCallArguments { fragment, .. } => {
                let index = self.done.len();
                let Some(Open::Call { call_id, arguments, .. }) = &mut self.open else { return vec![] };
                arguments.push_str(&fragment);
                let data = json!({"item_id": call_item_id(call_id), "output_index": index, "delta": fragment});
                vec![self.event("response.function_call_arguments.delta", data)]
            }
            Output::Done { finish, usage: u } => {
                let mut events = self.close(if finish == Finish::Length { "incomplete" } else { "completed" });
                let (state, incomplete) = status(finish);
                let response = self.meta.object(state, self.done.clone(), usage(&u), incomplete, Value::Null);
                let kind = if state == "incomplete" { "response.incomplete" } else { "response.completed" };
                events.push(self.lifecycle(kind, response));
                events
            }
        }
    }
}

pub fn sse(meta: Meta, generation: Generation) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut writer = Writer { meta, sequence: 0, done: vec![], open: None };
    let started = writer.meta.object("in_progress", vec![], Value::Null, Value::Null, Value::Null);
    let opening = vec![writer.lifecycle("response.created", started.clone()), writer.lifecycle("response.in_progress", started)];
    let body = stream::unfold((generation, writer, false), |(mut generation, mut writer, ended)| async move {
        if ended {
            return None;
        }
        let (events, ended) = match generation.next().await {
            Some(Ok(out @ Output::Done { .. })) => (writer.on(out), true),
            Some(Ok(out)) => (writer.on(out), false),
            Some(Err(e)) => {
                let error = response_error(&responses_words(e));
                let mut output = writer.done.clone();
                if let Some(open) = &writer.open {
                    output.push(match open {
                        Open::Reasoning { id, text } => {
                            let mut item = reasoning_item(id, "incomplete", vec![reasoning_part(text)]);
                            writer.meta.echo.dress_reasoning(&mut item, text);
                            item
                        }
                        Open::Text { id, text, .. } => message_item(id, "incomplete", vec![text_part(text, None)]),
                        Open::Call { call_id, name, arguments } => call_item(call_id, name, arguments, "incomplete"),
                    });
                }
                let response = writer.meta.object("failed", output, Value::Null, Value::Null, error);
                (vec![writer.lifecycle("response.failed", response)], true)
            }
            None => (vec![], true),
        };
        Some((events, (generation, writer, ended)))
    });
    let body = stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok);
    Sse::new(body).keep_alive(KeepAlive::default())
}
