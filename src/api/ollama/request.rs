//! Ollama's `/api/chat` and `/api/generate` bodies. Unknown fields are refused; `options`,
//! `format`, `tools` and `think` arrive as JSON and are read field by field in
//! [`super::options`] and [`super::translate`], so whatever mlxbar does not do is refused
//! there by name. Fields Ollama has that mlxbar cannot honour (`raw`, `template`, `suffix`,
//! `context`, `images`, image generation) are named here so the refusal can name them.
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::registry::KeepAlive;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: String,
    /// None or empty: load the model (and with `keep_alive: 0`, unload it), as Ollama does.
    #[serde(default)]
    pub messages: Vec<MessageIn>,
    pub tools: Option<Vec<Value>>,
    pub format: Option<Value>,
    pub options: Option<Map<String, Value>>,
    /// Ollama streams unless told not to.
    #[serde(default = "yes")]
    pub stream: bool,
    pub keep_alive: Option<KeepAlive>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub model: String,
    /// None or empty: load the model (or unload it with `keep_alive: 0`).
    pub prompt: Option<String>,
    pub system: Option<String>,
    pub format: Option<Value>,
    pub options: Option<Map<String, Value>>,
    #[serde(default = "yes")]
    pub stream: bool,
    pub keep_alive: Option<KeepAlive>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    // Refused when they ask for something (see `translate::generate`).
    pub suffix: Option<String>,
    pub template: Option<String>,
    pub context: Option<Vec<Value>>,
    pub raw: Option<bool>,
    pub images: Option<Vec<Value>>,
    pub width: Option<Value>,
    pub height: Option<Value>,
    pub steps: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: String,
    /// Refused when not empty: mlxbar's models read text.
    pub images: Option<Vec<Value>>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// On a tool message: the function whose result this is.
    pub tool_name: Option<String>,
    /// An assistant turn's reasoning, sent back: the template's `thinking` (an empty one is none).
    pub thinking: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    /// Newer Ollama servers give calls an id; clients may send it back.
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    pub name: String,
    /// An object (Ollama's calls carry parsed arguments, not a JSON string).
    pub arguments: Value,
    /// The call's position in the answer, as newer Ollama servers number it (the order of
    /// `tool_calls` says the same).
    pub index: Option<u32>,
}

/// `POST /api/show`: `model` (or the older `name`), `verbose` (the tokenizer's vocabulary in
/// `model_info`, which mlxbar does not list: refused when true).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    pub verbose: Option<bool>,
}

/// `POST /api/pull`: a Hugging Face repo id as `model` (or the older `name`); `insecure`
/// (skip TLS checks) is refused when true; `stream: false` answers once the pull ended.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    pub model: Option<String>,
    pub name: Option<String>,
    pub insecure: Option<bool>,
    #[serde(default = "yes")]
    pub stream: bool,
}
