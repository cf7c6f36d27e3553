//! Splits a growing answer into text, reasoning and tool-call deltas. Text that could be the start of a
//! call (a partial opener, like `TextStream` holds a partial stop string) and whitespace that
//! may border a call are held back; inside a call, `CallStart` goes out as soon as the name is
//! complete and the arguments' raw JSON text follows in fragments as it arrives. Each push
//! re-reads the whole answer with the parser's own reading (answers are short) and sends what
//! that reading adds, so the deltas always add up to what `parse` returns for the whole.
use super::scan::{self, finish_call, End, Seg, Syntax};
use super::{harmony, hermes, llama3, mistral, ToolFormat, ToolParseError};

#[derive(Debug, Clone, PartialEq)]
pub enum ToolDelta {
    Text(String),
    /// The model's reasoning (harmony's analysis channel).
    Reasoning(String),
    CallStart {
        index: usize,
        name: String,
    },
    CallArguments {
        index: usize,
        fragment: String,
    },
}

pub struct ToolCallStream {
    /// The call families' reading ([`scan`]); None: harmony's ([`harmony::read`]).
    syntax: Option<&'static dyn Syntax>,
    text: String,
    /// Per segment already seen: bytes of text sent, or (call started, argument bytes sent).
    sent: Vec<Sent>,
    /// Set once the answer is malformed: nothing more is sent until `finish` reports it.
    failed: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Sent {
    Text(usize),
    Call { started: bool, args: usize },
}

impl ToolCallStream {
    pub fn new(format: ToolFormat) -> Self {
        let syntax: Option<&'static dyn Syntax> = match format {
            ToolFormat::Hermes => Some(&hermes::Hermes),
            ToolFormat::Llama3Json => Some(&llama3::Llama3Json),
            ToolFormat::Mistral => Some(&mistral::Mistral),
            ToolFormat::Harmony => None,
        };
        ToolCallStream { syntax, text: String::new(), sent: Vec::new(), failed: None }
    }

    fn read(&self, end: End) -> (Vec<Seg>, Option<String>) {
        match self.syntax {
            Some(syntax) => scan::scan(syntax, &self.text, end),
            None => harmony::read(&self.text, end),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.text.push_str(text);
        if self.failed.is_some() {
            return vec![];
        }
        let (segs, err) = self.read(End::Growing);
        self.failed = err;
        self.emit(&segs)
    }

    /// End of generation: releases held text; an unfinished call is an Err.
    pub fn finish(&mut self) -> Result<Vec<ToolDelta>, ToolParseError> {
        if let Some(e) = &self.failed {
            return Err(ToolParseError::new(e.clone()));
        }
        let (segs, err) = self.read(End::Final);
        if let Some(e) = err {
            self.failed = Some(e.clone());
            return Err(ToolParseError::new(e));
        }
        for s in &segs {
            if let Seg::Call(c) = s {
                finish_call(c)?;
            }
        }
        Ok(self.emit(&segs))
    }

    /// End of generation cut short by `max_tokens`: releases held text. A call it cut (or the
    /// opener it cut, ending an answer of calls) is not a call: nothing more of it goes out
    /// (a stream has sent its start; a whole answer leaves it out). Returns the deltas and
    /// whether a call was cut.
    pub fn finish_cut(&mut self) -> (Vec<ToolDelta>, bool) {
        if self.failed.is_some() {
            return (vec![], false);
        }
        let (segs, err) = self.read(End::Cut);
        if err.is_some() {
            return (vec![], false);
        }
        let cut = matches!(segs.last(), Some(Seg::Cut));
        (self.emit(&segs), cut)
    }

    fn emit(&mut self, segs: &[Seg]) -> Vec<ToolDelta> {
        let mut out = Vec::new();
        let mut index = 0;
        for (i, seg) in segs.iter().enumerate() {
            match seg {
                Seg::Text(t) | Seg::Reasoning(t) => {
                    let from = match self.sent.get(i) {
                        Some(Sent::Text(n)) => *n,
                        _ => 0,
                    };
                    if t.len() > from {
                        push_text(&mut out, &t[from..], matches!(seg, Seg::Reasoning(_)));
                    }
                    self.set(i, Sent::Text(t.len()));
                }
                Seg::Call(c) => {
                    let (mut started, mut args) = match self.sent.get(i) {
                        Some(Sent::Call { started, args }) => (*started, *args),
                        _ => (false, 0),
                    };
                    if let (false, Some(name)) = (started, &c.name) {
                        out.push(ToolDelta::CallStart { index, name: name.clone() });
                        started = true;
                    }
                    if started && c.args.len() > args {
                        out.push(ToolDelta::CallArguments { index, fragment: c.args[args..].to_string() });
                        args = c.args.len();
                    }
                    self.set(i, Sent::Call { started, args });
                    index += 1;
                }
                Seg::Cut => {}
            }
        }
        out
    }

    fn set(&mut self, i: usize, s: Sent) {
        if i < self.sent.len() {
            self.sent[i] = s;
        } else {
            self.sent.push(s);
        }
    }
}

/// Appends text (or reasoning) to the last delta when it is of the same kind.
fn push_text(out: &mut Vec<ToolDelta>, t: &str, reasoning: bool) {
    match out.last_mut() {
        Some(ToolDelta::Text(prev)) if !reasoning => prev.push_str(t),
        Some(ToolDelta::Reasoning(prev)) if reasoning => prev.push_str(t),
        _ => out.push(if reasoning { ToolDelta::Reasoning(t.to_string()) } else { ToolDelta::Text(t.to_string()) }),
    }
}
