//! Builds the Lark grammars (llguidance's dialect) that constrain a model to call its tools in
//! its family's syntax. Each family describes its calls as a lead (what opens the call region),
//! the text of a first call after the lead, of each further call, and a close; this file
//! assembles those into the grammar for a [`ToolMode`].
use super::{ToolMode, ToolSpec};
use crate::engine::constraint::schema;

/// A marker as a Lark atom: the special token itself (`<[id]>`) when the vocabulary has it as
/// one token that llguidance treats as special (added and flagged special, or shaped `<...>`),
/// else its text. A special token can only be produced as that token, never spelled out.
pub(super) fn marker(tokenizer: &tokenizers::Tokenizer, text: &str) -> Option<u32> {
    tokenizer
        .get_added_tokens_decoder()
        .iter()
        .find(|(_, t)| t.content == text && (t.special || (t.content.starts_with('<') && t.content.ends_with('>'))))
        .map(|(id, _)| *id)
}

/// Lark atom for `text`: its special token or a string literal.
pub(super) fn atom(tokenizer: &tokenizers::Tokenizer, text: &str) -> String {
    match marker(tokenizer, text) {
        Some(id) => format!("<[{id}]>"),
        None => lit(text),
    }
}

/// A Lark string literal.
pub(super) fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `name` as a JSON string (inside a literal of the call's JSON).
pub(super) fn json_name(name: &str) -> String {
    serde_json::to_string(name).expect("a string serializes")
}

fn rx_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Most calls one answer may make: a small model that repeats its call would otherwise go
/// on until `max_tokens`.
pub const MAX_CALLS: usize = 8;

/// The family's calls, for [`build`].
pub(super) struct Shape<'a> {
    /// Lark atoms opening the call region, e.g. `<[151657]>` or `"<tool_call>"`.
    pub lead: String,
    /// The lead's text when it is plain text (free text then ends lazily at its first occurrence).
    pub lead_text: Option<String>,
    /// Regexes free text must not contain (the textual spelling of a special-token lead).
    pub forbid: Vec<String>,
    /// Lark expression of a first call (after the lead) to a tool, given its name and arguments rule.
    pub first: &'a dyn Fn(&str, &str) -> String,
    /// Lark expression of each further call.
    pub next: &'a dyn Fn(&str, &str) -> String,
    /// Lark expression closing the call region ("" for none).
    pub close: String,
}

/// A forbidden spelling of `text` for [`Shape::forbid`].
pub(super) fn forbid_text(text: &str) -> String {
    rx_escape(text)
}

/// The tools `mode` allows: all, or the named one (one with any object arguments when it is not
/// among `tools`; callers reject unknown names before this).
pub(super) fn allowed(tools: &[ToolSpec], mode: &ToolMode) -> Vec<ToolSpec> {
    match mode {
        ToolMode::Named(n) => match tools.iter().find(|t| &t.name == n) {
            Some(t) => vec![t.clone()],
            None => vec![ToolSpec { name: n.clone(), description: None, parameters: serde_json::json!({"type": "object"}) }],
        },
        _ => tools.to_vec(),
    }
}

/// The arguments schema for `%json`: the tool's parameters when they are a JSON object, else
/// any object, with the compact JSON layout of [`schema::prepare`] (whose keyword check the
/// server runs on every tool before it builds a grammar).
pub(super) fn schema(t: &ToolSpec) -> String {
    let params = match &t.parameters {
        serde_json::Value::Object(m) if !m.is_empty() => t.parameters.clone(),
        _ => serde_json::json!({"type": "object"}),
    };
    let prepared = schema::prepare(&params).unwrap_or(params);
    serde_json::to_string(&prepared).expect("JSON serializes")
}

pub(super) fn build(shape: &Shape, tools: &[ToolSpec], mode: &ToolMode, parallel: bool) -> String {
    let tools = allowed(tools, mode);
    let mut g = String::new();
    let any_text = "TEXT_ANY: /(?s:.*)/\n";
    if tools.is_empty() {
        return format!("start: TEXT_ANY\n{any_text}");
    }
    let calls = format!("calls: first_call next_call{{0,{}}} close\n", MAX_CALLS - 1);
    let one = "calls: first_call close\n";
    let start = match (mode, &shape.lead_text) {
        (ToolMode::Auto, Some(_)) => "start: TEXT_ANY | prefix calls\n".to_string(),
        (ToolMode::Auto, None) => "start: TEXT? | TEXT? lead calls\n".to_string(),
        _ => "start: lead calls\n".to_string(),
    };
    g.push_str(&start);
    g.push_str(if parallel { &calls } else { one });
    g.push_str(&format!("lead: {}\n", shape.lead));
    g.push_str(&format!("close: {}\n", if shape.close.is_empty() { "\"\"" } else { &shape.close }));
    let alts = |prefix: &str| (0..tools.len()).map(|i| format!("{prefix}_{i}")).collect::<Vec<_>>().join(" | ");
    g.push_str(&format!("first_call: {}\n", alts("first")));
    g.push_str(&format!("next_call: {}\n", alts("next")));
    for (i, t) in tools.iter().enumerate() {
        let args = format!("args_{i}");
        g.push_str(&format!("first_{i}: {}\n", (shape.first)(&t.name, &args)));
        g.push_str(&format!("next_{i}: {}\n", (shape.next)(&t.name, &args)));
        g.push_str(&format!("{args}: %json {}\n", schema(t)));
    }
    if *mode != ToolMode::Auto {
        return g;
    }
    match &shape.lead_text {
        Some(lead) => {
            g.push_str(any_text);
            // Lazy: free text ends at the first occurrence of the lead, which then opens calls.
            g.push_str(&format!("prefix[lazy]: TEXT_ANY {}\n", lit(lead)));
        }
        None if shape.forbid.is_empty() => g.push_str("TEXT: /(?s:.+)/\n"),
        None => g.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:.*)({})(?s:.*)/\n", shape.forbid.join("|"))),
    }
    g
}
