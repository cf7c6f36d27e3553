//! OpenAI request bodies, every field OpenAI documents for these endpoints. Unknown fields
//! are refused (as OpenAI does); known ones mlxbar does not do are refused by name in
//! [`ChatCompletionRequest::check_unsupported`] — nothing is silently ignored.
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::api::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// mlxbar's extension (as vLLM and llama.cpp take it).
    pub top_k: Option<u32>,
    /// mlxbar's extension, as Ollama spells it: how long the model stays loaded after
    /// this answer ("5m", 300, -1 for ever, 0 to unload right after).
    pub keep_alive: Option<crate::registry::KeepAlive>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<LogitBiasIn>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<ToolChoiceIn>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    /// Identify the caller; they do not change the answer.
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    /// Prompts are prefix-cached anyway; the key is not needed to find them.
    pub prompt_cache_key: Option<String>,
    /// "low", "medium", "high": honoured by harmony models (gpt-oss), refused by the others.
    pub reasoning_effort: Option<Value>,
    /// Predicted Outputs: `{"type": "content", "content": text or text parts}`.
    pub prediction: Option<Value>,
    // Known, not done: refused by name in `check_unsupported`.
    audio: Option<Value>,
    modalities: Option<Vec<String>>,
    functions: Option<Value>,
    function_call: Option<Value>,
    web_search_options: Option<Value>,
    verbosity: Option<Value>,
    service_tier: Option<String>,
    store: Option<bool>,
    metadata: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    /// mlxbar's extension, as Ollama spells it: how long the model stays loaded after
    /// this answer ("5m", 300, -1 for ever, 0 to unload right after).
    pub keep_alive: Option<crate::registry::KeepAlive>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<LogitBiasIn>,
    /// The number of alternatives per token (0-5), as the legacy endpoint counts them.
    pub logprobs: Option<u32>,
    /// mlxbar's extension: constrained output on raw completions too.
    pub response_format: Option<ResponseFormat>,
    pub user: Option<String>,
    #[serde(default)]
    pub echo: bool,
    pub best_of: Option<u32>,
    pub suffix: Option<String>,
}

impl ChatCompletionRequest {
    /// Known OpenAI fields mlxbar does not do: present and not null, each is a 400 naming it.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        let refuse = |param: &'static str, why: &str| Err(ApiError::bad_request(format!("'{param}' is not supported: {why}")).param(param));
        if self.audio.is_some() {
            return refuse("audio", "mlxbar answers in text only");
        }
        if self.modalities.as_ref().is_some_and(|m| m.iter().any(|m| m != "text")) {
            return refuse("modalities", "mlxbar answers in text only");
        }
        if self.functions.is_some() || self.function_call.is_some() {
            let param = if self.functions.is_some() { "functions" } else { "function_call" };
            return refuse(param, "the deprecated functions API is not served; use 'tools' and 'tool_choice'");
        }
        if self.web_search_options.is_some() {
            return refuse("web_search_options", "mlxbar does not search the web");
        }
        if self.verbosity.is_some() {
            return refuse("verbosity", "the served models have no verbosity control");
        }
        if self.service_tier.as_deref().is_some_and(|t| t != "auto" && t != "default") {
            return refuse("service_tier", "a local server has one tier: leave it out, or send \"auto\"");
        }
        if self.store == Some(true) || self.metadata.is_some() {
            let param = if self.store == Some(true) { "store" } else { "metadata" };
            return refuse(param, "mlxbar does not store completions");
        }
        Ok(())
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
    pub refusal: Option<String>,
    /// An assistant turn's reasoning sent back (as mlxbar answers it): the template's `thinking`.
    pub reasoning_content: Option<String>,
    pub audio: Option<Value>,
    pub function_call: Option<Value>,
}

/// A message's content: a string, or typed parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// Other part types' payloads (`image_url`, `input_audio`, `file`, `refusal`): refused by type.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    pub name: String,
    /// JSON text, as the model wrote it.
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    /// Calls are always decoded against `parameters` when they are given, strict or not.
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceIn {
    /// "none", "auto" or "required".
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub description: Option<String>,
    pub schema: Option<Value>,
    /// Output is always decoded against the schema, strict or not.
    pub strict: Option<bool>,
}

/// `logit_bias` as sent: every entry in order, repeated keys included (a map would keep the
/// last one silently), so [`crate::api::openai::chat::logit_bias`] can refuse them.
#[derive(Debug, Default)]
pub struct LogitBiasIn(pub Vec<(String, f32)>);

impl<'de> Deserialize<'de> for LogitBiasIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = LogitBiasIn;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of token ids to biases")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<LogitBiasIn, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, f32>()? {
                    // Bounded before the count check runs: a huge map is refused as it is read.
                    if out.len() > super::chat::LOGIT_BIAS_MAX_ENTRIES {
                        return Err(serde::de::Error::custom(format!(
                            "logit_bias has more than {} entries",
                            super::chat::LOGIT_BIAS_MAX_ENTRIES
                        )));
                    }
                    out.push(entry);
                }
                Ok(LogitBiasIn(out))
            }
        }
        d.deserialize_map(Entries)
    }
}
