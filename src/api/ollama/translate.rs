//! Ollama's requests in the core's terms: chat messages (tool calls in the history, `tool`
//! messages answering them, an assistant's `thinking` sent back), generate's `system` + `prompt`, `tools`, `format` (`"json"` or
//! a JSON Schema, through the constrained decoder), `options`, `keep_alive`, `logprobs`.
//! `think` (true, false or a level) sets a harmony model's reasoning effort; the core refuses
//! it for other models. What mlxbar cannot do is refused by name: `images`, `raw`,
//! `template`, `suffix`, `context` and image generation's fields.
use serde_json::{Map, Value};

use super::options::{self, Options};
use super::request::{ChatRequest, GenerateRequest, MessageIn};
use crate::api::error::ApiError;
use crate::engine::tools::{ToolCall, ToolMode, ToolSpec};
use crate::inference::{Effort, InferenceRequest, Input, Message, OutputFormat, Overflow, ReasoningEffort, Role, ToolSet};

/// The core's request and what only the handler can check (`num_ctx` against the model).
pub struct Translated {
    pub core: InferenceRequest,
    pub num_ctx: Option<usize>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// `model` is the library id [`super::names::model_id`] found for the request's name.
pub fn chat(req: ChatRequest, model: String) -> Result<Translated, ApiError> {
    let effort = think(req.think.as_ref())?;
    let options = options::parse(req.options)?;
    let format = format(req.format)?;
    let tools = tools(req.tools)?;
    let messages = conversation(req.messages)?;
    Ok(core(
        model,
        Input::Chat(messages),
        (tools, format, effort),
        options,
        req.keep_alive,
        logprobs(req.logprobs, req.top_logprobs)?,
        req.stream,
        super::CHAT,
    ))
}

/// `chat_template`: whether the model has one; without, the prompt goes to it as text
/// (Ollama's template is then `{{ .System }}{{ .Prompt }}` too).
pub fn generate(req: GenerateRequest, model: String, chat_template: bool) -> Result<Translated, ApiError> {
    let effort = think(req.think.as_ref())?;
    let refused = [
        ("suffix", req.suffix.as_ref().is_some_and(|s| !s.is_empty()), "fill-in-the-middle is not supported by mlxbar"),
        ("template", req.template.as_ref().is_some_and(|s| !s.is_empty()), "mlxbar renders the model's own chat template"),
        ("context", req.context.as_ref().is_some_and(|c| !c.is_empty()), "send the conversation to /api/chat instead of token context"),
        ("raw", req.raw == Some(true), "raw prompts are not supported here; use /v1/completions"),
        ("images", req.images.as_ref().is_some_and(|i| !i.is_empty()), "mlxbar's models read text only"),
        ("width", req.width.is_some(), "image generation is not supported by mlxbar"),
        ("height", req.height.is_some(), "image generation is not supported by mlxbar"),
        ("steps", req.steps.is_some(), "image generation is not supported by mlxbar"),
    ];
    if let Some((name, _, why)) = refused.iter().find(|(_, asked, _)| *asked) {
        return Err(bad(format!("{name}: {why}")));
    }
    let options = options::parse(req.options)?;
    let format = format(req.format)?;
    let prompt = req.prompt.unwrap_or_default();
    let input = if chat_template {
        let mut messages = vec![];
        if let Some(system) = req.system.filter(|s| !s.is_empty()) {
            messages.push(Message::plain(Role::System, system));
        }
        messages.push(Message::plain(Role::User, prompt));
        Input::Chat(messages)
    } else {
        Input::Text(format!("{}{prompt}", req.system.unwrap_or_default()))
    };
    Ok(core(
        model,
        input,
        (None, format, effort),
        options,
        req.keep_alive,
        logprobs(req.logprobs, req.top_logprobs)?,
        req.stream,
        super::GENERATE,
    ))
}

#[allow(clippy::too_many_arguments)]
fn core(
    model: String,
    input: Input,
    (tools, format, reasoning_effort): (Option<ToolSet>, Option<OutputFormat>, Option<ReasoningEffort>),
    o: Options,
    keep_alive: Option<crate::registry::KeepAlive>,
    logprobs: Option<usize>,
    stream: bool,
    endpoint: &'static str,
) -> Translated {
    Translated {
        core: InferenceRequest {
            model: Some(model),
            keep_alive,
            input,
            tools,
            format,
            reasoning_effort,
            sampling: o.sampling,
            max_tokens: o.max_tokens,
            // Ollama's window: `num_ctx` (else the model's context) holds prompt and answer;
            // a conversation past it loses its oldest turns, as Ollama's server cuts it.
            overflow: Overflow::Trim { window: o.num_ctx },
            stop: o.stop,
            logprobs,
            prediction: None,
            endpoint,
            stream,
        },
        num_ctx: o.num_ctx,
    }
}

/// `think`: false or absent asks nothing; true (gpt-oss's default, "medium") or a level asks
/// for reasoning, which the core refuses for a model that cannot reason, as Ollama does.
/// (A harmony model reasons whatever `think` says: false does not turn it off, as in Ollama.)
fn think(think: Option<&Value>) -> Result<Option<ReasoningEffort>, ApiError> {
    const PARAM: &str = "think";
    let level = match think {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
        Some(Value::Bool(true)) => Effort::Medium,
        Some(Value::String(s)) => {
            Effort::parse(s, PARAM).map_err(|_| bad(format!("think: {s:?} is not true, false, \"low\", \"medium\" or \"high\"")))?
        }
        Some(other) => return Err(bad(format!("think: {other} is not true, false, \"low\", \"medium\" or \"high\""))),
    };
    Ok(Some(ReasoningEffort { level, param: PARAM }))
}

/// `logprobs: true` (and `top_logprobs`, the alternatives per token, 0-20).
fn logprobs(on: Option<bool>, top: Option<u32>) -> Result<Option<usize>, ApiError> {
    match (on.unwrap_or(false), top) {
        (true, top) => Ok(Some(top.unwrap_or(0) as usize)),
        (false, Some(n)) if n > 0 => Err(bad("top_logprobs: needs logprobs: true")),
        (false, _) => Ok(None),
    }
}

/// `format`: `"json"` (any JSON object), a JSON Schema object, or `""`/null (free text).
fn format(format: Option<Value>) -> Result<Option<OutputFormat>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(OutputFormat::JsonObject)),
        Some(Value::Object(schema)) => Ok(Some(OutputFormat::JsonSchema(Value::Object(schema)))),
        Some(other) => Err(bad(format!("format: \"json\" or a JSON Schema object, got {other}"))),
    }
}

