//! A request's input as prompt token ids: a conversation through the model's chat template
//! (with its tools), raw text through the tokenizer, or ids as given.
use super::request::{Input, Message};
use crate::api::error::ApiError;
use crate::engine::chat_template::ChatMessage;
use crate::engine::tools::ToolSpec;
use crate::engine::TextCodec;

pub fn prompt_ids(codec: &TextCodec, input: Input, tools: &[ToolSpec]) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| codec.encode(text).map_err(|e| ApiError::internal(format!("{e:#}")));
    match input {
        Input::Chat(messages) => {
            if messages.is_empty() {
                return Err(ApiError::bad_request("'messages' must contain at least one message").param("messages"));
            }
            let template = codec
                .template
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("This model has no chat template; use /v1/completions").param("messages"))?;
            let messages: Vec<ChatMessage> = messages.iter().map(template_message).collect();
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
