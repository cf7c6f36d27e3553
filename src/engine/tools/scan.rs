//! The one reading of a model's answer that both `parse` (finished answers) and the stream
//! (growing answers) use: the text is split into text segments and call segments, each family
//! supplying only where a call opens and how its body reads ([`Syntax`]). Reading a prefix of
//! an answer gives a prefix of the reading of the whole answer (text that could still turn out
//! to be a call, or whitespace that may border one, is held back), which is what lets the
//! stream emit deltas that add up to `parse`'s result.
use super::{ParsedCall, ToolParseError};

/// A piece of the answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seg {
    Text(String),
    /// The model's reasoning (harmony's analysis channel; the call families have none).
    Reasoning(String),
    Call(PartialCall),
    /// A call `max_tokens` cut short (only when read with [`End::Cut`]): not a call.
    Cut,
}

/// A call as far as it has been read.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct PartialCall {
    /// Known once its string is complete.
    pub name: Option<String>,
    /// Raw text of the arguments value so far (all of it once `args_done`).
    pub args: String,
    pub args_done: bool,
}

impl PartialCall {
    /// Its name and arguments are all there.
    pub fn is_complete(&self) -> bool {
        self.name.is_some() && self.args_done
    }
}

/// Where the next call opens.
pub(super) enum Opener {
    /// A call opens at `start`; its body is read from `body`.
    Found {
        start: usize,
        body: usize,
    },
    /// The text from `start` to the end could still become an opener.
    Partial {
        start: usize,
    },
    None,
}

/// A family's call syntax.
pub(super) trait Syntax: Send + Sync {
    fn find_opener(&self, text: &str, from: usize) -> Opener;
    /// The calls whose body starts at `at`: the calls read so far and where text resumes
    /// (`None`: the answer ends inside the calls). With `is_final`, an unfinished call is an Err.
    fn scan_calls(&self, text: &str, at: usize, is_final: bool) -> Result<(Vec<PartialCall>, Option<usize>), String>;
}

/// How much of the answer there is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// More may come: what could still become a call is held back.
    Growing,
    /// The whole answer: an unfinished call is an error.
    Final,
    /// The whole answer as far as `max_tokens` let it go: an unfinished call at the end, or
    /// the start of an opener ending an answer of calls, reads as [`Seg::Cut`].
    Cut,
}

/// Reads `text`. Whitespace bordering a call is not text; while [`End::Growing`], trailing
/// whitespace and a possible opener's beginning are held back. The Err comes with the
/// segments read before the fault.
pub(super) fn scan(syn: &dyn Syntax, text: &str, end: End) -> (Vec<Seg>, Option<String>) {
    let mut segs = Vec::new();
    let mut pos = 0;
    let mut after_call = false;
    loop {
        match syn.find_opener(text, pos) {
            Opener::Found { start, body } => {
                push_text(&mut segs, &text[pos..start], after_call, true);
                match syn.scan_calls(text, body, end == End::Final) {
                    Err(e) => return (segs, Some(e)),
                    Ok((mut calls, resume)) => {
                        let cut = end == End::Cut && resume.is_none() && !calls.last().is_some_and(PartialCall::is_complete);
                        if cut {
                            calls.pop();
                        }
                        segs.extend(calls.into_iter().map(Seg::Call));
                        match resume {
                            Some(e) => {
                                pos = e;
                                after_call = true;
                            }
                            None => {
                                if cut {
                                    segs.push(Seg::Cut);
                                }
                                return (segs, None);
                            }
                        }
                    }
                }
            }
            Opener::Partial { start } if end == End::Growing => {
                push_text(&mut segs, &text[pos..start], after_call, true);
                return (segs, None);
            }
            // In an answer with text the same letters could be text: they stay text.
            Opener::Partial { start }
                if end == End::Cut && text[pos..start].trim().is_empty() && segs.iter().all(|s| matches!(s, Seg::Call(_))) =>
            {
                segs.push(Seg::Cut);
                return (segs, None);
            }
            Opener::Partial { .. } | Opener::None => {
                push_text(&mut segs, &text[pos..], after_call, end == End::Growing);
                return (segs, None);
            }
        }
    }
}

fn push_text(segs: &mut Vec<Seg>, t: &str, after_call: bool, trim_end: bool) {
    let t = if after_call { t.trim_start() } else { t };
    let t = if trim_end { t.trim_end() } else { t };
    if !t.is_empty() {
        segs.push(Seg::Text(t.to_string()));
    }
}

/// `parse` for any family: the text outside calls, and the calls with compact arguments.
pub(super) fn parse(syn: &dyn Syntax, text: &str) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
    let (segs, err) = scan(syn, text, End::Final);
    content_and_calls(segs, err)
}

/// A whole answer's segments (from any family's reader) as its text outside calls, reasoning
/// left out, and its calls; the reader's error, if it had one.
pub(super) fn content_and_calls(segs: Vec<Seg>, err: Option<String>) -> Result<(String, Vec<ParsedCall>), ToolParseError> {
    if let Some(e) = err {
        return Err(ToolParseError::new(e));
    }
    let mut out = String::new();
    let mut calls = Vec::new();
    for s in segs {
        match s {
            Seg::Text(t) => out.push_str(&t),
            Seg::Call(c) => calls.push(finish_call(&c)?),
            Seg::Reasoning(_) | Seg::Cut => {}
        }
    }
    Ok((out, calls))
}

