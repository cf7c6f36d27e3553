//! A request's input as prompt token ids: a conversation through the model's chat template
//! (with its tools and the answer's format), raw text through the tokenizer, or ids as given.
use super::request::{Input, Message, OutputFormat, Role};
use crate::api::error::ApiError;
use crate::engine::chat_template::ChatMessage;
use crate::engine::tools::ToolSpec;
use crate::engine::TextCodec;

/// How long a prompt's text may be before tokenizing it: `context` tokens of at most
/// `max_token_bytes` each, twice over (a normalizer may shorten text). Anything longer
/// cannot fit, whatever its tokens, and is refused without spending a second or more of a
/// preparation thread on a few MiB.
#[derive(Debug, Clone, Copy)]
pub struct TextLimit {
    pub context: usize,
    pub max_token_bytes: usize,
}

impl TextLimit {
    pub fn bytes(&self) -> usize {
        self.context.saturating_mul(self.max_token_bytes).saturating_mul(2)
    }
}

pub fn prompt_ids(
    codec: &TextCodec,
    input: Input,
    tools: &[ToolSpec],
    format: Option<&OutputFormat>,
    limit: TextLimit,
) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| {
        if text.len() > limit.bytes() {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, your prompt is {} bytes, more than {} tokens can hold. Please reduce the length of the prompt.",
                limit.context,
                text.len(),
                limit.context
            ))
            .param("messages")
            .code("context_length_exceeded"));
        }
        codec.encode(text).map_err(|e| ApiError::internal(format!("{e:#}")))
    };
    match input {
        Input::Chat(messages) => {
            if messages.is_empty() {
                return Err(ApiError::bad_request("'messages' must contain at least one message").param("messages"));
            }
            let template = codec
                .template
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("This model has no chat template; use /v1/completions").param("messages"))?;
            let mut messages: Vec<ChatMessage> = messages.iter().map(template_message).collect();
            if let Some(format) = format {
                describe_format(&mut messages, format);
            }
            let prompt = template.render(&messages, tools, true).map_err(|e| ApiError::bad_request(format!("{e:#}")).param("messages"))?;
            encode(&prompt)
        }
        Input::Text(text) => encode(&text),
        Input::Tokens(ids) => {
            let vocab = codec.vocab_size() as u32;
            if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
                return Err(ApiError::bad_request(format!("Token id {bad} is outside the vocabulary (size {vocab})")).param("prompt"));
            }
            Ok(ids)
        }
    }
}

fn template_message(m: &Message) -> ChatMessage {
    ChatMessage {
        role: m.role.as_str().to_string(),
        content: m.text(),
        tool_calls: m.tool_calls.clone(),
        tool_call_id: m.tool_call_id.clone(),
    }
}

/// Tells the model the format its answer must have, at the end of the system turn (one is put
/// first if there is none), as OpenAI does: the grammar guarantees the shape, but a model that
/// knows the schema fills it sensibly and closes it (one that does not, a small one above all,
/// may repeat an array's items until `max_tokens`).
fn describe_format(messages: &mut Vec<ChatMessage>, format: &OutputFormat) {
    let text = match format {
        OutputFormat::JsonObject => "Answer with a JSON object.".to_string(),
        OutputFormat::JsonSchema(schema) => format!("Answer with a JSON object that matches this JSON Schema:\n{schema}"),
    };
    match messages.first_mut() {
        Some(first) if first.role == Role::System.as_str() => {
            first.content = if first.content.is_empty() { text } else { format!("{}\n\n{text}", first.content) };
        }
        _ => messages.insert(0, ChatMessage::new(Role::System.as_str(), text)),
    }
}
