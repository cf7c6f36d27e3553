//! Hermes-style calls (Qwen 2.5/3, NousResearch Hermes, and the fallback prompt):
//! `<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`, several
//! in a row (whitespace between them), text allowed before and between calls.
use super::grammar::{self, Shape};
use super::scan::{self, find_literal, read_envelope, skip_ws, Opener, Syntax};
use super::{ParsedCall, ToolCallParser, ToolMode, ToolParseError, ToolSpec};

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";

pub struct Hermes;

impl Syntax for Hermes {
    fn find_opener(&self, text: &str, from: usize) -> Opener {
        find_literal(text, from, OPEN)
    }

    fn scan_calls(&self, text: &str, at: usize, is_final: bool) -> Result<(Vec<scan::PartialCall>, Option<usize>), String> {
        let i = skip_ws(text, at);
        if i == text.len() {
            return if is_final { Err(format!("{OPEN} is not followed by a call")) } else { Ok((vec![Default::default()], None)) };
        }
        if text.as_bytes()[i] != b'{' {
            return Err(format!("{OPEN} is not followed by a JSON object but '{}'", scan::excerpt(text, i)));
        }
        let (call, end) = read_envelope(text, i, &["arguments", "parameters"])?;
        let Some(end) = end else {
            return if is_final {
                Err(format!("the tool call '{}' is unfinished", scan::excerpt(text, i)))
            } else {
                Ok((vec![call], None))
            };
        };
        let j = skip_ws(text, end);
        let rest = &text[j..];
        if rest.starts_with(CLOSE) {
            Ok((vec![call], Some(j + CLOSE.len())))
        } else if CLOSE.starts_with(rest) {
            // The answer may end where the closing tag would be (generation stopped on it).
            Ok((vec![call], if is_final { Some(text.len()) } else { None }))
        } else {
            Err(format!("expected {CLOSE} after the tool call, found '{}'", scan::excerpt(text, j)))
        }
    }
}

impl ToolCallParser for Hermes {
    fn opener(&self) -> &str {
        OPEN
    }

    fn parse(&self, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
        scan::parse(self, text)
    }

    fn grammar(&self, tools: &[ToolSpec], mode: &ToolMode, parallel: bool, tokenizer: &tokenizers::Tokenizer) -> String {
        let open = grammar::atom(tokenizer, OPEN);
        let close = grammar::atom(tokenizer, CLOSE);
        let special = grammar::marker(tokenizer, OPEN).is_some();
        let first = |name: &str, args: &str| {
            let head = format!("\n{{\"name\": {}, \"arguments\": ", grammar::json_name(name));
            format!("{} {args} {} {close}", grammar::lit(&head), grammar::lit("}\n"))
        };
        let next = |name: &str, args: &str| format!("{} {open} {}", grammar::lit("\n"), first(name, args));
        let shape = Shape {
            lead: open.clone(),
            lead_text: (!special).then(|| OPEN.to_string()),
            forbid: if special { vec![grammar::forbid_text(OPEN)] } else { vec![] },
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
    use super::Hermes;

    // As Qwen2.5-7B-Instruct answers (with the newlines its template shows it).
    const ONE: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const TWO: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
    const TEXT_FIRST: &str =
        "Let me check the weather for you.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn parses_qwen_calls() {
        assert_eq!(Hermes.parse(ONE).unwrap(), (String::new(), vec![call("get_weather", json!({"city": "Paris"}))]));
        let (text, calls) = Hermes.parse(TWO).unwrap();
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![call("get_weather", json!({"city": "Paris", "unit": "celsius"})), call("get_time", json!({"tz": "Europe/Paris"}))]
        );
        let (text, calls) = Hermes.parse(TEXT_FIRST).unwrap();
        assert_eq!(text, "Let me check the weather for you.");
        assert_eq!(calls.len(), 1);
        // compact, whitespace-free and unclosed at the end (generation stopped on the tag)
        let (_, calls) = Hermes.parse("<tool_call>{\"name\":\"get_weather\",\"arguments\":{ \"city\" : \"Paris\" }}").unwrap();
        assert_eq!(calls, vec![call("get_weather", json!({"city": "Paris"}))]);
        // key order does not matter, nor do nested values
        let (_, calls) =
            Hermes.parse("<tool_call>\n{\"arguments\": {\"q\": {\"a\": [1, \"}\"]}}, \"name\": \"search\"}\n</tool_call>").unwrap();
        assert_eq!(calls, vec![call("search", json!({"q": {"a": [1, "}"]}}))]);
    }

    #[test]
    fn plain_text_is_text() {
        assert_eq!(Hermes.parse("Paris is sunny.\n").unwrap(), ("Paris is sunny.\n".to_string(), vec![]));
        // a partial opener at the end is just text
        assert_eq!(Hermes.parse("a <tool_").unwrap().0, "a <tool_");
    }