/// A fully read call as a ParsedCall: a name, and arguments that are one JSON object.
pub(super) fn finish_call(c: &PartialCall) -> Result<ParsedCall, ToolParseError> {
    let name = c.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| ToolParseError::new("a tool call has no function name"))?;
    if !c.args_done {
        return Err(ToolParseError::new(format!("the call to '{name}' is unfinished")));
    }
    let value: serde_json::Value = serde_json::from_str(&c.args)
        .map_err(|e| ToolParseError::new(format!("the arguments of the call to '{name}' are not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ToolParseError::new(format!("the arguments of the call to '{name}' are not a JSON object")));
    }
    Ok(ParsedCall { name, arguments: value.to_string() })
}

// ---- reading JSON by hand, since text may end anywhere in it ----

/// Result of reading a JSON piece that starts at a position.
pub(super) enum Read<T> {
    /// Read; ends before this byte offset.
    Done(T, usize),
    /// The text ends inside it.
    More,
}

pub(super) fn skip_ws(s: &str, mut i: usize) -> usize {
    let b = s.as_bytes();
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// A JSON string starting at `s[i] == '"'`, decoded.
pub(super) fn read_string(s: &str, i: usize) -> Result<Read<String>, String> {
    let b = s.as_bytes();
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => {
                let v: String = serde_json::from_str(&s[i..=j]).map_err(|e| format!("bad JSON string: {e}"))?;
                return Ok(Read::Done(v, j + 1));
            }
            _ => j += 1,
        }
    }
    Ok(Read::More)
}

/// The end of any JSON value starting at `i` (objects and arrays by bracket matching; their
/// validity is checked once complete, by serde_json).
pub(super) fn read_value(s: &str, i: usize) -> Result<Read<()>, String> {
    let b = s.as_bytes();
    match b.get(i) {
        None => Ok(Read::More),
        Some(b'"') => Ok(match read_string(s, i)? {
            Read::Done(_, e) => Read::Done((), e),
            Read::More => Read::More,
        }),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => match read_string(s, j)? {
                        Read::Done(_, e) => {
                            j = e;
                            continue;
                        }
                        Read::More => return Ok(Read::More),
                    },
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(Read::Done((), j + 1));
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Ok(Read::More)
        }
        Some(c) if c.is_ascii_alphanumeric() || *c == b'-' => {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'-' | b'+' | b'.')) {
                j += 1;
            }
            Ok(if j == b.len() { Read::More } else { Read::Done((), j) })
        }
        Some(_) => Err(format!("expected a JSON value at '{}'", excerpt(s, i))),
    }
}

/// A call object `{"name": ..., <args key>: {...}, ...}` starting at `s[i] == '{'`, as far as
/// it goes: the call, and the end of the object once complete. Other keys are skipped.
pub(super) fn read_envelope(s: &str, i: usize, arg_keys: &[&str]) -> Result<(PartialCall, Option<usize>), String> {
    let b = s.as_bytes();
    let mut call = PartialCall::default();
    let mut seen_args = false;
    let mut j = i + 1;
    loop {
        j = skip_ws(s, j);
        let Some(&c) = b.get(j) else { return Ok((call, None)) };
        if c == b'}' {
            if !seen_args {
                // A call without arguments (Llama omits them for functions that take none).
                call.args = "{}".into();
                call.args_done = true;
            }
            return Ok((call, Some(j + 1)));
        }
        if c != b'"' {
            return Err(format!("expected a key in the tool call at '{}'", excerpt(s, j)));
        }
        let key = match read_string(s, j)? {
            Read::Done(k, e) => {
                j = e;
                k
            }
            Read::More => return Ok((call, None)),
        };
        j = skip_ws(s, j);
        match b.get(j) {
            None => return Ok((call, None)),
            Some(b':') => j = skip_ws(s, j + 1),
            Some(_) => return Err(format!("expected ':' in the tool call at '{}'", excerpt(s, j))),
        }
        if key == "name" && b.get(j) == Some(&b'"') {
            match read_string(s, j)? {
                Read::Done(n, e) => {
                    call.name = Some(n);
                    j = e;
                }
                Read::More => return Ok((call, None)),
            }
        } else if arg_keys.contains(&key.as_str()) && !seen_args {
            seen_args = true;
            match read_value(s, j)? {
                Read::Done((), e) => {
                    call.args = s[j..e].to_string();
                    call.args_done = true;
                    j = e;
                }
                Read::More => {
                    call.args = s[j..].to_string();
                    return Ok((call, None));
                }
            }
        } else {
            match read_value(s, j)? {
                Read::Done((), e) => j = e,
                Read::More => return Ok((call, None)),
            }
        }
        j = skip_ws(s, j);
        match b.get(j) {
            None => return Ok((call, None)),
            Some(b',') => j += 1,
            Some(b'}') => {}
            Some(_) => return Err(format!("expected ',' or '}}' in the tool call at '{}'", excerpt(s, j))),
        }
    }
}

/// Where `lit` occurs in `text[from..]`, else where a proper prefix of it ends the text.
pub(super) fn find_literal(text: &str, from: usize, lit: &str) -> Opener {
    if let Some(p) = text[from..].find(lit) {
        return Opener::Found { start: from + p, body: from + p + lit.len() };
    }
    let k = held_tail(&text[from..], lit);
    if k > 0 {
        Opener::Partial { start: text.len() - k }
    } else {
        Opener::None
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `lit`.
pub(super) fn held_tail(text: &str, lit: &str) -> usize {
    (1..lit.len()).rev().find(|&k| lit.is_char_boundary(k) && text.ends_with(&lit[..k])).unwrap_or(0)
}

/// `s` from `i`, shortened for an error message.
pub(super) fn excerpt(s: &str, i: usize) -> String {
    s[i..].chars().take(24).collect()
}
