//! A Responses request in the core's terms — the conversation ([`super::input`]), function
//! tools and `tool_choice`, `text.format`, sampling, `include` of logprobs — and the
//! parameters the Response object repeats back ([`Echo`]). The options that need a server
//! keeping state (`store: true`, `previous_response_id`, `conversation`, `background`) and
//! the hosted tools are refused by name.
use serde_json::{json, Map, Value};

use super::input::conversation;
use super::request::ResponsesRequest;
use crate::api::error::ApiError;
use crate::engine::tools::{ToolMode, ToolSpec};
use crate::inference::{Effort, InferenceRequest, Input, OutputFormat, Overflow, ReasoningEffort, Sampling, ToolSet};

/// The `include` values mlxbar has: logprobs on `output_text`, and the reasoning as an opaque
/// token a stateless client sends back ([`super::sealed`]).
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";
pub const INCLUDE_SEALED_REASONING: &str = "reasoning.encrypted_content";

/// What the Response object repeats of the request.
#[derive(Debug, Clone)]
pub struct Echo {
    /// The request's parameters as the Response shows them (`tools`, `tool_choice`, `text`…).
    pub params: Map<String, Value>,
    /// `include` asked for logprobs: each `output_text` carries them.
    pub logprobs: bool,
    /// `reasoning.summary` was asked for: a reasoning item's summary is its whole text.
    pub summary: bool,
    /// `include` asked for `reasoning.encrypted_content`: reasoning items carry it.
    pub sealed_reasoning: bool,
}

fn refuse(param: &'static str, why: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' is not supported: {why}")).param(param)
}

/// An f32 as the client wrote it (0.2, not 0.20000000298).
pub fn number(x: f32) -> Value {
    x.to_string().parse::<f64>().map(Value::from).unwrap_or(Value::Null)
}

pub fn translate(req: ResponsesRequest) -> Result<(InferenceRequest, Echo), ApiError> {
    check_unsupported(&req)?;
    let include = req.include.as_deref().unwrap_or_default();
    if let Some(other) = include.iter().find(|i| *i != INCLUDE_LOGPROBS && *i != INCLUDE_SEALED_REASONING) {
        return Err(ApiError::bad_request(format!(
            "include: '{other}' is not supported (only '{INCLUDE_LOGPROBS}' and '{INCLUDE_SEALED_REASONING}')"
        ))
        .param("include"));
    }
    let sealed_reasoning = include.iter().any(|i| i == INCLUDE_SEALED_REASONING);
    let logprobs = match (include.iter().any(|i| i == INCLUDE_LOGPROBS), req.top_logprobs) {
        (true, top) => Some(top.unwrap_or(0) as usize),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ApiError::bad_request(format!("top_logprobs needs include: [\"{INCLUDE_LOGPROBS}\"]")).param("top_logprobs"))
        }
    };
    let tools = tools(req.tools.as_deref(), req.tool_choice.as_ref(), req.parallel_tool_calls)?;
    let (format, text) = text_format(req.text.as_ref())?;
    let (reasoning_effort, summary) = reasoning(req.reasoning.as_ref())?;
    let mut params = Map::new();
    params.insert("instructions".into(), json!(req.instructions));
    params.insert("tools".into(), json!(req.tools.clone().unwrap_or_default()));
    params.insert("tool_choice".into(), req.tool_choice.clone().unwrap_or(json!("auto")));
    params.insert("parallel_tool_calls".into(), json!(req.parallel_tool_calls.unwrap_or(true)));
    params.insert("max_output_tokens".into(), json!(req.max_output_tokens));
    params.insert("top_logprobs".into(), json!(req.top_logprobs));
    params.insert("text".into(), text);
    params.insert("metadata".into(), json!(req.metadata.clone().unwrap_or_default()));
    params.insert("user".into(), json!(req.user));
    params.insert("safety_identifier".into(), json!(req.safety_identifier));
    params.insert("prompt_cache_key".into(), json!(req.prompt_cache_key));
    params.insert("store".into(), json!(false));
    params.insert("background".into(), json!(false));
    params.insert("previous_response_id".into(), Value::Null);
    let echoed = match (&reasoning_effort, summary) {
        (None, None) => Value::Null,
        (effort, summary) => json!({"effort": effort.as_ref().map(|r| r.level.as_str()), "summary": summary}),
    };
    params.insert("reasoning".into(), echoed);
    params.insert("service_tier".into(), json!("default"));
    params.insert("truncation".into(), json!("disabled"));
    if let Some(t) = req.temperature {
        params.insert("temperature".into(), number(t));
    }
    if let Some(p) = req.top_p {
        params.insert("top_p".into(), number(p));
    }
    let core = InferenceRequest {
        model: req.model,
        keep_alive: req.keep_alive,
        input: Input::Chat(conversation(req.instructions, req.input)?),
        tools,
        format,
        reasoning_effort,
        sampling: Sampling { temperature: req.temperature, top_p: req.top_p, ..Sampling::default() },
        max_tokens: req.max_output_tokens.map(|m| m as usize),
        overflow: Overflow::Refuse,
        stop: vec![],
        logprobs,
        prediction: None,
        endpoint: super::ENDPOINT,
        stream: req.stream,
    };
    Ok((core, Echo { params, logprobs: logprobs.is_some(), summary: summary.is_some(), sealed_reasoning }))
}

