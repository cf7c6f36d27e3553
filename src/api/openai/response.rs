//! OpenAI's response objects, built from the core's [`Answer`] and [`Output`]s.
use serde_json::{json, Map, Value};

use crate::engine::Completion;
use crate::inference::{Answer, Finish, TextLogprobs};

/// Which OpenAI object family a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
        }
    }

    /// The metrics' `endpoint` label.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
        }
    }
}

/// Identity shared by every object of one response.
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub const SYSTEM_FINGERPRINT: &str = concat!("mlxbar-", env!("CARGO_PKG_VERSION"));

pub fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

pub fn usage_json(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_prompt_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": c.accepted_draft_tokens,
            "rejected_prediction_tokens": c.rejected_draft_tokens,
        },
    })
}

/// Chat's `logprobs.content` entries.
pub fn chat_logprobs(lps: &[TextLogprobs]) -> Value {
    let entry = |token: &str, bytes: &[u8], logprob: f32| json!({"token": token, "logprob": logprob, "bytes": bytes});
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(&lp.token, &lp.bytes, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|(t, b, l)| entry(t, b, *l)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The legacy completions' `logprobs` object; `offset` is where this text starts in the answer.
pub fn completion_logprobs(lps: &[TextLogprobs], mut offset: usize) -> Value {
    let (mut tokens, mut token_logprobs, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
    for lp in lps {
        tokens.push(json!(lp.token));
        token_logprobs.push(json!(lp.logprob));
        top.push(Value::Object(lp.top.iter().map(|(t, _, l)| (t.clone(), json!(l))).collect::<Map<_, _>>()));
        offsets.push(json!(offset));
        offset += lp.token.len();
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

fn tool_calls_json(a: &Answer) -> Value {
    a.tool_calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect()
}

impl ResponseMeta {
    /// The whole (non-streamed) response; `logprobs` says whether they were asked for.
    pub fn full(&self, a: &Answer, logprobs: bool) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": a.text, "refusal": null});
                // Where vLLM and llama.cpp's server put a reasoning model's thinking.
                if !a.reasoning.is_empty() {
                    message["reasoning_content"] = json!(a.reasoning);
                }
                if !a.tool_calls.is_empty() {
                    message["tool_calls"] = tool_calls_json(a);
                    if a.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                let lp = if logprobs { chat_logprobs(&a.logprobs) } else { Value::Null };
                json!({"index": 0, "message": message, "logprobs": lp, "finish_reason": finish_reason(a.finish)})
            }
            Endpoint::Completions => {
                let lp = if logprobs { completion_logprobs(&a.logprobs, 0) } else { Value::Null };
                json!({"index": 0, "text": a.text, "logprobs": lp, "finish_reason": finish_reason(a.finish)})
            }
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [choice],
            "usage": usage_json(&a.usage),
        })
    }

    /// A streamed chunk with one choice.
    pub fn chunk(&self, choice: Value, include_usage: bool) -> Value {
        let mut chunk = self.chunk_envelope(json!([choice]));
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The extra last chunk `stream_options.include_usage` asks for.
    pub fn usage_chunk(&self, done: &Completion) -> Value {
        let mut chunk = self.chunk_envelope(json!([]));
        chunk["usage"] = usage_json(done);
        chunk
    }

    fn chunk_envelope(&self, choices: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices,
        })
    }
}

pub fn new_meta(endpoint: Endpoint, model: &str) -> ResponseMeta {
    use rand::Rng;
    let suffix: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    ResponseMeta { endpoint, id: format!("{}{suffix}", endpoint.id_prefix()), created, model: model.to_string() }
}
