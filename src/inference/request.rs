//! What a client asks for, in no dialect's words.
use crate::engine::tools::{ToolCall, ToolMode, ToolSpec};

pub struct InferenceRequest {
    /// The model the client named; None or "default" means the default one.
    pub model: Option<String>,
    /// How long the model stays loaded after this answer (None: as it was).
    pub keep_alive: Option<crate::registry::KeepAlive>,
    pub input: Input,
    /// Functions the model may (or must) call; None: no tools (OpenAI's `tool_choice: none`
    /// also ends up here, so the model is not told about them).
    pub tools: Option<ToolSet>,
    /// The shape the answer must have, enforced by constrained decoding.
    pub format: Option<OutputFormat>,
    /// How hard a reasoning model thinks; a model without that control refuses it.
    pub reasoning_effort: Option<ReasoningEffort>,
    pub sampling: Sampling,
    /// None: up to the context's end.
    pub max_tokens: Option<usize>,
    /// What a prompt and answer do at the context's edge.
    pub overflow: Overflow,
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability and the `n` likeliest alternatives.
    pub logprobs: Option<usize>,
    /// The text the answer is expected to be, mostly (OpenAI's Predicted Outputs): drafts for
    /// speculative decoding. It changes how fast the answer comes, never what it is.
    pub prediction: Option<String>,
    /// Which dialect and endpoint asked, for the metrics' `endpoint` label.
    pub endpoint: &'static str,
    pub stream: bool,
}

/// What a request does when its prompt and answer would pass the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// A prompt that with `max_tokens` passes the model's context is refused.
    Refuse,
    /// The context is `window` tokens (None: the model's; never more): a conversation past it
    /// loses its oldest messages (system messages kept, the last message always), and the
    /// answer ends where the window does (`Finish::Length`). A prompt that still leaves no
    /// room for a token is refused.
    Trim { window: Option<usize> },
}

pub enum Input {
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
    /// Raw prompt text (no template).
    Text(String),
    /// Prompt token ids.
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering one of the assistant's calls.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Part>,
    /// The calls an assistant turn made.
    pub tool_calls: Vec<ToolCall>,
    /// On a tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// On an assistant turn sent back in the history: the reasoning it showed (OpenAI's
    /// `reasoning_content`, a Responses `reasoning` item, Anthropic `thinking` blocks, Ollama's
    /// `thinking`). The template gets it as the message's `thinking` and decides what it renders.
    pub reasoning: Option<String>,
}

/// A piece of a message. Only text today; images and audio will be parts beside it.
#[derive(Debug)]
pub enum Part {
    Text(String),
}

impl Message {
    /// A message of `role` with this text and nothing else.
    pub fn plain(role: Role, text: String) -> Message {
        Message { role, content: vec![Part::Text(text)], tool_calls: vec![], tool_call_id: None, reasoning: None }
    }

    pub fn text(&self) -> String {
        self.content.iter().map(|Part::Text(t)| t.as_str()).collect()
    }
}

pub struct ToolSet {
    pub specs: Vec<ToolSpec>,
    pub mode: ToolMode,
    /// More than one call per answer.
    pub parallel: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    /// A value valid against this JSON Schema.
    JsonSchema(serde_json::Value),
}

/// A reasoning effort and the field of the dialect that asked for it (named by the refusal
/// when the model has no such control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningEffort {
    pub level: Effort,
    pub param: &'static str,
}

/// gpt-oss's reasoning levels (its template's `reasoning_effort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    /// "low", "medium" or "high"; anything else is the Err naming `param` and the levels.
    pub fn parse(value: &str, param: &'static str) -> Result<Effort, crate::api::error::ApiError> {
        match value {
            "low" => Ok(Effort::Low),
            "medium" => Ok(Effort::Medium),
            "high" => Ok(Effort::High),
            other => Err(crate::api::error::ApiError::bad_request(format!(
                "'{param}' must be \"low\", \"medium\" or \"high\" (the levels gpt-oss's harmony format knows), got {other:?}"
            ))
            .param(param)),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }
}

/// Sampling as asked; None takes the server's default.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Vec<(u32, f32)>,
}