    #[test]
    fn malformed_calls_are_errors() {
        for bad in [
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}\n</tool_call>",
            "<tool_call>\nget_weather(city=\"Paris\")\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": \"x\"}\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>",
            "<tool_call>",
        ] {
            assert!(Hermes.parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn streams_like_it_parses() {
        for s in [
            ONE,
            TWO,
            TEXT_FIRST,
            "Sure.\n\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\nDone.",
            "no calls <tool here",
            "Voilà 🌤\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich ☀\"}}\n</tool_call>",
        ] {
            every_split(ToolFormat::Hermes, s);
        }
    }

    #[test]
    fn stream_sends_the_name_before_the_arguments_end() {
        let mut s = super::super::ToolCallStream::new(ToolFormat::Hermes);
        assert_eq!(test_util::collect(&s.push("Hi <tool_")), ("Hi".into(), vec![]));
        let d = s.push("call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
        assert_eq!(test_util::collect(&d), (String::new(), vec![("get_weather".into(), "{\"ci".into())]));
        assert!(s.push("ty\": \"Paris\"}}\n</tool_call>").iter().all(|d| !matches!(d, super::super::ToolDelta::Text(_))));
        assert!(s.finish().unwrap().is_empty());
        let mut s = super::super::ToolCallStream::new(ToolFormat::Hermes);
        s.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {");
        assert!(s.finish().is_err(), "an unfinished call is an error");
    }

    /// Cut by `max_tokens` at every point of two calls: the calls whose arguments are
    /// complete, no text, and whether a call was cut (inside one, or inside the next opener).
    #[test]
    fn a_cut_answer_keeps_its_complete_calls() {
        // Where each call's arguments end, and where the first call's closing tag does.
        let a1 = TWO.find("}}\n</tool_call>").unwrap() + 1;
        let a2 = TWO.rfind("}}\n</tool_call>").unwrap() + 1;
        let c1 = TWO.find("</tool_call>").unwrap() + "</tool_call>".len();
        for end in 1..=TWO.len() {
            let mut s = super::super::ToolCallStream::new(ToolFormat::Hermes);
            let mut deltas = s.push(&TWO[..end]);
            let (rest, cut) = s.finish_cut();
            deltas.extend(rest);
            let (text, calls) = test_util::collect(&deltas);
            let at = format!("cut after {:?}", &TWO[..end]);
            assert_eq!(text, "", "{at}");
            let whole = calls.iter().filter(|(_, a)| serde_json::from_str::<serde_json::Value>(a).is_ok()).count();
            assert_eq!(whole, usize::from(end >= a1) + usize::from(end >= a2), "{at}: {calls:?}");
            // Past the first call's tag and its "\n", "<" starts the next opener.
            assert_eq!(cut, end < a1 || (end > c1 + 1 && end < a2), "{at}");
        }
        // Text followed by the start of an opener: the letters stay text, nothing was cut.
        let mut s = super::super::ToolCallStream::new(ToolFormat::Hermes);
        let mut deltas = s.push("Paris is sunny <tool");
        let (rest, cut) = s.finish_cut();
        deltas.extend(rest);
        assert_eq!(test_util::collect(&deltas), ("Paris is sunny <tool".to_string(), vec![]));
        assert!(!cut);
    }

    #[test]
    fn grammar_allows_only_the_tools_calls() {
        let tools = [weather(), time()];
        for tok in [test_util::tokenizer(&[]), test_util::tokenizer(&["<tool_call>", "</tool_call>"])] {
            let c = Checker::new(&tok);
            let auto = Hermes.grammar(&tools, &ToolMode::Auto, true, &tok);
            assert!(c.accepts(&auto, "The weather is fine."), "{auto}");
            assert!(c.accepts(&auto, ""));
            assert!(c.accepts(&auto, ONE));
            assert!(c.accepts(&auto, TEXT_FIRST));
            assert!(c.accepts(&auto, TWO));
            assert!(!c.accepts(&auto, "<tool_call>\n{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
            assert!(!c.accepts(&auto, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>"));
            assert!(!c.accepts(&auto, "text <tool_call> more text"));
            assert!(!c.accepts(&auto, &format!("{ONE} and text after")));

            let required = Hermes.grammar(&tools, &ToolMode::Required, false, &tok);
            assert!(c.accepts(&required, ONE));
            assert!(!c.accepts(&required, TWO), "one call only");
            assert!(!c.accepts(&required, TEXT_FIRST));
            assert!(!c.accepts(&required, "Paris"));

            let named = Hermes.grammar(&tools, &ToolMode::Named("get_time".into()), true, &tok);
            assert!(!c.accepts(&named, ONE));
            assert!(c.accepts(&named, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"));
        }
    }
}
