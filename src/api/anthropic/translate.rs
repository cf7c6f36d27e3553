//! Anthropic's request in the core's terms: the system prompt, user turns whose
//! `tool_result` blocks become tool messages, assistant turns whose `tool_use` blocks become
//! calls (and whose `thinking` blocks, sent back, their reasoning), tools with their `input_schema`, `tool_choice`,
//! `output_config` (`format`, and `effort` as the reasoning effort), `thinking` (disabled or adaptive), sampling.
use serde_json::{Map, Value};

use super::request::{Content, CountTokensRequest, MessageIn, MessagesRequest};
use crate::api::error::ApiError;
use crate::engine::tools::{ToolCall, ToolMode, ToolSpec};
use crate::inference::{Effort, InferenceRequest, Input, Message, OutputFormat, Overflow, Part, ReasoningEffort, Role, Sampling, ToolSet};

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

pub fn messages(req: MessagesRequest) -> Result<InferenceRequest, ApiError> {
    check_options(Options {
        thinking: &req.thinking,
        service_tier: &req.service_tier,
        speed: &req.speed,
        cache_control: &req.cache_control,
        refused: &[
            ("container", &req.container),
            ("mcp_servers", &req.mcp_servers),
            ("context_management", &req.context_management),
            ("diagnostics", &req.diagnostics),
            ("inference_geo", &req.inference_geo),
        ],
    })?;
    if req.max_tokens == 0 {
        return Err(bad("max_tokens: must be at least 1"));
    }
    let tools = tools(req.tools, req.tool_choice)?;
    let (format, reasoning_effort) = output_config(req.output_config)?;
    Ok(InferenceRequest {
        model: Some(req.model),
        keep_alive: req.keep_alive,
        input: Input::Chat(conversation(req.system, req.messages)?),
        tools,
        format,
        reasoning_effort,
        sampling: Sampling { temperature: req.temperature, top_p: req.top_p, top_k: req.top_k.map(|k| k as usize), ..Sampling::default() },
        max_tokens: Some(req.max_tokens as usize),
        overflow: Overflow::Refuse,
        stop: req.stop_sequences.unwrap_or_default(),
        logprobs: None,
        prediction: None,
        endpoint: super::ENDPOINT,
        stream: req.stream,
    })
}

pub fn count_tokens(req: CountTokensRequest) -> Result<InferenceRequest, ApiError> {
    check_options(Options {
        thinking: &req.thinking,
        service_tier: &None,
        speed: &req.speed,
        cache_control: &req.cache_control,
        refused: &[("mcp_servers", &req.mcp_servers), ("context_management", &req.context_management)],
    })?;
    let (format, reasoning_effort) = output_config(req.output_config)?;
    Ok(InferenceRequest {
        model: Some(req.model),
        keep_alive: None,
        input: Input::Chat(conversation(req.system, req.messages)?),
        tools: tools(req.tools, req.tool_choice)?,
        format,
        reasoning_effort,
        sampling: Sampling::default(),
        max_tokens: None,
        overflow: Overflow::Refuse,
        stop: vec![],
        logprobs: None,
        prediction: None,
        endpoint: "count_tokens",
        stream: false,
    })
}

/// The request-level options that do not shape the prompt.
struct Options<'a> {
    thinking: &'a Option<Value>,
    service_tier: &'a Option<Value>,
    speed: &'a Option<Value>,
    cache_control: &'a Option<Value>,
    /// Known fields mlxbar does not do: refused when sent.
    refused: &'a [(&'static str, &'a Option<Value>)],
}

