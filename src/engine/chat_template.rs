//! Renders a model's Jinja chat template (HF semantics) with minijinja, plus the
//! Python-method compatibility HF templates rely on (`.strip()`, `.startswith()`, ...), HF's
//! `tojson` (Python `json.dumps` spacing), and tools: passed to templates that know them, else
//! described by the fallback of `tools::fallback`.
use anyhow::{anyhow, Context, Result};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::tools::{fallback, ToolCall, ToolSpec};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls; serialized as HF templates read them:
    /// `[{"id", "type": "function", "function": {"name", "arguments": <object>}}]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty", serialize_with = "hf_tool_calls", deserialize_with = "from_hf_tool_calls")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message's answer to this call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, sent back in the history (gpt-oss's template renders it
    /// as the analysis of a turn that calls a tool). Absent when None: templates test
    /// `"thinking" in message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// A plain message (no tool calls).
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: vec![], tool_call_id: None, thinking: None }
    }
}

/// A message as templates read it: its reasoning under both names templates use, `thinking`
/// (gpt-oss) and `reasoning_content` (Qwen3, DeepSeek V3.2, GLM, Kimi, MiniMax: rendered as
/// the `<think>` of assistant turns after the last user message, so a tool-calling turn keeps
/// the reasoning that led to its call).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    #[serde(flatten)]
    message: &'a ChatMessage,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

impl<'a> From<&'a ChatMessage> for TemplateMessage<'a> {
    fn from(message: &'a ChatMessage) -> Self {
        TemplateMessage { message, reasoning_content: message.thinking.as_deref() }
    }
}

/// Arguments as a JSON value (HF templates apply `tojson` to an object); text that is not JSON stays text.
fn arguments_value(arguments: &str) -> serde_json::Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| serde_json::Value::String(arguments.to_string()))
}

fn hf_tool_calls<S: Serializer>(calls: &[ToolCall], s: S) -> Result<S::Ok, S::Error> {
    let v: Vec<serde_json::Value> = calls
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id,
                "type": "function",
                "function": { "name": c.name, "arguments": arguments_value(&c.arguments) },
            })
        })
        .collect();
    v.serialize(s)
}

