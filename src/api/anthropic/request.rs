//! Anthropic Messages request bodies. Unknown top-level fields are refused; content blocks,
//! tools and tool choices arrive as JSON and are read field by field in [`super::translate`],
//! so a block type or a field mlxbar does not do is refused by name there. Nothing is
//! silently ignored.
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: String,
    /// Required, as Anthropic requires it.
    pub max_tokens: u32,
    pub messages: Vec<MessageIn>,
    pub system: Option<Content>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// `{"user_id": …}`: identifies the caller, does not change the answer.
    pub metadata: Option<Metadata>,
    /// `{"format": {"type": "json_schema", "schema": …}}`: structured output.
    pub output_config: Option<Value>,
    /// mlxbar's extension, as on the OpenAI routes (Ollama's spelling): how long the model
    /// stays loaded after this answer.
    pub keep_alive: Option<crate::registry::KeepAlive>,
    /// Top-level `{"type": "ephemeral"}`: prompts are prefix-cached anyway.
    pub cache_control: Option<Value>,
    /// Identify the caller; they do not change the answer.
    pub user_profile_id: Option<String>,
    pub workspace_id: Option<String>,
    // Checked in `translate`: done where what they ask is what mlxbar does, else refused by name.
    pub thinking: Option<Value>,
    pub service_tier: Option<Value>,
    pub speed: Option<Value>,
    pub container: Option<Value>,
    pub mcp_servers: Option<Value>,
    pub context_management: Option<Value>,
    pub diagnostics: Option<Value>,
    pub inference_geo: Option<Value>,
}

/// `/v1/messages/count_tokens`: what shapes the prompt, nothing about generating.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<MessageIn>,
    pub system: Option<Content>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub output_config: Option<Value>,
    pub cache_control: Option<Value>,
    pub user_profile_id: Option<String>,
    pub workspace_id: Option<String>,
    pub thinking: Option<Value>,
    pub speed: Option<Value>,
    pub mcp_servers: Option<Value>,
    pub context_management: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageIn {
    pub role: String,
    pub content: Content,
}

/// A string, or content blocks (read in `translate`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub user_id: Option<String>,
}
