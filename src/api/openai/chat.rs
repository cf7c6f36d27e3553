//! `POST /v1/chat/completions`: OpenAI's chat request translated into the core's terms.
use axum::extract::State;
use axum::response::Response;

use super::request::{ChatCompletionRequest, ChatMessageIn, Content, ResponseFormat, ToolChoiceIn};
use super::response::Endpoint;
use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::engine::tools::{ToolCall, ToolMode, ToolSpec};
use crate::inference::{Effort, InferenceRequest, Input, Message, OutputFormat, Overflow, Part, ReasoningEffort, Role, Sampling, ToolSet};

pub async fn chat_completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let (core, include_usage, logprobs) = translate(req)?;
    super::answer(&state, core, Endpoint::Chat, include_usage, logprobs).await
}

/// The core request, whether usage is streamed, and whether logprobs were asked for.
pub fn translate(req: ChatCompletionRequest) -> Result<(InferenceRequest, bool, bool), ApiError> {
    req.check_unsupported()?;
    if req.stream_options.is_some() && !req.stream {
        return Err(ApiError::bad_request("stream_options is only allowed with stream: true").param("stream_options"));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("Only n=1 is supported").param("n"));
    }
    let messages = req.messages.into_iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<_>, _>>()?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, top) => Some(top.unwrap_or(0) as usize),
        (false, None) => None,
        (false, Some(_)) => return Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs")),
    };
    let tools = tools(req.tools, req.tool_choice, req.parallel_tool_calls)?;
    let core = InferenceRequest {
        model: req.model,
        keep_alive: req.keep_alive,
        input: Input::Chat(messages),
        tools,
        format: format(req.response_format)?,
        reasoning_effort: reasoning_effort(req.reasoning_effort)?,
        sampling: Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k.map(|k| k as usize),
            seed: req.seed,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            logit_bias: logit_bias(req.logit_bias)?,
        },
        max_tokens: req.max_completion_tokens.or(req.max_tokens).map(|m| m as usize),
        overflow: Overflow::Refuse,
        stop: req.stop.map(|s| s.into_vec()).unwrap_or_default(),
        logprobs,
        prediction: prediction(req.prediction)?,
        endpoint: Endpoint::Chat.name(),
        stream: req.stream,
    };
    Ok((core, req.stream_options.is_some_and(|o| o.include_usage), logprobs.is_some()))
}

/// Predicted Outputs' `prediction`: `{"type": "content", "content": "..."}`, the content a
/// string or text parts (joined), as OpenAI takes it.
fn prediction(v: Option<serde_json::Value>) -> Result<Option<String>, ApiError> {
    use serde_json::Value;
    let bad = |why: &str| Err(ApiError::bad_request(format!("'prediction' {why}")).param("prediction"));
    let object = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return bad("must be an object: {\"type\": \"content\", \"content\": \"...\"}"),
    };
    if let Some(key) = object.keys().find(|k| *k != "type" && *k != "content") {
        return bad(&format!("has an unknown field '{key}'"));
    }
    if object.get("type").and_then(Value::as_str) != Some("content") {
        return bad("needs \"type\": \"content\" (the only type OpenAI defines)");
    }
    match object.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) if part.as_object().is_some_and(|o| o.len() == 2) => text.push_str(t),
                    _ => return bad("content parts must be {\"type\": \"text\", \"text\": \"...\"}"),
                }
            }
            Ok(Some(text))
        }
        _ => bad("needs 'content': a string or an array of text parts"),
    }
}

/// `reasoning_effort`: a level for the core (which refuses it for a model without the control).
fn reasoning_effort(v: Option<serde_json::Value>) -> Result<Option<ReasoningEffort>, ApiError> {
    const PARAM: &str = "reasoning_effort";
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(ReasoningEffort { level: Effort::parse(&s, PARAM)?, param: PARAM })),
        Some(other) => Err(ApiError::bad_request(format!("'{PARAM}' must be a string, got {other}")).param(PARAM)),
    }
}

