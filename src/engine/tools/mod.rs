//! Tool calling, engine side: the neutral tool types, the call syntax of each model family
//! (one parser per family behind [`ToolCallParser`], chosen at load by [`ToolFormat::detect`]),
//! the streaming splitter of calls (and harmony's reasoning) from text ([`stream`]) and the
//! prompt fallback for chat templates that know nothing of tools ([`fallback`]).
use serde::Serialize;

pub mod fallback;
mod grammar;
mod harmony;
mod hermes;
mod llama3;
mod mistral;
mod scan;
pub mod stream;

pub use stream::{ToolCallStream, ToolDelta};

/// A function the model may call (neutral form of OpenAI's `tools[].function`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A call in the conversation history (an assistant turn that called tools).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text
    pub arguments: String,
}

/// What the model must do with its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    Auto,
    Required,
    Named(String),
}

/// The model family's call syntax. Chosen at load (`ToolFormat::detect`) and stored in ModelInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen 2.5/3, Hermes, and the fallback prompt).
    Hermes,
    /// `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, `;` between calls (Llama 3.1-3.3).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` (v3) or `[TOOL_CALLS]name[ARGS]{...}` (v11+).
    Mistral,
    /// gpt-oss's harmony channels: `<|channel|>analysis<|message|>…<|end|>`, then
    /// `<|start|>assistant<|channel|>final<|message|>…` or a call
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`.
    Harmony,
}

impl ToolFormat {
    /// The family from the chat template's text, then from the vocabulary: `<|channel|>` is
    /// Harmony, `<tool_call>` Hermes, `[TOOL_CALLS]` Mistral, `<|python_tag|>` or Llama 3.1's `"parameters"` JSON
    /// instructions Llama3Json. The template is asked first (a Hermes fine-tune of Llama keeps
    /// Llama's vocabulary); without any sign, Hermes, the format of the fallback prompt.
    pub fn detect(template_source: Option<&str>, tokenizer: &tokenizers::Tokenizer) -> ToolFormat {
        if let Some(t) = template_source {
            if t.contains("<|channel|>") {
                return ToolFormat::Harmony;
            }
            if t.contains("<tool_call>") {
                return ToolFormat::Hermes;
            }
            if t.contains("[TOOL_CALLS]") {
                return ToolFormat::Mistral;
            }
            if t.contains("<|python_tag|>") || (t.contains("\"parameters\"") && t.contains("JSON")) {
                return ToolFormat::Llama3Json;
            }
        }
        let has = |s: &str| tokenizer.token_to_id(s).is_some();
        if has("<|channel|>") {
            ToolFormat::Harmony
        } else if has("<tool_call>") {
            ToolFormat::Hermes
        } else if has("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if has("<|python_tag|>") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }

    pub fn parser(&self) -> &'static dyn ToolCallParser {
        match self {
            ToolFormat::Hermes => &hermes::Hermes,
            ToolFormat::Llama3Json => &llama3::Llama3Json,
            ToolFormat::Mistral => &mistral::Mistral,
            ToolFormat::Harmony => &harmony::Harmony,
        }
    }

    /// The answer always needs reading (its reasoning is apart from its text), tools or not.
    pub fn has_channels(&self) -> bool {
        *self == ToolFormat::Harmony
    }
}

/// A call found in the model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// compact JSON text of the arguments object
    pub arguments: String,
}

/// The answer opened a call it did not finish, or a call is not valid JSON of the family's shape.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolParseError {
    pub message: String,
}

impl ToolParseError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ToolParseError { message: message.into() }
    }
}

pub trait ToolCallParser: Send + Sync {
    /// Text that opens a call (`<tool_call>`, `<|python_tag|>` / `{"name"`, `[TOOL_CALLS]`).
    fn opener(&self) -> &str;
    /// All complete calls in a finished answer, with the text outside them.
    fn parse(&self, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError>;
    /// A Lark grammar (llguidance dialect, arguments as `%json { <tool's parameters schema> }`)
    /// that only allows calls to `tools` in this syntax: for Required/Named the whole answer is
    /// calls; for Auto, free text that does not contain the opener, optionally followed by calls
    /// (so a call, once opened, is always valid). `parallel`: more than one call allowed.
    /// `tokenizer`: the model's, so markers that are single special tokens (`<tool_call>` in
    /// Qwen, `[TOOL_CALLS]` in Mistral) are required as those tokens rather than spelled out.
    fn grammar(&self, tools: &[ToolSpec], mode: &ToolMode, parallel: bool, tokenizer: &tokenizers::Tokenizer) -> String;
}

#[cfg(test)]
mod test_util;

#[cfg(test)]
mod tests {
    use super::test_util::tokenizer;
    use super::ToolFormat;

    #[test]
    fn detects_the_family_from_template_then_vocabulary() {
        let plain = tokenizer(&[]);
        let qwen = include_str!("../../../tests/data/templates/qwen2.5-instruct.jinja");
        assert_eq!(ToolFormat::detect(Some(qwen), &plain), ToolFormat::Hermes);
        // Llama 3.1's JSON tool-calling instructions
        let llama = "{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n' }}{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}";
        assert_eq!(ToolFormat::detect(Some(llama), &plain), ToolFormat::Llama3Json);
        let mistral = "{%- if message.tool_calls %}[TOOL_CALLS][{%- for tool_call in message.tool_calls %}...{%- endfor %}]{%- endif %}";
        assert_eq!(ToolFormat::detect(Some(mistral), &plain), ToolFormat::Mistral);
        // the template wins over the vocabulary (Hermes fine-tunes of Llama)
        assert_eq!(ToolFormat::detect(Some(qwen), &tokenizer(&["<|python_tag|>"])), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect(None, &tokenizer(&["<|python_tag|>"])), ToolFormat::Llama3Json);
        assert_eq!(ToolFormat::detect(Some("{{ x }}"), &tokenizer(&["[TOOL_CALLS]"])), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect(None, &tokenizer(&["<tool_call>"])), ToolFormat::Hermes);
        // nothing known: Hermes, the fallback prompt's format
        let smol = include_str!("../../../tests/data/templates/smollm2-instruct.jinja");
        assert_eq!(ToolFormat::detect(Some(smol), &plain), ToolFormat::Hermes);
        let gpt_oss = include_str!("../../../tests/data/templates/gpt-oss.jinja");
        assert_eq!(ToolFormat::detect(Some(gpt_oss), &plain), ToolFormat::Harmony);
        assert_eq!(ToolFormat::detect(None, &tokenizer(&["<|channel|>"])), ToolFormat::Harmony);
    }
}