fn check_options(o: Options) -> Result<(), ApiError> {
    match o.thinking {
        None | Some(Value::Null) => {}
        // Adaptive: the model decides whether to think, which is what every model here does
        // (a reasoning model's reasoning comes back as thinking blocks, others answer directly).
        Some(t)
            if matches!(t.get("type").and_then(Value::as_str), Some("disabled" | "adaptive"))
                && t.as_object().is_some_and(|o| o.len() == 1) => {}
        Some(_) => {
            return Err(bad("thinking: a thinking budget ({\"type\": \"enabled\", \"budget_tokens\": …}) is not supported by mlxbar: \
                 send {\"type\": \"adaptive\"} (a reasoning model thinks as it does; output_config.effort sets gpt-oss's effort), \
                 {\"type\": \"disabled\"} or nothing"))
        }
    }
    // One local server: one tier and one speed, which these values ask for.
    match o.service_tier.as_ref().map(Value::as_str) {
        None | Some(Some("auto" | "standard_only")) => {}
        Some(_) => return Err(bad("service_tier: one server, one tier: send \"auto\", \"standard_only\" or nothing")),
    }
    match o.speed.as_ref().map(Value::as_str) {
        None | Some(Some("standard")) => {}
        Some(_) => return Err(bad("speed: mlxbar has one speed: send \"standard\" or nothing")),
    }
    check_cache_control(o.cache_control.as_ref(), "request")?;
    for (name, v) in o.refused {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(format!("{name}: not supported by mlxbar")));
        }
    }
    Ok(())
}

/// `cache_control` on a block: prompt prefixes are cached anyway (the prefix cache reuses
/// any repeated prefix), so Anthropic's ephemeral marker is what mlxbar does already.
fn check_cache_control(v: Option<&Value>, at: &str) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(c) if c.get("type").and_then(Value::as_str) == Some("ephemeral") => Ok(()),
        Some(_) => Err(bad(format!("{at}.cache_control: only {{\"type\": \"ephemeral\"}} is supported"))),
    }
}

/// The block's object, with no field beyond `allowed` (besides `type` and `cache_control`).
fn block<'a>(v: &'a Value, at: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>, ApiError> {
    let o = v.as_object().ok_or_else(|| bad(format!("{at}: a content block is an object")))?;
    if let Some(extra) = o.keys().find(|k| !allowed.contains(&k.as_str()) && *k != "type" && *k != "cache_control") {
        return Err(bad(format!("{at}.{extra}: Extra inputs are not permitted")));
    }
    check_cache_control(o.get("cache_control"), at)?;
    Ok(o)
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    o.get(key).and_then(Value::as_str).ok_or_else(|| bad(format!("{at}.{key}: Field required (a string)")))
}

/// A text block's text (`citations` only as null or absent).
fn text_block(v: &Value, at: &str) -> Result<String, ApiError> {
    let o = block(v, at, &["text", "citations"])?;
    if o.get("citations").is_some_and(|c| !c.is_null()) {
        return Err(bad(format!("{at}.citations: not supported by mlxbar")));
    }
    Ok(string(o, "text", at)?.to_string())
}

fn block_type<'a>(v: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    v.get("type").and_then(Value::as_str).ok_or_else(|| bad(format!("{at}.type: Field required")))
}

fn unsupported_block(kind: &str, at: &str) -> ApiError {
    match kind {
        "thinking" | "redacted_thinking" => bad(format!("{at}: '{kind}' blocks belong to assistant turns")),
        _ => bad(format!("{at}: content block type '{kind}' is not supported (text, tool_use and tool_result are)")),
    }
}

