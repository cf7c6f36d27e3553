//! What comes back, in no dialect's words: a stream of [`Output`]s, or the whole [`Answer`].
use crate::engine::tools::ToolCall;
use crate::engine::Completion;

/// One token's log-probability and its likeliest alternatives, as text.
#[derive(Debug, Clone)]
pub struct TextLogprobs {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(String, Vec<u8>, f32)>,
}

#[derive(Debug)]
pub enum Output {
    /// Answer text (may be empty when only logprobs come with it).
    Text {
        text: String,
        logprobs: Vec<TextLogprobs>,
    },
    /// The model's reasoning (harmony's analysis channel), apart from its answer.
    Reasoning {
        text: String,
    },
    /// A tool call begins: its id and function name, before any arguments.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// The next piece of a call's JSON arguments.
    ToolCallArguments {
        index: usize,
        fragment: String,
    },
    Done {
        finish: Finish,
        usage: Completion,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn (end token, stop string, or the grammar complete).
    Stop,
    /// `max_tokens` or the context ran out.
    Length,
    /// The answer is tool calls.
    ToolCalls,
}

/// A whole answer, for clients that do not stream.
pub struct Answer {
    pub text: String,
    /// The reasoning before the answer ("" for models that do not reason).
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub logprobs: Vec<TextLogprobs>,
    pub finish: Finish,
    pub usage: Completion,
}

/// A call's arguments as the JSON object the Anthropic and Ollama dialects carry (`input`,
/// `arguments`; the OpenAI dialects carry the same text as a string). Calls are decoded
/// against parameters that describe an object (`run::check_tools`) and a call whose text
/// does not parse is dropped as cut, so every call that reaches a dialect has one.
pub fn arguments_object(arguments: &str) -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str(arguments).unwrap_or_default()
}