fn from_hf_tool_calls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ToolCall>, D::Error> {
    let v = Vec::<serde_json::Value>::deserialize(d)?;
    Ok(v.iter()
        .map(|c| {
            let f = c.get("function").unwrap_or(c);
            let arguments = match f.get("arguments") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => "{}".into(),
            };
            ToolCall {
                id: c.get("id").and_then(|i| i.as_str()).unwrap_or_default().to_string(),
                name: f.get("name").and_then(|n| n.as_str()).unwrap_or_default().to_string(),
                arguments,
            }
        })
        .collect())
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    pub fn new(source: String, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> { Err(Error::new(ErrorKind::InvalidOperation, msg)) });
        env.add_function("strftime_now", |fmt: String| -> String { strftime_now(&fmt) });
        env.add_filter("tojson", |v: Value, kwargs: Kwargs| -> Result<String, Error> {
            let indent: Option<usize> = kwargs.get("indent")?;
            kwargs.assert_all_used()?;
            Ok(py_json(&v, indent))
        });
        env.add_template_owned("chat", source.clone()).context("parsing the chat template")?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt`. `tools` go to the template in HF's shape
    /// (`[{"type": "function", "function": {name, description, parameters}}]`) when it
    /// supports tools; otherwise tools, calls and tool results are rewritten into plain
    /// messages by [`fallback::apply`].
    pub fn render(&self, messages: &[ChatMessage], tools: &[ToolSpec], add_generation_prompt: bool) -> Result<String> {
        self.render_with_effort(messages, tools, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with `reasoning_effort` for the templates that read it
    /// (gpt-oss's: "low", "medium", "high"); None leaves it undefined, the template's default.
    pub fn render_with_effort(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
        reasoning_effort: Option<&str>,
    ) -> Result<String> {
        let tpl = self.env.get_template("chat").map_err(|e| anyhow!("{e}"))?;
        let rewritten;
        let (messages, tools) = if self.supports_tools() {
            (messages, (!tools.is_empty()).then(|| hf_tools(tools)))
        } else {
            rewritten = fallback::apply(messages, tools);
            (rewritten.as_slice(), None)
        };
        let messages: Vec<TemplateMessage> = messages.iter().map(TemplateMessage::from).collect();
        let ctx = context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        // Only when given: a template tests `reasoning_effort is not defined` for its default.
        let ctx = match reasoning_effort {
            Some(effort) => context! { reasoning_effort => effort, ..ctx },
            None => ctx,
        };
        tpl.render(ctx).map_err(|e| anyhow!("chat template: {e}"))
    }

    /// The template reads `tools` (Qwen 2.5, Llama 3.1, Mistral...); SmolLM2's does not.
    pub fn supports_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// The template's source text (`ToolFormat::detect` reads it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Special tokens the template closes an assistant turn with (`<|im_end|>`,
    /// `<|eot_id|>`, `<end_of_turn>`), which end generation like EOS does. Harmony's
    /// (gpt-oss) turn ends on `<|return|>` or `<|call|>`; its `<|end|>` only closes a message
    /// (the analysis before the final answer), so it must not stop generation.
    pub fn end_of_turn_tokens(&self) -> Vec<&'static str> {
        if self.source.contains("<|channel|>") {
            return vec!["<|return|>", "<|call|>"];
        }
        ["<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"]
            .into_iter()
            .filter(|t| self.source.contains(t) && *t != "<|endoftext|>")
            .collect()
    }
}

/// Tools in the shape HF templates read.
pub fn hf_tools(tools: &[ToolSpec]) -> Vec<serde_json::Value> {
    tools
        .iter()
        .map(|t| {
            let mut f = serde_json::Map::new();
            f.insert("name".into(), t.name.clone().into());
            if let Some(d) = &t.description {
                f.insert("description".into(), d.clone().into());
            }
            f.insert("parameters".into(), t.parameters.clone());
            serde_json::json!({"type": "function", "function": f})
        })
        .collect()
}

/// JSON text as Python's `json.dumps(v, ensure_ascii=False, indent=indent)` writes it, which
/// is what HF's `tojson` is: `", "` and `": "` separators (`","` with an indent), keys in
/// their order, no HTML escaping.
pub fn py_json(v: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_py_json(v, indent, 0, &mut out);
    out
}

fn write_py_json(v: &Value, indent: Option<usize>, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None | ValueKind::Invalid => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
            out.push_str(&serde_json::to_string(&f).unwrap_or_else(|_| "NaN".into()))
        }
        ValueKind::String => out.push_str(&serde_json::to_string(v.as_str().unwrap_or_default()).expect("a string serializes")),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter().map(|i| i.collect()).unwrap_or_default();
            if keys.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                let key = k.as_str().map(str::to_string).unwrap_or_else(|| k.to_string());
                out.push_str(&serde_json::to_string(&key).expect("a string serializes"));
                out.push_str(": ");
                write_py_json(&v.get_item(k).unwrap_or_default(), indent, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        _ => {
            let items: Vec<Value> = v.try_iter().map(|i| i.collect()).unwrap_or_default();
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_py_json(item, indent, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
    }
}

/// `strftime_now` as HF defines it for templates that print today's date (Llama 3.x).
fn strftime_now(fmt: &str) -> String {
    chrono::Local::now().format(fmt).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tools::{ToolCall, ToolSpec};

    #[test]
    fn renders_chatml_with_python_methods() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src.into(), None, Some("<|im_end|>".into())).unwrap();
        let out = t.render(&[ChatMessage::new("user", "  hi  ")], &[], true).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(t.end_of_turn_tokens(), vec!["<|im_end|>"]);
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), None, None).unwrap();
        let err = t.render(&[], &[], true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = strftime_now("%d %B %Y");
        assert_eq!(s.split(' ').count(), 3);
        assert!(s.split(' ').next_back().unwrap().parse::<i32>().unwrap() >= 2024);
    }

    fn weather() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: Some("Current weather in a city".into()),
            parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }
    }

    /// A tool round trip: the question, the call, its result.
    fn history() -> Vec<ChatMessage> {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }];
        let mut result = ChatMessage::new("tool", r#"{"temp": 21}"#);
        result.tool_call_id = Some("call_1".into());
        vec![ChatMessage::new("system", "You are a weather bot."), ChatMessage::new("user", "Weather in Paris?"), call, result]
    }

    const TOOLS_SECTION: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

    #[test]
    fn qwen_template_gets_tools_and_calls_in_hf_shape() {
        let src = include_str!("../../tests/data/templates/qwen2.5-instruct.jinja");
        let t = ChatTemplate::new(src.into(), None, Some("<|im_end|>".into())).unwrap();
        assert!(t.supports_tools());
        let out = t.render(&history(), &[weather()], true).unwrap();
        // What transformers' apply_chat_template gives for these messages and tools.
        let want = format!(
            "<|im_start|>system\nYou are a weather bot.\n\n{TOOLS_SECTION}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Paris\"}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{{\"temp\": 21}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(out, want);
        // no tools: Qwen's plain system turn
        let plain = t.render(&[ChatMessage::new("user", "hi")], &[], true).unwrap();
        assert_eq!(plain, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    /// Qwen3's template renders an assistant turn's reasoning (`reasoning_content`) as the
    /// `<think>` of turns after the last user message. The expected prompt is what
    /// transformers 5.25.0's `render_jinja_template` gives for the same messages.
    #[test]
    fn qwen3_template_gets_the_reasoning_of_a_calling_turn() {
        let src = include_str!("../../tests/data/templates/qwen3.jinja");
        let t = ChatTemplate::new(src.into(), None, Some("<|im_end|>".into())).unwrap();
        let mut msgs = history();
        msgs[2].thinking = Some("The user wants Paris weather.".into());
        let out = t.render(&msgs, &[], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a weather bot.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nThe user wants Paris weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn templates_without_tools_get_the_hermes_fallback() {
        let src = include_str!("../../tests/data/templates/smollm2-instruct.jinja");
        let t = ChatTemplate::new(src.into(), None, Some("<|im_end|>".into())).unwrap();
        assert!(!t.supports_tools());
        let mut msgs = history();
        let mut second = ChatMessage::new("tool", "rainy");
        second.tool_call_id = Some("call_2".into());
        msgs.push(second);
        let out = t.render(&msgs, &[weather()], true).unwrap();
        let want = format!(
            "<|im_start|>system\nYou are a weather bot.\n\n{TOOLS_SECTION}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Paris\"}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{{\"temp\": 21}}\n</tool_response>\n<tool_response>\nrainy\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(out, want);
        // without a system message the tools get one of their own (instead of SmolLM's default)
        let out = t.render(&[ChatMessage::new("user", "hi")], &[weather()], false).unwrap();
        assert_eq!(out, format!("<|im_start|>system\n{TOOLS_SECTION}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"));
        // and without tools nothing changes
        let out = t.render(&[ChatMessage::new("user", "hi")], &[], false).unwrap();
        assert_eq!(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
    }

    #[test]
    fn messages_serialize_and_read_back_in_hf_shape() {
        let m = &history()[2];
        let v = serde_json::to_value(m).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
        );
        let back: ChatMessage = serde_json::from_value(v).unwrap();
        assert_eq!(back.tool_calls[0].name, "get_weather");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&back.tool_calls[0].arguments).unwrap(), serde_json::json!({"city": "Paris"}));
        let plain: ChatMessage = serde_json::from_str(r#"{"role": "user", "content": "hi"}"#).unwrap();
        assert_eq!(plain, ChatMessage::new("user", "hi"));
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"{"role":"user","content":"hi"}"#);
    }

    #[test]
    fn tojson_writes_like_python() {
        let v = Value::from_serialize(serde_json::json!({"b": [1, 2.5, true, null], "a": "é\"\n", "e": {}}));
        assert_eq!(py_json(&v, None), r#"{"b": [1, 2.5, true, null], "a": "é\"\n", "e": {}}"#);
        assert_eq!(
            py_json(&v, Some(2)),
            "{\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": \"é\\\"\\n\",\n  \"e\": {}\n}"
        );
        let t = ChatTemplate::new("{{ x | tojson(indent=4) }}|{{ x | tojson }}".into(), None, None).unwrap();
        let tpl = t.env.get_template("chat").unwrap();
        assert_eq!(tpl.render(context! { x => vec![1] }).unwrap(), "[\n    1\n]|[1]");
    }
}
