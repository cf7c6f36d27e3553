//! The Responses `input` in the core's terms: a string is one user message; items are
//! `message`s (roles user, system, developer, assistant; a string or `input_text` /
//! `output_text` / `refusal` parts), `reasoning` items sent back (the reasoning of the
//! assistant turn after them: the template's `thinking`), `function_call`s (joined to the
//! assistant turn before them, as chat templates want calls) and `function_call_output`s
//! (tool messages). The
//! fields a client sends back from an earlier Response's `output` (`id`, `status`, a text's
//! `annotations` and `logprobs`) describe that output and are accepted; anything else is a
//! 400 naming it and where it is.
use serde_json::{Map, Value};

use super::request::Input;
use crate::api::error::ApiError;
use crate::engine::tools::ToolCall;
use crate::inference::{Message, Part, Role};

pub(super) fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).param("input")
}

/// `instructions` (a system message first) and the input, as one conversation.
pub fn conversation(instructions: Option<String>, input: Input) -> Result<Vec<Message>, ApiError> {
    let mut out = vec![];
    if let Some(text) = instructions {
        out.push(message(Role::System, vec![Part::Text(text)]));
    }
    let items = match input {
        Input::Text(text) => {
            out.push(message(Role::User, vec![Part::Text(text)]));
            return Ok(out);
        }
        Input::Items(items) => items,
    };
    if items.is_empty() {
        return Err(bad("'input' must contain at least one item"));
    }
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let o = item.as_object().ok_or_else(|| bad(format!("{at}: an item is an object")))?;
        match o.get("type").map(|t| t.as_str().ok_or_else(|| bad(format!("{at}.type: a string")))).transpose()? {
            None | Some("message") => {
                let m = message_item(o, &at)?;
                match out.last_mut() {
                    // The answer of the turn whose reasoning came just before it.
                    Some(last) if m.role == Role::Assistant && only_reasoning(last) => last.content = m.content,
                    _ => out.push(m),
                }
            }
            Some("reasoning") => reasoning(o, &at, &mut out)?,
            Some("function_call") => function_call(o, &at, &mut out)?,
            Some("function_call_output") => out.push(function_call_output(o, &at)?),
            Some("item_reference") => {
                return Err(bad(format!("{at}: item references need stored responses and mlxbar keeps none; send the item itself")))
            }
            Some(other) => {
                return Err(bad(format!(
                    "{at}.type: '{other}' is not supported (message, reasoning, function_call and function_call_output items are)"
                )))
            }
        }
    }
    Ok(out)
}

fn message(role: Role, content: Vec<Part>) -> Message {
    Message { role, content, tool_calls: vec![], tool_call_id: None, reasoning: None }
}

/// An assistant turn holding reasoning and nothing yet: the message or calls after it are its.
fn only_reasoning(m: &Message) -> bool {
    m.role == Role::Assistant && m.reasoning.is_some() && m.content.is_empty() && m.tool_calls.is_empty()
}