fn message(index: usize, m: ChatMessageIn) -> Result<Message, ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(format!("messages[{index}]: {what}")).param("messages"));
    let role = match m.role.as_str() {
        // OpenAI's newer "developer" role is what templates call "system".
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => return bad(format!("role '{other}' is not one of system, developer, user, assistant, tool")),
    };
    if m.audio.is_some() || m.function_call.is_some() {
        return bad("'audio' and 'function_call' are not supported (use tool_calls)".into());
    }
    if m.name.is_some() {
        return bad("'name' is not supported: chat templates have no place for participant names".into());
    }
    if m.refusal.is_some() && role != Role::Assistant {
        return bad("only assistant messages carry a 'refusal'".into());
    }
    if m.reasoning_content.is_some() && role != Role::Assistant {
        return bad("only assistant messages carry 'reasoning_content'".into());
    }
    let mut content = match m.content {
        None => vec![],
        Some(Content::Text(t)) => vec![Part::Text(t)],
        Some(Content::Parts(parts)) => {
            let mut out = vec![];
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) if p.other.is_empty() => out.push(Part::Text(t)),
                    ("text", _) => return bad("a text part takes exactly 'type' and 'text'".into()),
                    (kind, _) => return bad(format!("content part type '{kind}' is not supported (text only)")),
                }
            }
            out
        }
    };
    if let Some(r) = m.refusal {
        content.push(Part::Text(r));
    }
    let tool_calls = match m.tool_calls {
        Some(_) if role != Role::Assistant => return bad("only assistant messages carry 'tool_calls'".into()),
        Some(calls) => calls
            .into_iter()
            .map(|c| {
                if c.kind != "function" {
                    return Err(ApiError::bad_request(format!(
                        "messages[{index}].tool_calls: type '{}' is not supported (function only)",
                        c.kind
                    ))
                    .param("messages"));
                }
                Ok(ToolCall { id: c.id, name: c.function.name, arguments: c.function.arguments })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![],
    };
    match (role, &m.tool_call_id) {
        (Role::Tool, None) => return bad("a tool message needs the 'tool_call_id' of the call it answers".into()),
        (Role::Tool, Some(_)) | (_, None) => {}
        (_, Some(_)) => return bad("only tool messages carry a 'tool_call_id'".into()),
    }
    let reasoning = m.reasoning_content.filter(|r| !r.is_empty());
    Ok(Message { role, content, tool_calls, tool_call_id: m.tool_call_id, reasoning })
}

fn tools(
    tools: Option<Vec<super::request::ToolIn>>,
    choice: Option<ToolChoiceIn>,
    parallel: Option<bool>,
) -> Result<Option<ToolSet>, ApiError> {
    let mode = match &choice {
        None => ToolMode::Auto,
        Some(ToolChoiceIn::Mode(m)) => match m.as_str() {
            // The tools are still checked below, then left out.
            "none" => ToolMode::Auto,
            "auto" => ToolMode::Auto,
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::bad_request(format!("tool_choice '{other}' is not one of none, auto, required, or a named function"))
                    .param("tool_choice"))
            }
        },
        Some(ToolChoiceIn::Named(n)) if n.kind == "function" => ToolMode::Named(n.function.name.clone()),
        Some(ToolChoiceIn::Named(n)) => {
            return Err(
                ApiError::bad_request(format!("tool_choice type '{}' is not supported (function only)", n.kind)).param("tool_choice")
            )
        }
    };
    // Without tools there are no calls: what only allows or limits them (`auto`, `none`,
    // `parallel_tool_calls`) holds already; what demands one cannot (the rule of every route).
    let Some(tools) = tools else {
        return match mode {
            ToolMode::Auto => Ok(None),
            _ => Err(ApiError::bad_request("tool_choice asks for a call, which needs 'tools'").param("tool_choice")),
        };
    };
    let specs = tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(ApiError::bad_request(format!("tools[{i}]: type '{}' is not supported (function only)", t.kind)).param("tools"));
            }
            let f = t.function;
            // OpenAI: no parameters means a function without arguments.
            let parameters = f.parameters.unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
            Ok(ToolSpec { name: f.name, description: f.description, parameters })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(&choice, Some(ToolChoiceIn::Mode(m)) if m == "none") {
        return Ok(None);
    }
    Ok(Some(ToolSet { specs, mode, parallel: parallel.unwrap_or(true) }))
}

pub fn format(f: Option<ResponseFormat>) -> Result<Option<OutputFormat>, ApiError> {
    Ok(match f {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(OutputFormat::JsonObject),
        Some(ResponseFormat::JsonSchema { json_schema }) => match json_schema.schema {
            Some(schema) if schema.is_object() || schema.is_boolean() => Some(OutputFormat::JsonSchema(schema)),
            Some(_) => {
                return Err(
                    ApiError::bad_request("response_format.json_schema.schema must be a JSON Schema object").param("response_format")
                )
            }
            // OpenAI: a json_schema without a schema takes any JSON.
            None => Some(OutputFormat::JsonObject),
        },
    })
}