/// `reasoning`: `{"effort": "low" | "medium" | "high"}` for the core (which refuses it for a
/// model without the control) and `summary` (`auto`, `concise`, `detailed`: Codex asks for
/// one every turn). mlxbar has no summarizer: the summary it gives is the reasoning's whole
/// text, beside the same text in the item's `content`.
fn reasoning(v: Option<&Value>) -> Result<(Option<ReasoningEffort>, Option<&'static str>), ApiError> {
    const PARAM: &str = "reasoning";
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok((None, None)) };
    let Some(o) = v.as_object() else {
        return Err(ApiError::bad_request(format!("'{PARAM}' must be an object like {{\"effort\": \"low\"}}")).param(PARAM));
    };
    if let Some((k, _)) = o.iter().find(|(k, v)| !["effort", "summary"].contains(&k.as_str()) && !v.is_null()) {
        return Err(ApiError::bad_request(format!("'{PARAM}.{k}' is not supported (only effort and summary)")).param(PARAM));
    }
    let summary = match o.get("summary") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => "auto",
            "concise" => "concise",
            "detailed" => "detailed",
            other => {
                return Err(
                    ApiError::bad_request(format!("'{PARAM}.summary' must be auto, concise or detailed, got '{other}'")).param(PARAM)
                )
            }
        }),
        Some(other) => return Err(ApiError::bad_request(format!("'{PARAM}.summary' must be a string, got {other}")).param(PARAM)),
    };
    let effort = match o.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => Some(ReasoningEffort { level: Effort::parse(e, PARAM)?, param: PARAM }),
        Some(other) => return Err(ApiError::bad_request(format!("'{PARAM}.effort' must be a string, got {other}")).param(PARAM)),
    };
    Ok((effort, summary))
}

/// Known fields that need what mlxbar does not do; each is a 400 naming it when sent.
fn check_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.store == Some(true) {
        return Err(refuse("store", "mlxbar keeps no responses; send store: false, or leave it out"));
    }
    if req.previous_response_id.is_some() {
        return Err(refuse("previous_response_id", "mlxbar keeps no responses; send the whole conversation in 'input'"));
    }
    if req.background == Some(true) {
        return Err(refuse("background", "mlxbar keeps no responses to poll; stream the answer instead"));
    }
    if req.service_tier.as_deref().is_some_and(|t| t != "auto" && t != "default") {
        return Err(refuse("service_tier", "a local server has one tier: leave it out, or send \"auto\""));
    }
    if req.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(refuse("truncation", "a prompt past the context is refused, never cut: leave it out, or send \"disabled\""));
    }
    match &req.stream_options {
        None | Some(Value::Null) => {}
        Some(_) if !req.stream => return Err(refuse("stream_options", "it is only allowed with stream: true")),
        Some(o) if o.as_object().is_some_and(|o| o.iter().all(|(k, v)| k == "include_obfuscation" && v == &json!(false))) => {}
        Some(_) => {
            return Err(refuse("stream_options", "events carry no obfuscation padding; send {\"include_obfuscation\": false} or nothing"))
        }
    }
    for (param, value, why) in [
        ("conversation", &req.conversation, "mlxbar keeps no conversations; send the whole conversation in 'input'"),
        ("context_management", &req.context_management, "mlxbar does not compact conversations"),
        ("max_tool_calls", &req.max_tool_calls, "mlxbar runs no tools itself (function calls end the response)"),
        ("prompt", &req.prompt, "mlxbar keeps no prompt templates"),
        ("prompt_cache_retention", &req.prompt_cache_retention, "the prefix cache keeps prompts as memory allows"),
        ("prompt_cache_options", &req.prompt_cache_options, "the prefix cache keeps prompts as memory allows"),
        ("moderation", &req.moderation, "mlxbar does not moderate"),
        ("image", &req.image, "mlxbar's models read text only"),
        ("access_programs", &req.access_programs, "mlxbar has no access programs"),
    ] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(refuse(param, why));
        }
    }
    Ok(())
}