fn conversation(system: Option<Content>, messages: Vec<MessageIn>) -> Result<Vec<Message>, ApiError> {
    let mut out = vec![];
    if let Some(system) = system {
        let text = match system {
            Content::Text(t) => t,
            Content::Blocks(blocks) => {
                let mut parts = vec![];
                for (i, b) in blocks.iter().enumerate() {
                    let at = format!("system.{i}");
                    match block_type(b, &at)? {
                        "text" => parts.push(text_block(b, &at)?),
                        other => return Err(bad(format!("{at}: system blocks are text, got '{other}'"))),
                    }
                }
                parts.join("\n")
            }
        };
        out.push(Message::plain(Role::System, text));
    }
    let last = messages.len().checked_sub(1);
    if last.is_none() {
        return Err(bad("messages: at least one message is required"));
    }
    for (i, m) in messages.into_iter().enumerate() {
        let at = format!("messages.{i}");
        match m.role.as_str() {
            "user" => user_turn(m.content, &at, &mut out)?,
            "assistant" if Some(i) == last => {
                return Err(bad(format!(
                    "{at}: a final assistant message (a prefill for the answer to continue) is not supported; end with a user message"
                )))
            }
            "assistant" => out.push(assistant_turn(m.content, &at)?),
            other => return Err(bad(format!("{at}.role: '{other}' is not one of user, assistant (the system prompt goes in 'system')"))),
        }
    }
    Ok(out)
}

/// A user turn: its `tool_result` blocks become tool messages, its text one user message.
fn user_turn(content: Content, at: &str, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(t) => {
            out.push(Message::plain(Role::User, t));
            return Ok(());
        }
        Content::Blocks(b) => b,
    };
    let mut text = vec![];
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content.{j}");
        match block_type(b, &at)? {
            "text" => text.push(Part::Text(text_block(b, &at)?)),
            "tool_result" => {
                let o = block(b, &at, &["tool_use_id", "content", "is_error"])?;
                let id = string(o, "tool_use_id", &at)?.to_string();
                let mut result = match o.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => {
                        let mut s = vec![];
                        for (k, p) in parts.iter().enumerate() {
                            let at = format!("{at}.content.{k}");
                            match block_type(p, &at)? {
                                "text" => s.push(text_block(p, &at)?),
                                other => return Err(unsupported_block(other, &at)),
                            }
                        }
                        s.join("\n")
                    }
                    Some(_) => return Err(bad(format!("{at}.content: a string or text blocks"))),
                };
                // Chat templates have no place for the flag: the model reads it in the text.
                match o.get("is_error") {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => result = format!("Error: {result}"),
                    Some(_) => return Err(bad(format!("{at}.is_error: a boolean"))),
                }
                out.push(Message { tool_call_id: Some(id), ..Message::plain(Role::Tool, result) });
            }
            other => return Err(unsupported_block(other, &at)),
        }
    }
    if !text.is_empty() {
        out.push(Message { role: Role::User, content: text, tool_calls: vec![], tool_call_id: None, reasoning: None });
    }
    Ok(())
}

/// An assistant turn of the history: its text, its `tool_use` blocks as calls and its
/// `thinking` blocks as its reasoning. A thinking block's `signature` is not checked (mlxbar
/// signs none: it sends an empty one); a `redacted_thinking` block is another server's
/// encrypted reasoning, which no template can read: accepted, and left out of the prompt.
fn assistant_turn(content: Content, at: &str) -> Result<Message, ApiError> {
    let mut message = Message { role: Role::Assistant, content: vec![], tool_calls: vec![], tool_call_id: None, reasoning: None };
    let blocks = match content {
        Content::Text(t) => {
            message.content.push(Part::Text(t));
            return Ok(message);
        }
        Content::Blocks(b) => b,
    };
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content.{j}");
        match block_type(b, &at)? {
            "text" => message.content.push(Part::Text(text_block(b, &at)?)),
            "tool_use" => {
                let o = block(b, &at, &["id", "name", "input"])?;
                let input = o.get("input").filter(|i| i.is_object()).ok_or_else(|| bad(format!("{at}.input: an object")))?;
                message.tool_calls.push(ToolCall {
                    id: string(o, "id", &at)?.to_string(),
                    name: string(o, "name", &at)?.to_string(),
                    arguments: input.to_string(),
                });
            }
            "thinking" => {
                let o = block(b, &at, &["thinking", "signature"])?;
                let thinking = string(o, "thinking", &at)?;
                match o.get("signature") {
                    None | Some(Value::Null) | Some(Value::String(_)) => {}
                    Some(_) => return Err(bad(format!("{at}.signature: a string"))),
                }
                if !thinking.is_empty() {
                    message.reasoning = Some(match message.reasoning.take() {
                        Some(before) => format!("{before}\n{thinking}"),
                        None => thinking.to_string(),
                    });
                }
            }
            "redacted_thinking" => {
                string(block(b, &at, &["data"])?, "data", &at)?;
            }
            other => return Err(unsupported_block(other, &at)),
        }
    }
    Ok(message)
}

