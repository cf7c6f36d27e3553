//! Test helpers: llguidance checks of the tool grammars on a tiny model's tokenizer, and
//! feeding answers to the stream split every which way.
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::TokEnv;

use super::{ParsedCall, ToolCallStream, ToolDelta, ToolFormat, ToolSpec};

/// Qwen 2 tiny's byte-level tokenizer, with `extra` added as special tokens.
pub fn tokenizer(extra: &[&str]) -> tokenizers::Tokenizer {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny/qwen2-bias/tokenizer.json");
    let mut t = tokenizers::Tokenizer::from_file(path).expect("tiny tokenizer");
    let added: Vec<tokenizers::AddedToken> = extra.iter().map(|s| tokenizers::AddedToken::from(s.to_string(), true)).collect();
    t.add_special_tokens(&added);
    t
}

pub struct Checker {
    factory: Arc<ParserFactory>,
    env: TokEnv,
}

impl Checker {
    pub fn new(tokenizer: &tokenizers::Tokenizer) -> Self {
        let json = tokenizer.to_string(false).expect("tokenizer json");
        let bt = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes()).expect("byte tokenizer");
        let env = bt.into_tok_env(None).expect("tok env");
        let mut factory = ParserFactory::new_simple(&env).expect("parser factory");
        factory.quiet();
        Checker { factory: Arc::new(factory), env }
    }

    fn matcher(&self, grammar: &str) -> Matcher {
        let m = Matcher::new(self.factory.create_parser(TopLevelGrammar::from_lark(grammar.to_string())));
        assert!(!m.is_error(), "grammar does not compile: {:?}\n{grammar}", m.get_error());
        m
    }

    /// Whether the grammar accepts exactly `text` (special tokens written as their text).
    pub fn accepts(&self, grammar: &str, text: &str) -> bool {
        let mut m = self.matcher(grammar);
        for t in self.env.tokenize_special(text) {
            let Ok(mask) = m.compute_mask() else { return false };
            if !mask.is_allowed(t) || m.consume_token(t).is_err() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }
}

pub fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: Some("Current weather in a city".into()),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": false
        }),
    }
}

pub fn time() -> ToolSpec {
    ToolSpec {
        name: "get_time".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}),
    }
}

pub fn call(name: &str, args: serde_json::Value) -> ParsedCall {
    ParsedCall { name: name.into(), arguments: args.to_string() }
}

/// The reasoning a stream's deltas add up to.
pub fn reasoning(deltas: &[ToolDelta]) -> String {
    deltas.iter().filter_map(|d| if let ToolDelta::Reasoning(r) = d { Some(r.as_str()) } else { None }).collect()
}

/// What a stream's deltas add up to: the text, and each call's name and arguments text
/// (reasoning apart: [`reasoning`]).
pub fn collect(deltas: &[ToolDelta]) -> (String, Vec<(String, String)>) {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for d in deltas {
        match d {
            ToolDelta::Text(t) => text.push_str(t),
            ToolDelta::Reasoning(_) => {}
            ToolDelta::CallStart { index, name } => {
                assert_eq!(*index, calls.len(), "calls start in order");
                calls.push((name.clone(), String::new()));
            }
            ToolDelta::CallArguments { index, fragment } => calls[*index].1.push_str(fragment),
        }
    }
    (text, calls)
}

/// Streams `answer` in the given pieces and checks the deltas add up to `parse` of the whole.
pub fn stream_matches_parse(format: ToolFormat, pieces: &[&str]) {
    let whole: String = pieces.concat();
    let (want_text, want_calls) = format.parser().parse(&whole).expect("the sample parses");
    let mut s = ToolCallStream::new(format);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(s.push(p));
    }
    deltas.extend(s.finish().expect("the stream finishes"));
    let (text, calls) = collect(&deltas);
    assert_eq!(text, want_text, "text of {pieces:?}");
    assert_eq!(calls.len(), want_calls.len(), "calls of {pieces:?}");
    for ((name, args), want) in calls.iter().zip(&want_calls) {
        assert_eq!(name, &want.name);
        let got: serde_json::Value =
            serde_json::from_str(args).unwrap_or_else(|e| panic!("streamed arguments {args:?} of {pieces:?}: {e}"));
        assert_eq!(got.to_string(), want.arguments, "arguments of {pieces:?}");
    }
}

/// [`stream_matches_parse`] for every split in two, and char by char.
pub fn every_split(format: ToolFormat, answer: &str) {
    for (i, _) in answer.char_indices().skip(1) {
        stream_matches_parse(format, &[&answer[..i], &answer[i..]]);
    }
    let chars: Vec<String> = answer.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    stream_matches_parse(format, &pieces);
}