fn tools(tools: Option<&[Value]>, choice: Option<&Value>, parallel: Option<bool>) -> Result<Option<ToolSet>, ApiError> {
    let bad_choice = |m: String| ApiError::bad_request(m).param("tool_choice");
    // None: "none" (the tools are still checked, then left out).
    let mode = match choice {
        None => Some(ToolMode::Auto),
        Some(Value::String(m)) => match m.as_str() {
            "auto" => Some(ToolMode::Auto),
            "required" => Some(ToolMode::Required),
            "none" => None,
            other => return Err(bad_choice(format!("tool_choice '{other}' is not one of none, auto, required, or a named function"))),
        },
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                if let Some(extra) = o.keys().find(|k| *k != "type" && *k != "name") {
                    return Err(bad_choice(format!("tool_choice.{extra}: Unrecognized argument")));
                }
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| bad_choice("tool_choice.name: Field required".into()))?;
                Some(ToolMode::Named(name.to_string()))
            }
            other => return Err(bad_choice(format!("tool_choice type {other:?} is not supported (function only)"))),
        },
        Some(_) => return Err(bad_choice("tool_choice: a string or an object".into())),
    };
    let Some(tools) = tools else {
        return match mode {
            // No calls without tools: `auto`, `none` and `parallel_tool_calls` hold already (the
            // rule of every route); a choice that demands a call cannot.
            Some(ToolMode::Required | ToolMode::Named(_)) => Err(bad_choice("tool_choice asks for a call, which needs 'tools'".into())),
            _ => Ok(None),
        };
    };
    let mut specs = vec![];
    for (i, t) in tools.iter().enumerate() {
        let bad = |m: String| ApiError::bad_request(format!("tools[{i}]{m}")).param("tools");
        let o = t.as_object().ok_or_else(|| bad(": a tool is an object".into()))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => return Err(bad(format!(".type: {other:?} is not supported (function tools only; mlxbar runs no hosted tools)"))),
        }
        if let Some(extra) = o.keys().find(|k| !["type", "name", "description", "parameters", "strict"].contains(&k.as_str())) {
            return Err(bad(format!(".{extra}: not supported by mlxbar")));
        }
        let name = o.get("name").and_then(Value::as_str).ok_or_else(|| bad(".name: Field required (a string)".into()))?;
        let description = match o.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(bad(".description: a string".into())),
        };
        // No parameters: a function without arguments. Calls are decoded against the
        // parameters whether `strict` is set or not.
        let parameters = match o.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad(".parameters: a JSON Schema object".into())),
        };
        if o.get("strict").is_some_and(|s| !s.is_null() && !s.is_boolean()) {
            return Err(bad(".strict: a boolean".into()));
        }
        specs.push(ToolSpec { name: name.to_string(), description, parameters });
    }
    Ok(mode.map(|mode| ToolSet { specs, mode, parallel: parallel.unwrap_or(true) }))
}

/// `text.format` as the core's output constraint, and `text` as the Response repeats it.
fn text_format(text: Option<&Value>) -> Result<(Option<OutputFormat>, Value), ApiError> {
    let bad = |m: String| ApiError::bad_request(m).param("text");
    let plain = json!({"format": {"type": "text"}});
    let Some(text) = text.filter(|t| !t.is_null()) else { return Ok((None, plain)) };
    let o = text.as_object().ok_or_else(|| bad("text: an object".into()))?;
    if let Some(extra) = o.keys().find(|k| *k != "format" && *k != "verbosity") {
        return Err(bad(format!("text.{extra}: Unrecognized argument")));
    }
    if o.get("verbosity").is_some_and(|v| !v.is_null()) {
        return Err(bad("text.verbosity: not supported (the served models have no verbosity control)".into()));
    }
    let Some(format) = o.get("format").filter(|f| !f.is_null()) else { return Ok((None, plain)) };
    let f = format.as_object().ok_or_else(|| bad("text.format: an object with a 'type'".into()))?;
    let allowed: &[&str] = match f.get("type").and_then(Value::as_str) {
        Some("json_schema") => &["type", "name", "schema", "strict", "description"],
        _ => &["type"],
    };
    if let Some(extra) = f.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(format!("text.format.{extra}: Unrecognized argument")));
    }
    let constraint = match f.get("type").and_then(Value::as_str) {
        Some("text") => None,
        Some("json_object") => Some(OutputFormat::JsonObject),
        Some("json_schema") => {
            if !f.get("name").is_some_and(Value::is_string) {
                return Err(bad("text.format.name: Field required (a string)".into()));
            }
            if f.get("strict").is_some_and(|s| !s.is_null() && !s.is_boolean()) {
                return Err(bad("text.format.strict: a boolean".into()));
            }
            // Output is decoded against the schema whether `strict` is set or not.
            match f.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => Some(OutputFormat::JsonSchema(s.clone())),
                _ => return Err(bad("text.format.schema: Field required (a JSON Schema object)".into())),
            }
        }
        other => return Err(bad(format!("text.format.type: {other:?} is not one of text, json_object, json_schema"))),
    };
    Ok((constraint, json!({"format": format})))
}