/// A `reasoning` item sent back: its `reasoning_text` parts (else its summary's `summary_text`
/// parts, else the text its `encrypted_content` seals) are the reasoning of the assistant turn
/// that follows. An `encrypted_content` mlxbar did not seal ([`super::sealed`]) is another
/// server's reasoning, which it cannot read: refused.
fn reasoning(o: &Map<String, Value>, at: &str, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let o = fields(o, at, &["summary", "content", "encrypted_content"])?;
    let sealed = match o.get("encrypted_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(token)) => Some(super::sealed::open(token).ok_or_else(|| {
            bad(format!("{at}.encrypted_content: not reasoning mlxbar sealed (another server's?); send its 'content' as text"))
        })?),
        Some(_) => return Err(bad(format!("{at}.encrypted_content: a string"))),
    };
    let texts = |key: &str, kind: &str| -> Result<Vec<String>, ApiError> {
        match o.get(key) {
            None | Some(Value::Null) => Ok(vec![]),
            Some(Value::Array(parts)) => parts
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let at = format!("{at}.{key}[{j}]");
                    let p = p.as_object().ok_or_else(|| bad(format!("{at}: a part is an object")))?;
                    if string(p, "type", &at)? != kind {
                        return Err(bad(format!("{at}.type: a {key} part is '{kind}'")));
                    }
                    if let Some(extra) = p.keys().find(|k| !["type", "text"].contains(&k.as_str())) {
                        return Err(bad(format!("{at}.{extra}: Unrecognized argument for a '{kind}' part")));
                    }
                    Ok(string(p, "text", &at)?.to_string())
                })
                .collect(),
            Some(_) => Err(bad(format!("{at}.{key}: a list of '{kind}' parts"))),
        }
    };
    let content = texts("content", "reasoning_text")?;
    let summary = texts("summary", "summary_text")?;
    let text = match (content.is_empty(), sealed) {
        (false, _) => content.join("\n"),
        (true, Some(text)) => text,
        (true, None) => summary.join("\n"),
    };
    if text.is_empty() {
        return Ok(());
    }
    match out.last_mut() {
        Some(last) if only_reasoning(last) => {
            let before = last.reasoning.take().unwrap_or_default();
            last.reasoning = Some(format!("{before}\n{text}"));
        }
        _ => out.push(Message { reasoning: Some(text), ..message(Role::Assistant, vec![]) }),
    }
    Ok(())
}

/// The item's object, with no field beyond `allowed` (and `type`, `id`, `status`, which
/// identify an item sent back from an earlier output).
fn fields<'a>(o: &'a Map<String, Value>, at: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>, ApiError> {
    if let Some(extra) = o.keys().find(|k| !allowed.contains(&k.as_str()) && !["type", "id", "status"].contains(&k.as_str())) {
        return Err(bad(format!("{at}.{extra}: Unrecognized argument (not supported by mlxbar)")));
    }
    Ok(o)
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    o.get(key).and_then(Value::as_str).ok_or_else(|| bad(format!("{at}.{key}: Field required (a string)")))
}

fn message_item(o: &Map<String, Value>, at: &str) -> Result<Message, ApiError> {
    let o = fields(o, at, &["role", "content", "phase"])?;
    if o.get("phase").is_some_and(|p| !p.is_null()) {
        return Err(bad(format!("{at}.phase: not supported by mlxbar (its models answer in one phase)")));
    }
    let role = match string(o, "role", at)? {
        // The newer "developer" role is what chat templates call "system".
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => return Err(bad(format!("{at}.role: '{other}' is not one of user, system, developer, assistant"))),
    };
    let content = match o.get("content") {
        Some(Value::String(text)) => vec![Part::Text(text.clone())],
        Some(Value::Array(parts)) => {
            let mut out = vec![];
            for (j, p) in parts.iter().enumerate() {
                out.push(content_part(p, role, &format!("{at}.content[{j}]"))?);
            }
            out
        }
        _ => return Err(bad(format!("{at}.content: Field required (a string or a list of content parts)"))),
    };
    Ok(message(role, content))
}

fn content_part(p: &Value, role: Role, at: &str) -> Result<Part, ApiError> {
    let o = p.as_object().ok_or_else(|| bad(format!("{at}: a content part is an object")))?;
    let kind = string(o, "type", at)?;
    let only = |allowed: &[&str]| match o.keys().find(|k| *k != "type" && !allowed.contains(&k.as_str())) {
        Some(extra) => Err(bad(format!("{at}.{extra}: Unrecognized argument for a '{kind}' part"))),
        None => Ok(()),
    };
    match kind {
        "input_text" => only(&["text"])?,
        // An earlier answer sent back: its annotations and logprobs describe it, they are not prompt.
        "output_text" if role == Role::Assistant => only(&["text", "annotations", "logprobs"])?,
        "refusal" if role == Role::Assistant => {
            only(&["refusal"])?;
            return Ok(Part::Text(string(o, "refusal", at)?.to_string()));
        }
        "output_text" | "refusal" => return Err(bad(format!("{at}.type: only assistant messages carry '{kind}' parts"))),
        other => return Err(bad(format!("{at}.type: '{other}' is not supported (text parts only: input_text, output_text)"))),
    }
    Ok(Part::Text(string(o, "text", at)?.to_string()))
}

