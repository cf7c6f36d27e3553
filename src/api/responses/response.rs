//! The Response object from the core's [`Answer`]: `output` items (a reasoning model's
//! `reasoning` item first, its text as one `reasoning_text` part, as OpenAI's gpt-oss server
//! and vLLM send it; a `message` with one `output_text` part, its logprobs when `include` asked; each call as a `function_call`),
//! `status` (`incomplete` with `incomplete_details.reason` when `max_output_tokens` or the
//! context cut it), `usage` (with the prefix cache's `cached_tokens`) and the request's
//! parameters repeated, as the SDK's `Response` model expects them.
use rand::Rng;
use serde_json::{json, Value};

use super::translate::Echo;
use crate::engine::Completion;
use crate::inference::{Answer, Finish, TextLogprobs};

fn random_suffix() -> String {
    rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A message item's id (`msg_…`).
pub fn message_id() -> String {
    format!("msg_{}", random_suffix())
}

/// A reasoning item's id (`rs_…`).
pub fn reasoning_id() -> String {
    format!("rs_{}", random_suffix())
}

/// A `reasoning_text` part.
pub fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// A `reasoning` item: the text is the content; the summary stays empty until
/// [`Echo::dress_reasoning`] fills it.
pub fn reasoning_item(id: &str, status: &str, content: Vec<Value>) -> Value {
    json!({"id": id, "type": "reasoning", "status": status, "summary": [], "content": content})
}

/// A `summary_text` part.
pub fn summary_part(text: &str) -> Value {
    json!({"type": "summary_text", "text": text})
}

impl Echo {
    /// A finished reasoning item as the request asked for it: its whole `text` as the summary
    /// when `reasoning.summary` was set, and sealed in `encrypted_content` when `include`
    /// named it.
    pub fn dress_reasoning(&self, item: &mut Value, text: &str) {
        if self.summary && !text.is_empty() {
            item["summary"] = json!([summary_part(text)]);
        }
        if self.sealed_reasoning {
            item["encrypted_content"] = json!(super::sealed::seal(text));
        }
    }
}

/// A function_call item's id (`fc_…`), from the call's `call_…` id.
pub fn call_item_id(call_id: &str) -> String {
    format!("fc_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

pub fn usage(c: &Completion) -> Value {
    json!({
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": c.cached_prompt_tokens, "cache_write_tokens": 0},
        "output_tokens": c.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    })
}

/// `output_text.logprobs` entries.
pub fn logprobs(lps: &[TextLogprobs]) -> Value {
    let entry = |token: &str, bytes: &[u8], logprob: f32| json!({"token": token, "bytes": bytes, "logprob": logprob});
    lps.iter()
        .map(|lp| {
            let mut e = entry(&lp.token, &lp.bytes, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|(t, b, l)| entry(t, b, *l)).collect();
            e
        })
        .collect()
}

/// An `output_text` part; `logprobs` only when they were asked for.
pub fn text_part(text: &str, lps: Option<&[TextLogprobs]>) -> Value {
    let mut part = json!({"type": "output_text", "text": text, "annotations": []});
    if let Some(lps) = lps {
        part["logprobs"] = logprobs(lps);
    }
    part
}

pub fn message_item(id: &str, status: &str, content: Vec<Value>) -> Value {
    json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": content})
}

pub fn call_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"id": call_item_id(call_id), "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments})
}

/// `status` and `incomplete_details` of a finished answer.
pub fn status(finish: Finish) -> (&'static str, Value) {
    match finish {
        Finish::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        Finish::Stop | Finish::ToolCalls => ("completed", Value::Null),
    }
}

/// Identity shared by every event of one response, and what it repeats of the request.
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub echo: Echo,
}

impl Meta {
    pub fn new(model: &str, echo: Echo) -> Meta {
        Meta { id: format!("resp_{}", random_suffix()), created_at: unix_now(), model: model.to_string(), echo }
    }

    /// The Response object as it stands: `in_progress` while streaming, then finished.
    pub fn object(&self, status: &str, output: Vec<Value>, usage: Value, incomplete_details: Value, error: Value) -> Value {
        let mut o = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete_details,
            "model": self.model,
            "output": output,
            "usage": usage,
        });
        if status != "in_progress" {
            o["completed_at"] = json!(unix_now());
        }
        o.as_object_mut().expect("an object").extend(self.echo.params.clone());
        o
    }

    /// The whole (non-streamed) Response.
    pub fn full(&self, a: &Answer) -> Value {
        let (status, incomplete) = status(a.finish);
        let item_status = if a.finish == Finish::Length { "incomplete" } else { "completed" };
        let mut output = vec![];
        if !a.reasoning.is_empty() {
            let mut item = reasoning_item(&reasoning_id(), item_status, vec![reasoning_part(&a.reasoning)]);
            self.echo.dress_reasoning(&mut item, &a.reasoning);
            output.push(item);
        }
        if !a.text.is_empty() || a.tool_calls.is_empty() {
            let lps = self.echo.logprobs.then_some(a.logprobs.as_slice());
            output.push(message_item(&message_id(), item_status, vec![text_part(&a.text, lps)]));
        }
        for c in &a.tool_calls {
            output.push(call_item(&c.id, &c.name, &c.arguments, "completed"));
        }
        self.object(status, output, usage(&a.usage), incomplete, Value::Null)
    }
}
