//! Tools for chat templates that know nothing of them (SmolLM2's, the default model's).
//!
//! When a model's template does not read `tools`, mlxbar rewrites the conversation into plain
//! messages, in the Hermes format that Qwen 2.5's template uses, and renders that with the
//! model's own template:
//! - the tools are described at the end of the system message (a system message holding only
//!   that description is put first when the conversation has none): a `# Tools` section
//!   listing each tool as `{"type": "function", "function": {"name", "description",
//!   "parameters"}}` JSON inside `<tools></tools>`, and asking for each call as
//!   `<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>`;
//! - an assistant message with tool calls becomes its text followed by one such
//!   `<tool_call>` block per call;
//! - `tool` messages (results) become a user message holding each result as
//!   `<tool_response>\n...\n</tool_response>`, consecutive results in one message.
//!
//! An assistant turn's `thinking` stays on it, for the template to render or not.
//!
//! The model's answer is then read with the Hermes parser.
use minijinja::Value;

use super::super::chat_template::{hf_tools, py_json, ChatMessage};
use super::ToolSpec;

/// The system-message text describing `tools` (Qwen 2.5's wording).
pub fn tools_prompt(tools: &[ToolSpec]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in hf_tools(tools) {
        s.push('\n');
        s.push_str(&py_json(&Value::from_serialize(&t), None));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments \
         within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// `messages` with tools, calls and results rewritten as plain messages (see the module doc).
pub fn apply(messages: &[ChatMessage], tools: &[ToolSpec]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let prompt = tools_prompt(tools);
        match messages.first() {
            Some(m) if m.role == "system" => {
                let content = if m.content.is_empty() { prompt } else { format!("{}\n\n{prompt}", m.content) };
                out.push(ChatMessage::new("system", content));
            }
            _ => out.push(ChatMessage::new("system", prompt)),
        }
    }
    let rest = if !tools.is_empty() && messages.first().is_some_and(|m| m.role == "system") { &messages[1..] } else { messages };
    let mut prev_tool = false;
    for m in rest {
        let is_tool = m.role == "tool";
        match m.role.as_str() {
            "tool" => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match out.last_mut() {
                    // consecutive results share one user turn
                    Some(prev) if prev_tool => {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => out.push(ChatMessage::new("user", block)),
                }
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let mut content = m.content.clone();
                for c in &m.tool_calls {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    let args = match serde_json::from_str::<serde_json::Value>(&c.arguments) {
                        Ok(v) => py_json(&Value::from_serialize(&v), None),
                        Err(_) => c.arguments.clone(),
                    };
                    let name = serde_json::to_string(&c.name).expect("a string serializes");
                    content.push_str(&format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>"));
                }
                out.push(ChatMessage { thinking: m.thinking.clone(), ..ChatMessage::new("assistant", content) });
            }
            _ => out.push(ChatMessage { thinking: m.thinking.clone(), ..ChatMessage::new(m.role.clone(), m.content.clone()) }),
        }
        prev_tool = is_tool;
    }
    out
}