/// `tools`: `[{"type": "function", "function": {"name", "description", "parameters"}}]`;
/// the model may call them (Ollama has no tool choice), several at once.
fn tools(tools: Option<Vec<Value>>) -> Result<Option<ToolSet>, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else { return Ok(None) };
    let mut specs = vec![];
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t.as_object().ok_or_else(|| bad(format!("{at}: a tool is an object")))?;
        only(o, &["type", "function"], &at)?;
        match o.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "function" => {}
            Some(other) => return Err(bad(format!("{at}.type: only \"function\" tools are supported, got {other}"))),
        }
        let at = format!("{at}.function");
        let f = o.get("function").and_then(Value::as_object).ok_or_else(|| bad(format!("{at}: required (an object)")))?;
        only(f, &["name", "description", "parameters"], &at)?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad(format!("{at}.name: required (a string)")))?.to_string();
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(bad(format!("{at}.description: a string"))),
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad(format!("{at}.parameters: a JSON Schema object"))),
        };
        specs.push(ToolSpec { name, description, parameters });
    }
    Ok(Some(ToolSet { specs, mode: ToolMode::Auto, parallel: true }))
}

fn only(o: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(extra) => Err(bad(format!("{at}.{extra}: unknown field"))),
        None => Ok(()),
    }
}

