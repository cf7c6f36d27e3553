//! Turns generated token ids into text deltas: decodes incrementally (a multi-byte
//! character split across tokens is held until complete) and stops at stop strings,
//! holding back any tail that could still become one so it is never sent.
use anyhow::Result;

use super::tokenizer::TextCodec;

pub struct TextStream {
    ids: Vec<u32>,
    /// Decode window: text of ids[prefix..read] was already appended to `text`.
    prefix: usize,
    read: usize,
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    stops: Vec<String>,
    /// The stop string that ended the text, once one did.
    matched: Option<usize>,
    /// Special tokens decode to their text instead of nothing.
    keep_special: bool,
}

#[derive(Debug, PartialEq)]
pub enum Step {
    /// Text that may be sent now (possibly empty).
    Text(String),
    /// A stop string was found: the text before it, and generation ends.
    Stopped(String),
}

impl TextStream {
    pub fn new(stops: Vec<String>, keep_special: bool) -> Self {
        TextStream {
            ids: vec![],
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            matched: None,
            keep_special,
        }
    }

    pub fn push(&mut self, codec: &TextCodec, id: u32) -> Result<Step> {
        self.ids.push(id);
        let skip = !self.keep_special;
        let before = codec.decode_with(&self.ids[self.prefix..self.read], skip)?;
        let now = codec.decode_with(&self.ids[self.prefix..], skip)?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.is_char_boundary(before.len()) {
            self.text.push_str(&now[before.len()..]);
            self.prefix = self.read;
            self.read = self.ids.len();
        }
        Ok(self.release())
    }

    fn release(&mut self) -> Step {
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        // A stop may straddle what was sent and what is new: search from its longest reach back.
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = self.stops.iter().enumerate().filter_map(|(i, s)| self.text[from..].find(s.as_str()).map(|p| (from + p, i))).min();
        if let Some((at, stop)) = found {
            self.matched = Some(stop);
            let out = self.text[self.sent..at.max(self.sent)].to_string();
            self.sent = self.text.len();
            return Step::Stopped(out);
        }
        let hold = self.stops.iter().map(|s| held_tail(&self.text, s)).max().unwrap_or(0);
        let until = (self.text.len() - hold).max(self.sent);
        let out = self.text[self.sent..until].to_string();
        self.sent = until;
        Step::Text(out)
    }

    /// The stop string that ended the text (the earliest in it), if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Whatever is still held back, at the end of generation.
    pub fn flush(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`.
fn held_tail(text: &str, stop: &str) -> usize {
    (1..stop.len()).rev().find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::held_tail;

    #[test]
    fn holds_a_partial_stop_string() {
        assert_eq!(held_tail("hello wor", "world"), 3);
        assert_eq!(held_tail("hello", "world"), 0);
        assert_eq!(held_tail("abc#", "##"), 1);
        assert_eq!(held_tail("caf\u{e9}", "\u{e9}t\u{e9}"), 2);
    }
}