/// Client tools (`name`, `description`, `input_schema`) and `tool_choice`.
fn tools(tools: Option<Vec<Value>>, choice: Option<Value>) -> Result<Option<ToolSet>, ApiError> {
    let (mode, parallel) = match &choice {
        None => (Some(ToolMode::Auto), true),
        Some(c) => {
            let o = c.as_object().ok_or_else(|| bad("tool_choice: an object with a 'type'"))?;
            let allowed: &[&str] = match o.get("type").and_then(Value::as_str) {
                Some("tool") => &["type", "name", "disable_parallel_tool_use"],
                Some("none") => &["type"],
                _ => &["type", "disable_parallel_tool_use"],
            };
            if let Some(extra) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
                return Err(bad(format!("tool_choice.{extra}: Extra inputs are not permitted")));
            }
            let parallel = match o.get("disable_parallel_tool_use") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => !b,
                Some(_) => return Err(bad("tool_choice.disable_parallel_tool_use: a boolean")),
            };
            let mode = match o.get("type").and_then(Value::as_str) {
                Some("auto") => Some(ToolMode::Auto),
                Some("any") => Some(ToolMode::Required),
                Some("tool") => Some(ToolMode::Named(
                    o.get("name").and_then(Value::as_str).ok_or_else(|| bad("tool_choice.name: Field required"))?.to_string(),
                )),
                // The tools are still checked below, then left out.
                Some("none") => None,
                other => return Err(bad(format!("tool_choice.type: {other:?} is not one of auto, any, tool, none"))),
            };
            (mode, parallel)
        }
    };
    // Without tools there are no calls: `auto` and `none` (and `disable_parallel_tool_use`)
    // hold already; `any` and `tool` demand one and cannot (the rule of every route).
    let Some(tools) = tools else {
        return match mode {
            None | Some(ToolMode::Auto) => Ok(None),
            Some(_) => Err(bad("tool_choice: asks for a call, which needs 'tools'")),
        };
    };
    let mut specs = vec![];
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools.{i}");
        let o = t.as_object().ok_or_else(|| bad(format!("{at}: a tool is an object")))?;
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(kind) => {
                return Err(bad(format!("{at}.type: server tool '{kind}' is not supported (client tools with an input_schema are)")))
            }
        }
        if let Some(extra) = o.keys().find(|k| !["type", "name", "description", "input_schema", "cache_control"].contains(&k.as_str())) {
            return Err(bad(format!("{at}.{extra}: Extra inputs are not permitted")));
        }
        check_cache_control(o.get("cache_control"), &at)?;
        let name = string(o, "name", &at)?.to_string();
        let description = match o.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(bad(format!("{at}.description: a string"))),
        };
        let parameters = o
            .get("input_schema")
            .filter(|s| s.is_object())
            .cloned()
            .ok_or_else(|| bad(format!("{at}.input_schema: Field required (a JSON Schema object)")))?;
        specs.push(ToolSpec { name, description, parameters });
    }
    Ok(mode.map(|mode| ToolSet { specs, mode, parallel }))
}

