//! gpt-oss's harmony format (OpenAI's openai-harmony). The answer is a chain of messages,
//! each a header and a body: `<|channel|>analysis<|message|>REASONING<|end|>`, then
//! `<|start|>assistant<|channel|>final<|message|>ANSWER` (generation stops on `<|return|>`),
//! or a call `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`
//! (stops on `<|call|>`; `to=` may also come before `<|channel|>`). The analysis channel is
//! reasoning, the final channel and recipient-less commentary (a preamble to the user) are
//! content, a `functions.*` recipient is a call. Text outside any header (a model that did
//! not answer in harmony) is content.
use super::grammar;
use super::scan::{content_and_calls, held_tail, End, PartialCall, Seg};
use super::{ParsedCall, ToolCallParser, ToolMode, ToolParseError, ToolSpec};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
/// What ends a body: `<|end|>` between messages, the stop tokens (when they reach the text),
/// or the next message's `<|start|>`.
const BODY_ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", START];
/// What may open a header (`to=` before the channel, right after the prompt's role).
const HEADER_OPENS: [&str; 4] = [START, CHANNEL, MESSAGE, " to="];
const FUNCTIONS: &str = "functions.";

pub struct Harmony;

/// A header read up to `<|message|>`.
struct Header {
    channel: String,
    recipient: Option<String>,
}

fn parse_header(h: &str) -> Header {
    let word_after = |key: &str| {
        h.find(key).map(|i| {
            let rest = &h[i + key.len()..];
            let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
            rest[..end].to_string()
        })
    };
    Header { channel: word_after(CHANNEL).unwrap_or_default(), recipient: word_after("to=") }
}

/// The earliest of `pats` in `text` from `from`: (where, which).
fn find_first(text: &str, from: usize, pats: &[&str]) -> Option<(usize, usize)> {
    pats.iter().enumerate().filter_map(|(k, p)| text[from..].find(p).map(|i| (from + i, k))).min()
}

/// The longest tail of `text` that could still become one of `pats`.
fn held(text: &str, pats: &[&str]) -> usize {
    pats.iter().map(|p| held_tail(text, p)).max().unwrap_or(0)
}

/// Reads `text` into reasoning, text and call segments (the stream's and `parse`'s one
/// reading). While [`End::Growing`], an unfinished header and a possible marker's beginning
/// are held back; a call's name goes out once its header is whole.
pub(super) fn read(text: &str, end: End) -> (Vec<Seg>, Option<String>) {
    let growing = end == End::Growing;
    let mut segs = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        if !HEADER_OPENS.iter().any(|o| rest.starts_with(o)) {
            // Text outside harmony: content up to the next header.
            let stop = find_first(text, pos, &HEADER_OPENS).map_or(text.len(), |(i, _)| i);
            let mut piece = &text[pos..stop];
            if growing && stop == text.len() {
                piece = &piece[..piece.len() - held(piece, &HEADER_OPENS)];
            }
            if !piece.is_empty() {
                segs.push(Seg::Text(piece.to_string()));
            }
            if stop == text.len() {
                break;
            }
            pos = stop;
            continue;
        }
        let Some(m) = text[pos..].find(MESSAGE).map(|i| pos + i) else {
            // The header is unfinished.
            let call = text[pos..].contains(" to=");
            match end {
                End::Growing => {}
                End::Final if call => return (segs, Some(format!("the call header '{}' has no {MESSAGE}", &text[pos..]))),
                End::Final => {}
                End::Cut => segs.push(Seg::Cut),
            }
            break;
        };
        let header = parse_header(&text[pos..m]);
        let body_at = m + MESSAGE.len();
        let (body, done, next) = match find_first(text, body_at, &BODY_ENDS) {
            Some((e, k)) => (&text[body_at..e], true, if BODY_ENDS[k] == START { e } else { e + BODY_ENDS[k].len() }),
            None if growing => {
                let b = &text[body_at..];
                (&b[..b.len() - held(b, &BODY_ENDS)], false, text.len())
            }
            // The stop token that ended generation is not in the text: the body is whole.
            None => (&text[body_at..], end == End::Final, text.len()),
        };
        match header.recipient {
            Some(r) => {
                let Some(name) = r.strip_prefix(FUNCTIONS) else {
                    return (segs, Some(format!("the model addressed '{r}', which is not one of the request's functions")));
                };
                let call = PartialCall { name: Some(name.to_string()), args: body.trim().to_string(), args_done: done };
                if end == End::Cut && !done {
                    segs.push(Seg::Cut);
                } else {
                    segs.push(Seg::Call(call));
                }
            }
            None if header.channel == "analysis" => segs.push(Seg::Reasoning(body.to_string())),
            None => segs.push(Seg::Text(body.to_string())),
        }
        pos = next;
    }
    (segs, None)
}

impl ToolCallParser for Harmony {
    fn opener(&self) -> &str {
        CHANNEL
    }

    /// The content (reasoning left out) and the calls.
    fn parse(&self, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
        let (segs, err) = read(text, End::Final);
        content_and_calls(segs, err)
    }

    /// Harmony's calls: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`
    /// then the arguments (generation then ends on `<|call|>`, a stop token). Required/Named:
    /// the answer is that one call, at once (no analysis first, so no reasoning can use up
    /// `max_tokens` before it). Auto: analysis and preamble messages, then a final answer or
    /// one call. One call per answer whatever `parallel` says: `<|call|>` ends the turn.
    fn grammar(&self, tools: &[ToolSpec], mode: &ToolMode, _parallel: bool, tokenizer: &tokenizers::Tokenizer) -> String {
        let atom = |t: &str| grammar::atom(tokenizer, t);
        let (start, ch, msg, con, end) = (atom(START), atom(CHANNEL), atom(MESSAGE), atom(CONSTRAIN), atom("<|end|>"));
        let tools = grammar::allowed(tools, mode);
        let mut g = String::new();
        if *mode == ToolMode::Auto {
            g.push_str(&format!("start: (inner {end} {start} \"assistant\")* last\n"));
            g.push_str(&format!("inner: {ch} \"analysis\" {msg} TEXT | {ch} \"commentary\" {msg} TEXT\n"));
            let last = if tools.is_empty() { String::new() } else { " | call".into() };
            g.push_str(&format!("last: {ch} \"final\" {msg} TEXT{last}\n"));
            g.push_str("TEXT: /(?s:.*)/\n");
        } else {
            g.push_str("start: call\n");
        }
        if tools.is_empty() {
            return g;
        }
        g.push_str(&format!("call: {}\n", (0..tools.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | ")));
        for (i, t) in tools.iter().enumerate() {
            let head = grammar::lit(&format!("commentary to={FUNCTIONS}{} ", t.name));
            g.push_str(&format!("call_{i}: {ch} {head} {con} \"json\" {msg} args_{i}\n"));
            g.push_str(&format!("args_{i}: %json {}\n", grammar::schema(t)));
        }
        g
    }
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
