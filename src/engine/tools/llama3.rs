//! Llama 3.1-3.3 JSON calls: `{"name": "get_weather", "parameters": {"city": "Paris"}}`, the
//! whole answer or after some text, optionally after `<|python_tag|>`, several separated by
//! `;`. A call opens at `<|python_tag|>` or at a `{` whose first key is `"name"`.
use super::grammar::{self, Shape};
use super::scan::{self, held_tail, read_envelope, skip_ws, Opener, Syntax};
use super::{ParsedCall, ToolCallParser, ToolMode, ToolParseError, ToolSpec};

const PYTHON_TAG: &str = "<|python_tag|>";
const NAME_KEY: &str = "\"name\"";

pub struct Llama3Json;

/// A `{` at `p` that opens `{"name"` (whitespace allowed after the brace): Some(true); one
/// that still could when the text goes on: Some(false).
fn brace_opens(text: &str, p: usize) -> Option<bool> {
    let after = skip_ws(text, p + 1);
    let rest = &text[after..];
    if rest.starts_with(NAME_KEY) {
        Some(true)
    } else if NAME_KEY.starts_with(rest) {
        Some(false)
    } else {
        None
    }
}

impl Syntax for Llama3Json {
    fn find_opener(&self, text: &str, from: usize) -> Opener {
        let tag = text[from..].find(PYTHON_TAG).map(|p| from + p);
        for (p, _) in text[from..].match_indices('{') {
            let p = from + p;
            if tag.is_some_and(|t| t < p) {
                break;
            }
            match brace_opens(text, p) {
                Some(true) => return Opener::Found { start: p, body: p },
                Some(false) => return Opener::Partial { start: p },
                None => {}
            }
        }
        match tag {
            Some(t) => Opener::Found { start: t, body: t + PYTHON_TAG.len() },
            None => match held_tail(&text[from..], PYTHON_TAG) {
                0 => Opener::None,
                k => Opener::Partial { start: text.len() - k },
            },
        }
    }

    fn scan_calls(&self, text: &str, at: usize, is_final: bool) -> Result<(Vec<scan::PartialCall>, Option<usize>), String> {
        let mut calls = Vec::new();
        let mut i = at;
        loop {
            i = skip_ws(text, i);
            if i == text.len() {
                if calls.is_empty() && is_final {
                    return Err(format!("{PYTHON_TAG} is not followed by a call"));
                }
                return Ok((calls, if is_final { Some(i) } else { None }));
            }
            if text.as_bytes()[i] != b'{' {
                if calls.is_empty() {
                    return Err(format!("expected a JSON tool call, found '{}'", scan::excerpt(text, i)));
                }
                return Ok((calls, Some(i)));
            }
            let (call, end) = read_envelope(text, i, &["parameters", "arguments"])?;
            calls.push(call);
            let Some(end) = end else {
                return if is_final { Err(format!("the tool call '{}' is unfinished", scan::excerpt(text, i))) } else { Ok((calls, None)) };
            };
            let j = skip_ws(text, end);
            match text.as_bytes().get(j) {
                Some(b';') => i = j + 1,
                // Text may still bring a `;` and another call.
                None if !is_final => return Ok((calls, None)),
                _ => return Ok((calls, Some(end))),
            }
        }
    }
}

impl ToolCallParser for Llama3Json {
    fn opener(&self) -> &str {
        PYTHON_TAG
    }

    fn parse(&self, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
        scan::parse(self, text)
    }