/// `output_config`: `format` (`{"type": "json_schema", "schema": {…}}`) and `effort`
/// ("low", "medium", "high": a harmony model's reasoning effort, as the other dialects'
/// fields give it; any other model answers 400 naming it).
fn output_config(config: Option<Value>) -> Result<(Option<OutputFormat>, Option<ReasoningEffort>), ApiError> {
    const EFFORT: &str = "output_config.effort";
    let Some(config) = config else { return Ok((None, None)) };
    let o = config.as_object().ok_or_else(|| bad("output_config: an object"))?;
    if let Some(extra) = o.keys().find(|k| !["format", "effort"].contains(&k.as_str())) {
        return Err(bad(format!("output_config.{extra}: not supported by mlxbar (output_config takes 'format' and 'effort')")));
    }
    let effort = match o.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => Some(ReasoningEffort { level: Effort::parse(e, EFFORT)?, param: EFFORT }),
        Some(_) => return Err(bad(format!("{EFFORT}: \"low\", \"medium\" or \"high\""))),
    };
    let Some(format) = o.get("format").filter(|f| !f.is_null()) else { return Ok((None, effort)) };
    let f = format.as_object().ok_or_else(|| bad("output_config.format: an object"))?;
    if let Some(extra) = f.keys().find(|k| !["type", "schema"].contains(&k.as_str())) {
        return Err(bad(format!("output_config.format.{extra}: Extra inputs are not permitted")));
    }
    match f.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        other => return Err(bad(format!("output_config.format.type: {other:?} is not 'json_schema'"))),
    }
    match f.get("schema") {
        Some(s) if s.is_object() => Ok((Some(OutputFormat::JsonSchema(s.clone())), effort)),
        _ => Err(bad("output_config.format.schema: Field required (a JSON Schema object)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conversation_of(turns: Value) -> Result<Vec<Message>, String> {
        let req: MessagesRequest =
            serde_json::from_value(json!({"model": "m", "max_tokens": 8, "messages": turns})).map_err(|e| e.to_string())?;
        match messages(req).map_err(|e| e.message)?.input {
            Input::Chat(m) => Ok(m),
            _ => unreachable!("a Messages request is a conversation"),
        }
    }

    #[test]
    fn adaptive_thinking_and_effort_are_taken_and_a_budget_refused() {
        let req = |extra: Value| {
            let mut body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            messages(serde_json::from_value(body).unwrap())
        };
        let r = req(json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}})).unwrap();
        assert_eq!(r.reasoning_effort, Some(ReasoningEffort { level: Effort::High, param: "output_config.effort" }));
        assert!(req(json!({"thinking": {"type": "disabled"}})).unwrap().reasoning_effort.is_none());
        let err = |extra| req(extra).err().expect("refused").message;
        assert!(err(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})).contains("adaptive"));
        assert!(err(json!({"output_config": {"effort": "extreme"}})).contains("output_config.effort"));
        assert!(err(json!({"output_config": {"effort": 3}})).contains("output_config.effort"));
    }

    #[test]
    fn thinking_blocks_sent_back_are_the_assistant_turns_reasoning() {
        let m = conversation_of(json!([
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the clock.", "signature": ""},
                {"type": "redacted_thinking", "data": "c2VjcmV0"},
                {"type": "thinking", "thinking": "Call it.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"}]},
        ]))
        .unwrap();
        assert_eq!(m[1].reasoning.as_deref(), Some("Need the clock.\nCall it."));
        assert_eq!((m[1].text().as_str(), m[1].tool_calls[0].name.as_str()), ("", "get_time"));
        assert_eq!(m[2].tool_call_id.as_deref(), Some("toolu_1"));
        // a user turn has no thinking; a thinking block's fields are checked
        let user = conversation_of(json!([{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]));
        assert!(user.unwrap_err().contains("belong to assistant turns"));
        let extra = json!([{"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "budget": 1}]}, {"role": "user", "content": "y"}]);
        assert!(conversation_of(extra).unwrap_err().contains("messages.0.content.0.budget"));
        let redacted = json!([{"role": "assistant", "content": [{"type": "redacted_thinking"}]}, {"role": "user", "content": "y"}]);
        assert!(conversation_of(redacted).unwrap_err().contains("data"));
    }
}
