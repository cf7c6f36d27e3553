//! Mistral calls, both generations: `[TOOL_CALLS] [{"name": "get_weather", "arguments":
//! {"city": "Paris"}}, ...]` (tokenizer v3, Mistral 7B v0.3 / Nemo) and
//! `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}` repeated per call (v11+, Mistral Small
//! 3.x; an optional `[CALL_ID]id` before `[ARGS]` is skipped).
use super::grammar::{self, Shape};
use super::scan::{self, find_literal, read_envelope, read_value, skip_ws, Opener, Read, Syntax};
use super::{ParsedCall, ToolCallParser, ToolMode, ToolParseError, ToolSpec};

const OPEN: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

pub struct Mistral;

impl Mistral {
    /// v3: the array of call objects starting at `text[i] == '['`.
    fn scan_array(text: &str, i: usize, is_final: bool) -> Result<(Vec<scan::PartialCall>, Option<usize>), String> {
        let unfinished = || Err(format!("the tool calls '{}' are unfinished", scan::excerpt(text, i)));
        let mut calls = Vec::new();
        let mut j = i + 1;
        loop {
            j = skip_ws(text, j);
            match text.as_bytes().get(j) {
                None if is_final => return unfinished(),
                None => return Ok((calls, None)),
                Some(b'{') => {}
                Some(_) => return Err(format!("expected a call object in {OPEN}, found '{}'", scan::excerpt(text, j))),
            }
            let (call, end) = read_envelope(text, j, &["arguments", "parameters"])?;
            calls.push(call);
            let Some(end) = end else { return if is_final { unfinished() } else { Ok((calls, None)) } };
            j = skip_ws(text, end);
            match text.as_bytes().get(j) {
                Some(b',') => j += 1,
                Some(b']') => return Ok((calls, Some(j + 1))),
                None if is_final => return unfinished(),
                None => return Ok((calls, None)),
                Some(_) => return Err(format!("expected ',' or ']' in {OPEN}, found '{}'", scan::excerpt(text, j))),
            }
        }
    }

    /// v11: `name[ARGS]{...}` from `i`.
    fn scan_named(text: &str, i: usize, is_final: bool) -> Result<(Vec<scan::PartialCall>, Option<usize>), String> {
        let unfinished = || Err(format!("the tool call '{}' is unfinished", scan::excerpt(text, i)));
        let mut call = scan::PartialCall::default();
        let Some(b) = text[i..].find('[').map(|b| i + b) else {
            return if is_final { unfinished() } else { Ok((vec![call], None)) };
        };
        let mut rest = &text[b..];
        let mut j = b;
        if rest.starts_with(CALL_ID) {
            match text[b + CALL_ID.len()..].find(ARGS) {
                Some(a) => j = b + CALL_ID.len() + a,
                None if is_final => return unfinished(),
                None => return Ok((vec![call], None)),
            }
            rest = &text[j..];
        }
        if !rest.starts_with(ARGS) {
            if !is_final && (ARGS.starts_with(rest) || CALL_ID.starts_with(rest)) {
                return Ok((vec![call], None));
            }
            return Err(format!("expected {ARGS} after the function name in '{}'", scan::excerpt(text, i)));
        }
        call.name = Some(text[i..b].trim().to_string());
        let a = skip_ws(text, j + ARGS.len());
        match read_value(text, a)? {
            Read::Done((), e) => {
                call.args = text[a..e].to_string();
                call.args_done = true;
                Ok((vec![call], Some(e)))
            }
            Read::More if is_final => unfinished(),
            Read::More => {
                call.args = text[a..].to_string();
                Ok((vec![call], None))
            }
        }
    }
}

impl Syntax for Mistral {
    fn find_opener(&self, text: &str, from: usize) -> Opener {
        find_literal(text, from, OPEN)
    }

    fn scan_calls(&self, text: &str, at: usize, is_final: bool) -> Result<(Vec<scan::PartialCall>, Option<usize>), String> {
        let i = skip_ws(text, at);
        match text.as_bytes().get(i) {
            None if is_final => Err(format!("{OPEN} is not followed by a call")),
            None => Ok((vec![Default::default()], None)),
            Some(b'[') => Self::scan_array(text, i, is_final),
            Some(_) => Self::scan_named(text, i, is_final),
        }
    }
}

impl ToolCallParser for Mistral {
    fn opener(&self) -> &str {
        OPEN
    }

    fn parse(&self, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
        scan::parse(self, text)
    }

