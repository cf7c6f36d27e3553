//! `POST /v1/chat/completions`.
use axum::extract::State;
use axum::response::Response;

use super::error::ApiError;
use super::generation::{new_meta, prepare, resolve_model, respond};
use super::json::OpenAiJson;
use super::openai::{ChatCompletionRequest, ChatMessageIn, Content, Endpoint};
use super::AppState;
use crate::engine::chat_template::ChatMessage;

pub async fn chat_completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let (info, codec) = resolve_model(&state, req.model.as_deref())?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("'messages' must contain at least one message").param("messages"));
    }
    let messages = req.messages.into_iter().enumerate().map(|(i, m)| to_template_message(i, m)).collect::<Result<Vec<_>, _>>()?;
    let template = codec
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("This model has no chat template; use /v1/completions").param("messages"))?;
    let prompt = template.render(&messages, &[], true).map_err(|e| ApiError::bad_request(format!("{e:#}")).param("messages"))?;
    let ids = codec.encode(&prompt).map_err(|e| ApiError::internal(format!("{e:#}")))?;
    let prepared = prepare(&state, &info, ids, req.common)?;
    respond(&state, new_meta(Endpoint::Chat, &info.id), prepared).await
}

fn to_template_message(index: usize, m: ChatMessageIn) -> Result<ChatMessage, ApiError> {
    if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
        return Err(ApiError::bad_request(format!(
            "messages[{index}].role '{}' is not one of system, developer, user, assistant, tool",
            m.role
        ))
        .param("messages"));
    }
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(format!(
                            "messages[{index}]: content part type '{kind}' is not supported (text only)"
                        ))
                        .param("messages"))
                    }
                }
            }
            text
        }
    };
    // Templates know "system"; OpenAI's newer "developer" role means the same.
    let role = if m.role == "developer" { "system".to_string() } else { m.role };
    Ok(ChatMessage::new(role, content))
}
