//! A request's input as prompt token ids: a conversation through the model's chat template
//! (with its tools and the answer's format), raw text through the tokenizer, or ids as given.
use super::request::{Effort, Input, Message, OutputFormat, Role};
use crate::api::error::ApiError;
use crate::engine::chat_template::{ChatMessage, ChatTemplate};
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

fn too_long(limit: TextLimit, bytes: usize) -> ApiError {
    ApiError::bad_request(format!(
        "This model's maximum context length is {} tokens. However, your prompt is {bytes} bytes, more than {} tokens can hold. Please reduce the length of the prompt.",
        limit.context, limit.context
    ))
    .param("messages")
    .code("context_length_exceeded")
}

fn encode(codec: &TextCodec, text: &str) -> Result<Vec<u32>, ApiError> {
    codec.encode(text).map_err(|e| ApiError::internal(format!("{e:#}")))
}

pub fn prompt_ids(
    codec: &TextCodec,
    input: Input,
    tools: &[ToolSpec],
    format: Option<&OutputFormat>,
    effort: Option<Effort>,
    limit: TextLimit,
) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| {
        if text.len() > limit.bytes() {
            return Err(too_long(limit, text.len()));
        }
        encode(codec, text)
    };
    match input {
        Input::Chat(messages) => {
            let prompt = Conversation::new(codec, &messages, tools, format, effort)?.render(0)?;
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

/// The prompt ids of `input` within a window of `limit.context` tokens with room for at least
/// one answer token: a conversation past it loses its oldest messages (the system messages
/// among them kept, the last message always; the fewest that make it fit, found by bisection,
/// as each render and tokenization of a long conversation is costly); a prompt that still
/// leaves no room is refused.
pub fn fitted_prompt_ids(
    codec: &TextCodec,
    input: Input,
    tools: &[ToolSpec],
    format: Option<&OutputFormat>,
    effort: Option<Effort>,
    limit: TextLimit,
) -> Result<Vec<u32>, ApiError> {
    let chat = matches!(input, Input::Chat(_));
    let no_room = |tokens: usize| {
        ApiError::bad_request(format!(
            "The prompt takes {tokens} tokens, which leaves no room for an answer in the context window of {} tokens{}. Please shorten the prompt or ask for a larger window.",
            limit.context,
            if chat { ", even with only the last message and the system messages" } else { "" }
        ))
        .param("messages")
        .code("context_length_exceeded")
    };
    let Input::Chat(messages) = &input else {
        let ids = prompt_ids(codec, input, tools, format, effort, limit)?;
        return if ids.len() < limit.context { Ok(ids) } else { Err(no_room(ids.len())) };
    };
    let conversation = Conversation::new(codec, messages, tools, format, effort)?;
    // The ids from message `start` on, or the token count (or None: the bytes alone are too many).
    let from = |start: usize| -> Result<Result<Vec<u32>, Option<usize>>, ApiError> {
        let prompt = conversation.render(start)?;
        if prompt.len() > limit.bytes() {
            return Ok(Err(None));
        }
        let ids = encode(codec, &prompt)?;
        Ok(if ids.len() < limit.context { Ok(ids) } else { Err(Some(ids.len())) })
    };
    if let Ok(ids) = from(0)? {
        return Ok(ids);
    }
    // Bisection over the first message kept: `hi` fits (its ids in `fitted`), `lo - 1` does not.
    let last = messages.len() - 1;
    let mut fitted = match from(last)? {
        Ok(ids) => ids,
        Err(Some(tokens)) => return Err(no_room(tokens)),
        Err(None) => return Err(too_long(limit, conversation.render(last)?.len())),
    };
    let (mut lo, mut hi) = (1, last);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match from(mid)? {
            Ok(ids) => (hi, fitted) = (mid, ids),
            Err(_) => lo = mid + 1,
        }
    }
    Ok(fitted)
}

/// A conversation ready to render through the model's chat template, whole or from a message on.
struct Conversation<'a> {
    template: &'a ChatTemplate,
    messages: Vec<ChatMessage>,
    tools: &'a [ToolSpec],
    format: Option<&'a OutputFormat>,
    effort: Option<Effort>,
}

impl<'a> Conversation<'a> {
    fn new(
        codec: &'a TextCodec,
        messages: &[Message],
        tools: &'a [ToolSpec],
        format: Option<&'a OutputFormat>,
        effort: Option<Effort>,
    ) -> Result<Self, ApiError> {
        if messages.is_empty() {
            return Err(ApiError::bad_request("'messages' must contain at least one message").param("messages"));
        }
        let template = codec
            .template
            .as_ref()
            .ok_or_else(|| ApiError::bad_request("This model has no chat template; use /v1/completions").param("messages"))?;
        Ok(Conversation { template, messages: messages.iter().map(template_message).collect(), tools, format, effort })
    }

    /// The prompt of the messages from `start` on, after the system messages before it.
    fn render(&self, start: usize) -> Result<String, ApiError> {
        let system = self.messages[..start].iter().filter(|m| m.role == Role::System.as_str());
        let mut messages: Vec<ChatMessage> = system.chain(&self.messages[start..]).cloned().collect();
        if let Some(format) = self.format {
            describe_format(&mut messages, format);
        }
        self.template
            .render_with_effort(&messages, self.tools, true, self.effort.map(Effort::as_str))
            .map_err(|e| ApiError::bad_request(format!("{e:#}")).param("messages"))
    }
}

fn template_message(m: &Message) -> ChatMessage {
    ChatMessage {
        role: m.role.as_str().to_string(),
        content: m.text(),
        tool_calls: m.tool_calls.clone(),
        tool_call_id: m.tool_call_id.clone(),
        thinking: m.reasoning.clone(),
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
