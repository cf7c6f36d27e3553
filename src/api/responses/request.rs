//! OpenAI Responses request bodies (`POST /v1/responses`), every top-level field the
//! official SDK sends. Unknown fields are refused by serde; known ones mlxbar does not do
//! are refused by name in [`super::translate`]. Input items, tools, `tool_choice` and
//! `text` arrive as JSON and are read field by field there, so an item type or a field
//! mlxbar does not do is refused by name. Nothing is silently ignored.
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    /// A system message put before the input.
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `{"format": {...}}`: text, json_object or json_schema.
    pub text: Option<Value>,
    /// Extra output: `message.output_text.logprobs` only.
    pub include: Option<Vec<String>>,
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<Value>,
    /// Only `false`: mlxbar keeps no responses (absent means the same here).
    pub store: Option<bool>,
    /// Refused: a conversation lives in the client's `input`, never on the server.
    pub previous_response_id: Option<String>,
    /// Echoed back; they do not change the answer.
    pub metadata: Option<BTreeMap<String, String>>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    /// Prompts are prefix-cached anyway; the key is not needed to find them.
    pub prompt_cache_key: Option<String>,
    /// mlxbar's extension, as on the other routes (Ollama's spelling): how long the model
    /// stays loaded after this answer.
    pub keep_alive: Option<crate::registry::KeepAlive>,
    // Checked in `translate`: done where what they ask is what mlxbar does, else refused by name.
    pub background: Option<bool>,
    pub service_tier: Option<String>,
    pub truncation: Option<String>,
    pub reasoning: Option<Value>,
    pub conversation: Option<Value>,
    pub context_management: Option<Value>,
    pub max_tool_calls: Option<Value>,
    pub prompt: Option<Value>,
    pub prompt_cache_retention: Option<Value>,
    pub prompt_cache_options: Option<Value>,
    pub moderation: Option<Value>,
    pub image: Option<Value>,
    pub access_programs: Option<Value>,
}

/// A string (one user message), or input items (read in `translate`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}