/// The messages; a `tool` message answers the latest assistant's call of its `tool_name`
/// (else the next call not yet answered), so the template sees which call it answers.
fn conversation(messages: Vec<MessageIn>) -> Result<Vec<Message>, ApiError> {
    if messages.last().is_some_and(|m| m.role == "assistant") {
        return Err(bad(format!(
            "messages[{}]: a final assistant message (a prefill for the answer to continue) is not supported; end with a user or tool message",
            messages.len() - 1
        )));
    }
    let mut out: Vec<Message> = vec![];
    // The latest assistant turn's calls, and which of them have an answer.
    let mut calls: Vec<(ToolCall, bool)> = vec![];
    for (i, m) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(bad(format!("{at}.images: mlxbar's models read text only")));
        }
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => return Err(bad(format!("{at}.role: '{other}' is not one of system, user, assistant, tool"))),
        };
        if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) && role != Role::Assistant {
            return Err(bad(format!("{at}.tool_calls: only assistant messages make calls")));
        }
        if m.tool_name.is_some() && role != Role::Tool {
            return Err(bad(format!("{at}.tool_name: only tool messages name a tool")));
        }
        let thinking = m.thinking.filter(|t| !t.is_empty());
        if thinking.is_some() && role != Role::Assistant {
            return Err(bad(format!("{at}.thinking: only assistant messages carry reasoning")));
        }
        let mut message = Message { reasoning: thinking, ..Message::plain(role, m.content) };
        match role {
            Role::Assistant => {
                calls.clear();
                for (j, c) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    if !c.function.arguments.is_object() {
                        return Err(bad(format!("{at}.tool_calls[{j}].function.arguments: an object")));
                    }
                    let id = c.id.unwrap_or_else(|| format!("call_{i}_{j}"));
                    let call = ToolCall { id, name: c.function.name, arguments: c.function.arguments.to_string() };
                    calls.push((call.clone(), false));
                    message.tool_calls.push(call);
                }
            }
            Role::Tool => {
                let answered = match &m.tool_name {
                    Some(name) => calls.iter_mut().find(|(c, done)| !done && c.name == *name),
                    None => calls.iter_mut().find(|(_, done)| !done),
                };
                message.tool_call_id = answered.map(|(c, done)| {
                    *done = true;
                    c.id.clone()
                });
            }
            _ => {}
        }
        out.push(message);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_of(v: Value) -> Result<Translated, String> {
        let req: ChatRequest = serde_json::from_value(v).map_err(|e| e.to_string())?;
        chat(req, "m".into()).map_err(|e| e.message)
    }

    #[test]
    fn a_tool_round_trip_links_results_to_calls() {
        let t = chat_of(json!({"model": "m", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ]}))
        .unwrap();
        let Input::Chat(m) = t.core.input else { panic!() };
        assert_eq!(m[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[2].tool_call_id.as_deref(), Some(m[1].tool_calls[0].id.as_str()));
        assert!(t.core.stream, "Ollama streams by default");
    }

    #[test]
    fn thinking_sent_back_is_the_assistant_turns_reasoning() {
        let t = chat_of(json!({"model": "m", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "thinking": "Look it up.", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "assistant", "content": "Sunny.", "thinking": ""},
            {"role": "user", "content": "thanks"},
        ]}))
        .unwrap();
        let Input::Chat(m) = t.core.input else { panic!() };
        assert_eq!(m[1].reasoning.as_deref(), Some("Look it up."));
        assert_eq!(m[3].reasoning, None, "an empty thinking is none");
        let err = refusal(json!({"model": "m", "messages": [{"role": "user", "content": "x", "thinking": "y"}]}));
        assert!(err.contains("thinking"), "{err}");
    }

    fn refusal(v: Value) -> String {
        chat_of(v).err().expect("refused")
    }

    #[test]
    fn what_mlxbar_cannot_do_is_named() {
        // a level is the core's to refuse for a model without one; a bad one is refused here
        assert!(refusal(json!({"model": "m", "think": "extreme", "messages": []})).starts_with("think"));
        assert!(refusal(json!({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})).contains("images"));
        assert!(refusal(json!({"model": "m", "format": 3, "messages": []})).contains("format"));
        assert!(
            chat_of(json!({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})).is_err()
        );
        let generate = |v: Value| generate(serde_json::from_value(v).unwrap(), "m".into(), true).map(|_| ()).map_err(|e| e.message);
        for field in ["suffix", "template", "raw", "context"] {
            let value = if field == "raw" {
                json!(true)
            } else if field == "context" {
                json!([1, 2])
            } else {
                json!("x")
            };
            let err = generate(json!({"model": "m", "prompt": "p", field: value})).unwrap_err();
            assert!(err.starts_with(field), "{err}");
        }
        assert!(generate(json!({"model": "m", "prompt": "p", "raw": false, "context": [], "think": false})).is_ok());
    }
}
