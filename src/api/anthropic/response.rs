//! Anthropic's Message object from the core's [`Answer`]: content blocks (a reasoning
//! model's `thinking` block first, with an empty `signature`: nothing here signs it; text, then each
//! call as a `tool_use` block with its input parsed), `stop_reason`, `stop_sequence` and
//! `usage` (input tokens not read from the prefix cache, and those that were).
use serde_json::{json, Value};

use crate::engine::Completion;
use crate::inference::{arguments_object, Answer, Finish};

/// `msg_` and 24 random alphanumerics, as Anthropic's ids look.
pub fn message_id() -> String {
    use rand::Rng;
    let suffix: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect();
    format!("msg_{suffix}")
}

/// A call id in Anthropic's spelling (`toolu_…`); the client sends it back in `tool_result`.
pub fn tool_use_id(core_id: &str) -> String {
    format!("toolu_{}", core_id.strip_prefix("call_").unwrap_or(core_id))
}

pub fn stop_reason(finish: Finish, usage: &Completion) -> &'static str {
    match finish {
        Finish::Stop if usage.stop_sequence.is_some() => "stop_sequence",
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
    }
}

/// Anthropic counts prompt tokens read from the cache apart from the rest.
pub fn usage(c: &Completion) -> Value {
    json!({
        "input_tokens": c.prompt_tokens - c.cached_prompt_tokens,
        "output_tokens": c.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": c.cached_prompt_tokens,
    })
}

pub fn message(model: &str, answer: &Answer) -> Value {
    let mut content = vec![];
    if !answer.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": answer.reasoning, "signature": ""}));
    }
    if !answer.text.is_empty() {
        content.push(json!({"type": "text", "text": answer.text}));
    }
    for call in &answer.tool_calls {
        content
            .push(json!({"type": "tool_use", "id": tool_use_id(&call.id), "name": call.name, "input": arguments_object(&call.arguments)}));
    }
    json!({
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(answer.finish, &answer.usage),
        "stop_sequence": answer.usage.stop_sequence,
        "usage": usage(&answer.usage),
    })
}