    /// The plain JSON form (Llama 3.1's JSON tool calling), `; ` between calls; no
    /// `<|python_tag|>` (that is Llama's built-in tools' channel).
    fn grammar(&self, tools: &[ToolSpec], mode: &ToolMode, parallel: bool, _tokenizer: &tokenizers::Tokenizer) -> String {
        const LEAD: &str = "{\"name\": ";
        let first = |name: &str, args: &str| {
            let head = format!("{}, \"parameters\": ", grammar::json_name(name));
            format!("{} {args} \"}}\"", grammar::lit(&head))
        };
        let next = |name: &str, args: &str| format!("{} {}", grammar::lit(&format!("; {LEAD}")), first(name, args));
        let shape = Shape {
            lead: grammar::lit(LEAD),
            lead_text: Some(LEAD.to_string()),
            forbid: vec![],
            first: &first,
            next: &next,
            close: String::new(),
        };
        grammar::build(&shape, tools, mode, parallel)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_util::{self, call, every_split, time, weather, Checker};
    use super::super::{ToolCallParser, ToolFormat, ToolMode};
    use super::Llama3Json;

    // As Llama 3.1/3.2 Instruct answer with JSON tool calling.
    const PLAIN: &str = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    const TAGGED: &str = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    const TWO: &str = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"Europe/Paris\"}}";

    #[test]
    fn parses_llama_calls() {
        let want = vec![call("get_weather", json!({"city": "Paris"}))];
        assert_eq!(Llama3Json.parse(PLAIN).unwrap(), (String::new(), want.clone()));
        assert_eq!(Llama3Json.parse(TAGGED).unwrap(), (String::new(), want.clone()));
        assert_eq!(Llama3Json.parse(&format!("\n\n{PLAIN}\n")).unwrap(), (String::new(), want.clone()));
        let (_, calls) = Llama3Json.parse(TWO).unwrap();
        assert_eq!(calls, vec![want[0].clone(), call("get_time", json!({"tz": "Europe/Paris"}))]);
        let (_, calls) = Llama3Json.parse(&PLAIN.replace("; ", ";").replace(' ', "")).unwrap();
        assert_eq!(calls, want);
        let (text, calls) = Llama3Json.parse(&format!("I will look it up.\n\n{TAGGED}")).unwrap();
        assert_eq!((text.as_str(), calls), ("I will look it up.", want.clone()));
        let (text, calls) = Llama3Json.parse(&format!("Checking: {PLAIN}")).unwrap();
        assert_eq!((text.as_str(), calls), ("Checking:", want));
        // "arguments" (some fine-tunes) and no arguments at all
        let (_, calls) = Llama3Json.parse("{\"name\": \"now\", \"arguments\": {}}").unwrap();
        assert_eq!(calls, vec![call("now", json!({}))]);
        let (_, calls) = Llama3Json.parse("{\"name\": \"now\"}").unwrap();
        assert_eq!(calls, vec![call("now", json!({}))]);
    }

    #[test]
    fn other_json_and_text_is_text() {
        let s = "Use {\"city\": \"Paris\"} as input.";
        assert_eq!(Llama3Json.parse(s).unwrap(), (s.to_string(), vec![]));
        assert_eq!(Llama3Json.parse("Hello!").unwrap().0, "Hello!");
    }

    #[test]
    fn malformed_calls_are_errors() {
        for bad in [
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}",
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": Paris}}",
            "<|python_tag|>brave_search.call(query=\"Paris\")",
            "{\"name\": get_weather}",
            "<|python_tag|>",
        ] {
            assert!(Llama3Json.parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn streams_like_it_parses() {
        for s in [PLAIN, TAGGED, TWO, "Okay. { \"name\" : \"f\" , \"parameters\" : { } } ; {\"name\": \"g\"}", "a {b} c"] {
            every_split(ToolFormat::Llama3Json, s);
        }
    }

    #[test]
    fn grammar_allows_only_the_tools_calls() {
        let tools = [weather(), time()];
        let tok = test_util::tokenizer(&["<|python_tag|>"]);
        let c = Checker::new(&tok);
        let two = TWO.trim_start_matches("<|python_tag|>");
        let auto = Llama3Json.grammar(&tools, &ToolMode::Auto, true, &tok);
        assert!(c.accepts(&auto, "It is sunny."), "{auto}");
        assert!(c.accepts(&auto, PLAIN));
        assert!(c.accepts(&auto, two));
        assert!(c.accepts(&auto, &format!("Let me check. {PLAIN}")));
        assert!(!c.accepts(&auto, "{\"name\": \"get_weather\", \"parameters\": {\"city\": 1}}"));
        assert!(!c.accepts(&auto, &format!("{PLAIN} done")));
        let required = Llama3Json.grammar(&tools, &ToolMode::Required, false, &tok);
        assert!(c.accepts(&required, PLAIN), "{required}");
        assert!(!c.accepts(&required, two));
        assert!(!c.accepts(&required, "It is sunny."));
        let parallel = Llama3Json.grammar(&tools, &ToolMode::Required, true, &tok);
        assert!(c.accepts(&parallel, two));
    }
}