    /// The `name[ARGS]{...}` form when the vocabulary has `[ARGS]` (tokenizer v11+), else the
    /// JSON array form.
    fn grammar(&self, tools: &[ToolSpec], mode: &ToolMode, parallel: bool, tokenizer: &tokenizers::Tokenizer) -> String {
        let open = grammar::atom(tokenizer, OPEN);
        let special = grammar::marker(tokenizer, OPEN).is_some();
        let forbid = if special { vec![grammar::forbid_text(OPEN)] } else { vec![] };
        if tokenizer.token_to_id(ARGS).is_some() {
            let args_atom = grammar::atom(tokenizer, ARGS);
            let first = |name: &str, args: &str| format!("{} {args_atom} {args}", grammar::lit(name));
            let next = |name: &str, args: &str| format!("{open} {}", first(name, args));
            let shape = Shape {
                lead: open.clone(),
                lead_text: (!special).then(|| OPEN.to_string()),
                forbid,
                first: &first,
                next: &next,
                close: String::new(),
            };
            return grammar::build(&shape, tools, mode, parallel);
        }
        let first = |name: &str, args: &str| {
            let head = format!("{{\"name\": {}, \"arguments\": ", grammar::json_name(name));
            format!("{} {args} \"}}\"", grammar::lit(&head))
        };
        let next = |name: &str, args: &str| format!("\", \" {}", first(name, args));
        let shape = Shape {
            lead: format!("{open} \"[\""),
            lead_text: (!special).then(|| format!("{OPEN}[")),
            forbid,
            first: &first,
            next: &next,
            close: "\"]\"".into(),
        };
        grammar::build(&shape, tools, mode, parallel)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_util::{self, call, every_split, time, weather, Checker};
    use super::super::{ToolCallParser, ToolFormat, ToolMode};
    use super::Mistral;

    // Mistral 7B Instruct v0.3 (tokenizer v3), as decoded with its special tokens.
    const V3: &str = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]";
    const V3_TWO: &str = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}]";
    // Mistral Small 3.1+ (tokenizer v11).
    const V11: &str = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}";
    const V11_TWO: &str = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"Europe/Paris\"}";

    #[test]
    fn parses_both_generations() {
        let one = vec![call("get_weather", json!({"city": "Paris"}))];
        let two = vec![one[0].clone(), call("get_time", json!({"tz": "Europe/Paris"}))];
        assert_eq!(Mistral.parse(V3).unwrap(), (String::new(), one.clone()));
        assert_eq!(Mistral.parse(&V3.replace("] [", "][")).unwrap().1, one);
        assert_eq!(Mistral.parse(V3_TWO).unwrap().1, two);
        assert_eq!(Mistral.parse(V11).unwrap(), (String::new(), one.clone()));
        assert_eq!(Mistral.parse(V11_TWO).unwrap().1, two);
        assert_eq!(Mistral.parse("[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Paris\"}").unwrap().1, one);
        let (text, calls) = Mistral.parse(&format!("Let me check.\n{V11}")).unwrap();
        assert_eq!((text.as_str(), calls), ("Let me check.", one));
        // v3 carries an id on later turns' calls; other keys are ignored
        let (_, calls) = Mistral.parse("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcdefghi\"}]").unwrap();
        assert_eq!(calls, vec![call("f", json!({}))]);
        assert_eq!(Mistral.parse("[Note] plain").unwrap().0, "[Note] plain");
    }

    #[test]
    fn malformed_calls_are_errors() {
        for bad in [
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}]",
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"",
            "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}",
            "[TOOL_CALLS]get_weather[ARGS][1]",
            "[TOOL_CALLS]",
        ] {
            assert!(Mistral.parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn streams_like_it_parses() {
        for s in [V3, V3_TWO, V11, V11_TWO, "Sure. [TOOL_CALLS]f[CALL_ID]x[ARGS] {} ok", "[x] [TOOL"] {
            every_split(ToolFormat::Mistral, s);
        }
    }

    #[test]
    fn grammar_allows_only_the_tools_calls() {
        let tools = [weather(), time()];
        // v3: [TOOL_CALLS] is a special token, [ARGS] absent
        let tok = test_util::tokenizer(&["[TOOL_CALLS]"]);
        let c = Checker::new(&tok);
        let v3 = V3.replace("] [", "][");
        let auto = Mistral.grammar(&tools, &ToolMode::Auto, true, &tok);
        assert!(c.accepts(&auto, "Sunny."), "{auto}");
        assert!(c.accepts(&auto, &v3));
        assert!(c.accepts(&auto, &V3_TWO.replace("] [", "][")));
        assert!(!c.accepts(&auto, "text [TOOL_CALLS] text"));
        assert!(!c.accepts(&auto, V11));
        let required = Mistral.grammar(&tools, &ToolMode::Required, false, &tok);
        assert!(c.accepts(&required, &v3), "{required}");
        assert!(!c.accepts(&required, &V3_TWO.replace("] [", "][")));
        // v11
        let tok = test_util::tokenizer(&["[TOOL_CALLS]", "[ARGS]"]);
        let c = Checker::new(&tok);
        let auto = Mistral.grammar(&tools, &ToolMode::Auto, true, &tok);
        assert!(c.accepts(&auto, V11), "{auto}");
        assert!(c.accepts(&auto, V11_TWO));
        assert!(c.accepts(&auto, &format!("Checking. {V11}")));
        assert!(!c.accepts(&auto, "[TOOL_CALLS]get_wether[ARGS]{\"city\": \"Paris\"}"));
        let named = Mistral.grammar(&tools, &ToolMode::Named("get_time".into()), false, &tok);
        assert!(c.accepts(&named, "[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}"), "{named}");
        assert!(!c.accepts(&named, V11));
    }
}