/// At most this many `logit_bias` entries (OpenAI's own limit).
pub const LOGIT_BIAS_MAX_ENTRIES: usize = 300;

/// `{"<token id>": bias}` as OpenAI sends it. Each token id is spelt one way (decimal, no
/// sign or leading zero) and appears once: `"1"` and `"01"` are one token, and their biases
/// would add up past the ±100 each is checked against.
pub fn logit_bias(bias: Option<super::request::LogitBiasIn>) -> Result<Vec<(u32, f32)>, ApiError> {
    let entries = bias.unwrap_or_default().0;
    let bad = |m: String| ApiError::bad_request(m).param("logit_bias");
    if entries.len() > LOGIT_BIAS_MAX_ENTRIES {
        return Err(bad(format!("logit_bias has {} entries; at most {LOGIT_BIAS_MAX_ENTRIES} are allowed", entries.len())));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let id =
            k.parse::<u32>().ok().filter(|id| id.to_string() == k).ok_or_else(|| {
                bad(format!("logit_bias keys must be token ids written in decimal without sign or leading zeros, got '{k}'"))
            })?;
        if !seen.insert(id) {
            return Err(bad(format!("logit_bias names token {id} more than once")));
        }
        out.push((id, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openai::request::LogitBiasIn;

    fn parse(json: &str) -> Result<Vec<(u32, f32)>, String> {
        let raw: LogitBiasIn = serde_json::from_str(json).map_err(|e| e.to_string())?;
        logit_bias(Some(raw)).map_err(|e| e.message)
    }

    #[test]
    fn logit_bias_takes_each_token_once_in_one_spelling() {
        assert_eq!(parse(r#"{"1": 5, "20": -100}"#).unwrap(), vec![(1, 5.0), (20, -100.0)]);
        for spelling in [r#"{"01": 1}"#, r#"{"+1": 1}"#, r#"{" 1": 1}"#, r#"{"1.0": 1}"#, r#"{"-1": 1}"#] {
            assert!(parse(spelling).unwrap_err().contains("leading zeros"), "{spelling}");
        }
        // One token three times: 3 × 100 would pass the ±100 check entry by entry.
        assert!(parse(r#"{"1": 100, "1": 100, "1": 100}"#).unwrap_err().contains("more than once"));
        let many = (0..=LOGIT_BIAS_MAX_ENTRIES).map(|i| format!("\"{i}\": 1")).collect::<Vec<_>>().join(",");
        assert!(parse(&format!("{{{many}}}")).unwrap_err().contains("entries"));
        let at_limit = (0..LOGIT_BIAS_MAX_ENTRIES).map(|i| format!("\"{i}\": 1")).collect::<Vec<_>>().join(",");
        assert_eq!(parse(&format!("{{{at_limit}}}")).unwrap().len(), LOGIT_BIAS_MAX_ENTRIES);
    }

    fn messages_of(v: serde_json::Value) -> Result<Vec<Message>, String> {
        let req: ChatCompletionRequest = serde_json::from_value(serde_json::json!({"messages": v})).map_err(|e| e.to_string())?;
        match translate(req).map_err(|e| e.message)?.0.input {
            Input::Chat(m) => Ok(m),
            _ => unreachable!("a chat request is a conversation"),
        }
    }

    #[test]
    fn reasoning_content_sent_back_is_the_assistant_turns_reasoning() {
        let m = messages_of(serde_json::json!([
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": null, "reasoning_content": "Need the clock.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
            {"role": "assistant", "content": "Noon.", "reasoning_content": ""},
        ]))
        .unwrap();
        assert_eq!(m[1].reasoning.as_deref(), Some("Need the clock."));
        assert_eq!(m[1].tool_calls[0].name, "get_time");
        assert_eq!(m[3].reasoning, None, "an empty reasoning is none");
        let err = messages_of(serde_json::json!([{"role": "user", "content": "x", "reasoning_content": "y"}])).unwrap_err();
        assert!(err.contains("only assistant messages carry 'reasoning_content'"), "{err}");
        // fields OpenAI does not have stay refused
        assert!(messages_of(serde_json::json!([{"role": "assistant", "content": "x", "reasoning": "y"}])).is_err());
    }
}
