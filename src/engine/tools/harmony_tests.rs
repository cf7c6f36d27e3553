//! Harmony's reading, stream and grammar on gpt-oss's own outputs. Where each comes from:
//! DOCS_* are the examples of openai/harmony's docs/format.md ("Example output", "Receiving
//! tool calls", "Preambles"; the first is also test-data/test_simple_reasoning_response.txt,
//! whose tokens carry no newline between `<|end|>` and `<|start|>`); ADJACENT_* are
//! openai/harmony's src/tests.rs `test_tool_call_with_constrain_marker_adjacent` and
//! `test_tool_call_with_channel_before_recipient_and_constrain_adjacent`; BROWSER is
//! test-data/test_streamable_parser.txt (a built-in browser call).
use serde_json::json;

use super::super::test_util::{self, call, time, weather, Checker};
use super::super::{ToolCallParser, ToolCallStream, ToolFormat, ToolMode};
use super::Harmony;

const DOCS_ANSWER: &str =
    "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
const DOCS_CALL: &str = "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";
const DOCS_PREAMBLE: &str = "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant<|channel|>commentary<|message|>**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js server\n3. Start the server\n---\nWill start executing the plan step by step<|end|><|start|>assistant<|channel|>commentary to=functions.generate_file<|constrain|>json<|message|>{\"template\": \"basic_html\", \"path\": \"index.html\"}<|call|>";
const ADJACENT_RECIPIENT_FIRST: &str =
    "<|start|>assistant to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|end|>";
const ADJACENT_CHANNEL_FIRST: &str = "<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{\"latitude\":48.8566,\"longitude\":2.3522}<|call|>";
const BROWSER: &str = "<|channel|>analysis<|message|>Let's browse to confirm.<|end|><|start|>assistant<|channel|>commentary to=browser.search code<|message|>{\"query\": \"current US president July 2025\", \"topn\": 10, \"source\": \"news\"}<|call|>";

/// Streams `answer` in `pieces` and returns (reasoning, text, calls) as the deltas add up.
fn stream(pieces: &[&str]) -> (String, String, Vec<(String, String)>) {
    let mut s = ToolCallStream::new(ToolFormat::Harmony);
    let mut deltas = Vec::new();
    for p in pieces {
        deltas.extend(s.push(p));
    }
    deltas.extend(s.finish().expect("the stream finishes"));
    let (text, calls) = test_util::collect(&deltas);
    (test_util::reasoning(&deltas), text, calls)
}

