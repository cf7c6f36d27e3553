//! Ollama's answer objects from the core's output: `created_at` (RFC 3339), the assistant
//! `message` (chat) or `response` text (generate), a reasoning model's `thinking` beside it
//! (`message.thinking`, or `thinking` for generate), `tool_calls` with parsed `arguments`,
//! `done_reason` and the counts and durations of the final object, in nanoseconds:
//! `total_duration` (request in to answer done), `load_duration` (model lease, load if it
//! was not loaded, and prompt preparation), `prompt_eval_*` (prefill: every prompt token,
//! those the prefix cache held included), `eval_*` (decoding).
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::engine::tools::ToolCall;
use crate::engine::Completion;
use crate::inference::{arguments_object, Answer, Finish, TextLogprobs};

/// Which route answers: the text goes in `message.content` (chat) or `response` (generate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Generate,
}

/// When the request came in, and how long the model and prompt took to get ready.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub started: Instant,
    pub load: Duration,
}

pub fn created_at() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A piece of the answer (or all of it) in the route's shape, `done: false`.
pub fn chunk(shape: Shape, model: &str, text: &str, calls: &[ToolCall], logprobs: &[TextLogprobs]) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("model".into(), json!(model));
    o.insert("created_at".into(), json!(created_at()));
    match shape {
        Shape::Chat => {
            let mut message = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls.iter().enumerate().map(|(i, c)| tool_call(i, c)).collect());
            }
            o.insert("message".into(), message);
        }
        Shape::Generate => {
            o.insert("response".into(), json!(text));
        }
    }
    if !logprobs.is_empty() {
        o.insert("logprobs".into(), Value::Array(logprobs.iter().map(logprob).collect()));
    }
    o.insert("done".into(), json!(false));
    o
}

/// A reasoning model's thinking, where Ollama puts it for the route.
pub fn with_thinking(o: &mut Map<String, Value>, shape: Shape, thinking: &str) {
    match shape {
        Shape::Chat => {
            if let Some(m) = o.get_mut("message") {
                m["thinking"] = json!(thinking);
            }
        }
        Shape::Generate => {
            o.insert("thinking".into(), json!(thinking));
        }
    }
}

/// The last object's fields: `done`, `done_reason`, counts and durations.
pub fn finish(o: &mut Map<String, Value>, finish: Finish, usage: &Completion, clock: Clock) {
    let reason = match finish {
        Finish::Length => "length",
        Finish::Stop | Finish::ToolCalls => "stop",
    };
    o.insert("done".into(), json!(true));
    o.insert("done_reason".into(), json!(reason));
    o.insert("total_duration".into(), json!(nanos(clock.started.elapsed())));
    o.insert("load_duration".into(), json!(nanos(clock.load)));
    o.insert("prompt_eval_count".into(), json!(usage.prompt_tokens));
    o.insert("prompt_eval_duration".into(), json!(nanos(usage.timings.prefill)));
    o.insert("eval_count".into(), json!(usage.completion_tokens));
    o.insert("eval_duration".into(), json!(nanos(usage.timings.decode)));
}

/// The whole answer (`stream: false`).
pub fn whole(shape: Shape, model: &str, answer: &Answer, clock: Clock) -> Value {
    let mut o = chunk(shape, model, &answer.text, &answer.tool_calls, &answer.logprobs);
    if !answer.reasoning.is_empty() {
        with_thinking(&mut o, shape, &answer.reasoning);
    }
    finish(&mut o, answer.finish, &answer.usage, clock);
    Value::Object(o)
}

/// A call as Ollama writes it: `arguments` an object.
fn tool_call(index: usize, c: &ToolCall) -> Value {
    json!({"id": c.id, "function": {"index": index, "name": c.name, "arguments": arguments_object(&c.arguments)}})
}

fn logprob(l: &TextLogprobs) -> Value {
    let top: Vec<Value> = l.top.iter().map(|(token, bytes, lp)| json!({"token": token, "logprob": lp, "bytes": bytes})).collect();
    json!({"token": l.token, "logprob": l.logprob, "bytes": l.bytes, "top_logprobs": top})
}

/// The answer to a request with no prompt: the model is loaded (`done_reason: "load"`), or
/// with `keep_alive: 0` unloaded (`"unload"`), as Ollama answers.
pub fn loaded(shape: Shape, model: &str, unloaded: bool) -> Value {
    let mut o = chunk(shape, model, "", &[], &[]);
    o.insert("done".into(), json!(true));
    o.insert("done_reason".into(), json!(if unloaded { "unload" } else { "load" }));
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_carry_parsed_arguments() {
        let call = ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() };
        let o = chunk(Shape::Chat, "m:latest", "", &[call], &[]);
        assert_eq!(
            o["message"]["tool_calls"],
            json!([{"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}])
        );
        let g = chunk(Shape::Generate, "m", "hi", &[], &[]);
        assert_eq!((g["response"].as_str(), g.get("message"), g["done"].as_bool()), (Some("hi"), None, Some(false)));
    }
}