/// A call the assistant made: joined to the assistant turn just before it (its text, or the
/// calls beside it), else a turn of its own.
fn function_call(o: &Map<String, Value>, at: &str, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let o = fields(o, at, &["call_id", "name", "arguments"])?;
    let call = ToolCall {
        id: string(o, "call_id", at)?.to_string(),
        name: string(o, "name", at)?.to_string(),
        arguments: string(o, "arguments", at)?.to_string(),
    };
    match out.last_mut() {
        Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
        _ => out.push(Message { tool_calls: vec![call], ..message(Role::Assistant, vec![]) }),
    }
    Ok(())
}

/// A call's result: a string, or `input_text` parts.
fn function_call_output(o: &Map<String, Value>, at: &str) -> Result<Message, ApiError> {
    let o = fields(o, at, &["call_id", "output"])?;
    let id = string(o, "call_id", at)?.to_string();
    let text = match o.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = vec![];
            for (j, p) in parts.iter().enumerate() {
                let at = format!("{at}.output[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text") => {}
                    other => return Err(bad(format!("{at}.type: {other:?} is not supported (input_text only)"))),
                }
                let Part::Text(t) = content_part(p, Role::Tool, &at)?;
                texts.push(t);
            }
            texts.join("\n")
        }
        _ => return Err(bad(format!("{at}.output: Field required (a string or input_text parts)"))),
    };
    Ok(Message { tool_call_id: Some(id), ..Message::plain(Role::Tool, text) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conversation_of(items: Value) -> Result<Vec<Message>, String> {
        let Value::Array(items) = items else { unreachable!("items are a list") };
        conversation(None, Input::Items(items)).map_err(|e| e.message)
    }

    fn reasoning_item(text: &str) -> Value {
        json!({"type": "reasoning", "id": "rs_1", "status": "completed", "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
    }

    #[test]
    fn a_reasoning_item_sent_back_is_the_next_assistant_turns_reasoning() {
        let m = conversation_of(json!([
            {"role": "user", "content": "Time?"},
            reasoning_item("Need the clock."),
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_time", "arguments": "{}", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
            reasoning_item("Say it."),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noon.", "annotations": []}]},
            {"role": "user", "content": "Thanks"},
        ]))
        .unwrap();
        let turns: Vec<_> = m.iter().map(|m| (m.role, m.reasoning.as_deref(), m.text(), m.tool_calls.len())).collect();
        assert_eq!(
            turns,
            [
                (Role::User, None, "Time?".into(), 0),
                (Role::Assistant, Some("Need the clock."), String::new(), 1),
                (Role::Tool, None, "12:00".into(), 0),
                (Role::Assistant, Some("Say it."), "Noon.".into(), 0),
                (Role::User, None, "Thanks".into(), 0),
            ]
        );
        // a summary stands for reasoning sent without its text
        let summary = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Clock."}]});
        let m = conversation_of(json!([{"role": "user", "content": "Time?"}, summary])).unwrap();
        assert_eq!(m[1].reasoning.as_deref(), Some("Clock."));
        // another server's encrypted reasoning cannot be read; mlxbar's own opens; fields
        // beyond the item's are refused
        let encrypted = json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"});
        assert!(conversation_of(json!([encrypted])).unwrap_err().contains("input[0].encrypted_content"));
        let sealed = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Short."}],
            "encrypted_content": super::super::sealed::seal("Clock first.")});
        let m = conversation_of(json!([{"role": "user", "content": "Time?"}, sealed])).unwrap();
        assert_eq!(m[1].reasoning.as_deref(), Some("Clock first."), "the sealed text, not the summary");
        let extra = json!({"type": "reasoning", "id": "rs_1", "summary": [], "effort": "low"});
        assert!(conversation_of(json!([extra])).unwrap_err().contains("input[0].effort"));
        let wrong = json!({"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "output_text", "text": "x"}]});
        assert!(conversation_of(json!([wrong])).unwrap_err().contains("reasoning_text"));
    }
}