#[test]
fn splits_reasoning_from_the_final_answer() {
    assert_eq!(Harmony.parse(DOCS_ANSWER).unwrap(), ("2 + 2 = 4.".to_string(), vec![]));
    let (reasoning, text, calls) = stream(&[DOCS_ANSWER]);
    assert_eq!(reasoning, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
    assert_eq!((text.as_str(), calls.len()), ("2 + 2 = 4.", 0));
    // the stop token, when it reaches the text, ends the body too
    assert_eq!(stream(&[DOCS_ANSWER, "<|return|>"]).1, "2 + 2 = 4.");
}

#[test]
fn reads_calls_whichever_side_of_the_channel_the_recipient_is() {
    let (_, calls) = Harmony.parse(DOCS_CALL).unwrap();
    assert_eq!(calls, vec![call("get_weather", json!({"location": "San Francisco"}))]);
    assert_eq!(stream(&[DOCS_CALL]).0, "Need to use function get_weather.");
    let (_, calls) = Harmony.parse(ADJACENT_RECIPIENT_FIRST).unwrap();
    assert_eq!(calls, vec![call("get_weather", json!({"location": "Tokyo"}))]);
    let (_, calls) = Harmony.parse(ADJACENT_CHANNEL_FIRST).unwrap();
    assert_eq!(calls, vec![call("get_weather", json!({"latitude": 48.8566, "longitude": 2.3522}))]);
    // without the stop token in the text (it ends generation and is not text)
    let cut_stop = DOCS_CALL.trim_end_matches("<|call|>");
    assert_eq!(Harmony.parse(cut_stop).unwrap().1.len(), 1);
}

#[test]
fn a_preamble_is_content() {
    let (reasoning, text, calls) = stream(&[DOCS_PREAMBLE]);
    assert_eq!(reasoning, "{long chain of thought}");
    assert!(text.starts_with("**Action plan**:\n1.") && text.ends_with("step by step"), "{text}");
    assert_eq!(calls, vec![("generate_file".to_string(), "{\"template\": \"basic_html\", \"path\": \"index.html\"}".to_string())]);
}

#[test]
fn text_outside_harmony_is_content() {
    assert_eq!(Harmony.parse("plain words").unwrap().0, "plain words");
    assert_eq!(stream(&["plain ", "words"]).1, "plain words");
    assert_eq!(Harmony.parse("<|message|>no channel").unwrap().0, "no channel");
}

#[test]
fn bad_answers_are_errors() {
    let err = Harmony.parse(BROWSER).unwrap_err().to_string();
    assert!(err.contains("browser.search"), "{err}");
    assert!(Harmony.parse("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": }").is_err());
    assert!(Harmony.parse("<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1]").is_err());
    assert!(Harmony.parse("<|channel|>commentary to=functions.f <|constrain|>json").is_err(), "a call header without a body");
}

/// Every split in two and char by char gives what the whole gives: reasoning, text, calls.
#[test]
fn streams_like_it_reads() {
    for answer in [DOCS_ANSWER, DOCS_CALL, DOCS_PREAMBLE, ADJACENT_RECIPIENT_FIRST, ADJACENT_CHANNEL_FIRST, "Voilà 🌤 plain"] {
        let whole = stream(&[answer]);
        for (i, _) in answer.char_indices().skip(1) {
            assert_eq!(stream(&[&answer[..i], &answer[i..]]), whole, "split at {i} of {answer:?}");
        }
        let chars: Vec<String> = answer.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(&pieces), whole, "char by char {answer:?}");
    }
}

#[test]
fn partial_markers_are_held_back() {
    let mut s = ToolCallStream::new(ToolFormat::Harmony);
    assert!(s.push("<|channel|>analysis<|mess").is_empty());
    assert_eq!(test_util::reasoning(&s.push("age|>Think<|e")), "Think");
    assert!(s.push("nd|><|start|>assistant<|chan").is_empty());
    let d = s.push("nel|>final<|message|>Four<|ret");
    assert_eq!(test_util::collect(&d).0, "Four");
    assert!(s.push("urn|>").is_empty());
    // a call's name goes out once its header is whole, the arguments as they come
    let mut s = ToolCallStream::new(ToolFormat::Harmony);
    assert!(s.push("<|channel|>commentary to=functions.get_wea").is_empty());
    let d = s.push("ther <|constrain|>json<|message|>{\"ci");
    assert_eq!(test_util::collect(&d).1, vec![("get_weather".to_string(), "{\"ci".to_string())]);
}

#[test]
fn a_cut_call_is_not_a_call() {
    let mut s = ToolCallStream::new(ToolFormat::Harmony);
    s.push("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Pa");
    assert!(s.finish_cut().1);
    let mut s = ToolCallStream::new(ToolFormat::Harmony);
    s.push("<|channel|>final<|message|>The answer is");
    let (d, cut) = s.finish_cut();
    assert!(!cut);
    assert_eq!(test_util::collect(&d).0, "");
}

#[test]
fn grammar_allows_harmony_and_only_the_tools_calls() {
    let tok = test_util::tokenizer(&["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]);
    let c = Checker::new(&tok);
    let tools = [weather(), time()];
    let paris = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    let auto = Harmony.grammar(&tools, &ToolMode::Auto, true, &tok);
    assert!(c.accepts(&auto, DOCS_ANSWER), "{auto}");
    assert!(c.accepts(&auto, paris));
    assert!(c.accepts(&auto, &format!("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{paris}")));
    assert!(!c.accepts(&auto, &paris.replace("get_weather", "get_wether")));
    assert!(!c.accepts(&auto, &paris.replace("city", "town")));
    assert!(!c.accepts(&auto, "no channel"));

    let required = Harmony.grammar(&tools, &ToolMode::Required, false, &tok);
    assert!(c.accepts(&required, paris), "{required}");
    assert!(c.accepts(&required, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"UTC\"}"));
    assert!(!c.accepts(&required, DOCS_ANSWER));
    let named = Harmony.grammar(&tools, &ToolMode::Named("get_time".into()), false, &tok);
    assert!(!c.accepts(&named, paris));
    // the markers are the special tokens, never their spelling
    assert!(named.contains("<["), "{named}");
}
