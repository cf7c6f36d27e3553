//! Draft tokens for speculative decoding without a draft model: a sequence proposes the
//! tokens it expects next from text it already has, and one forward pass verifies them all
//! (the worker's `speculate`). Two sources:
//! - **Predicted Outputs** (OpenAI's `prediction`): the text the client expects back, as an
//!   editor sends the file it is editing. A cursor follows the answer through it; where the
//!   answer leaves it (the edited line), the longest recent n-gram of the answer finds the
//!   place it rejoins, the first match at or after the cursor preferred.
//! - **Prompt lookup** (`speculative = "prompt_lookup"`): the sequence's own prompt and
//!   answer; the most recent earlier occurrence of the answer's last n-gram proposes what
//!   followed it there.
//!
//! Prompt lookup speculates only while its sequence decodes alone (then one batched step
//! serves it with the others); a prediction always does.
//!
//! A draft's length adapts: it doubles while whole drafts are accepted and falls back to
//! just past the accepted part when one is not; after drafts wholly rejected, drafting
//! rests a while (longer each time in a row), so a source the answer does not follow costs
//! little.

/// Longest and shortest n-gram that finds where the answer is in the source.
const MAX_NGRAM: usize = 4;
const MIN_NGRAM: usize = 3;
/// A draft's length bounds.
const MIN_DRAFT: usize = 2;
const FIRST_DRAFT: usize = 8;
const MAX_DRAFT: usize = 32;
/// After passes whose drafts were wholly rejected, drafting rests this many steps, doubled
/// for each such pass in a row (up to [`MAX_REST`]): a source the answer has left costs
/// a few wasted positions per pass, and a rest costs nothing.
const FIRST_REST: usize = 2;
const MAX_REST: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftSource {
    /// The tokens of the text the client predicted.
    Prediction(Vec<u32>),
    /// The sequence's own prompt and answer so far.
    PromptLookup,
}

#[derive(Debug)]
pub struct Drafter {
    source: DraftSource,
    /// Prediction: the index of the source token expected to match the next token of the
    /// answer (None until the answer has started, or after it lost its place).
    cursor: Option<usize>,
    /// Where the answer was last known to be in the prediction: rejoining prefers what
    /// follows it, also while the cursor is lost.
    anchor: usize,
    /// Tokens the next draft may hold.
    len: usize,
    /// Steps left without a draft, and the rest after the next wholly rejected one.
    resting: usize,
    next_rest: usize,
}

impl Drafter {
    pub fn new(source: DraftSource) -> Self {
        let cursor = matches!(source, DraftSource::Prediction(_)).then_some(0);
        Drafter { source, cursor, anchor: 0, len: FIRST_DRAFT, resting: 0, next_rest: FIRST_REST }
    }

    /// Whether a sequence speculates this step, beside `decoding` sequences in all: a
    /// prediction always (the client asked, and it is usually right); prompt lookup only
    /// alone, since its drafts are guesses and a batch step already serves the others.
    pub fn speculates(&self, decoding: usize) -> bool {
        matches!(self.source, DraftSource::Prediction(_)) || decoding <= 1
    }

    /// Up to `max` tokens expected to follow `context` (the prompt and the answer, whose
    /// last token is the one the next pass feeds); `answer` of them are the answer's.
    pub fn propose(&mut self, context: &[u32], answer: usize, max: usize) -> Vec<u32> {
        let max = max.min(self.len);
        if max == 0 || context.is_empty() {
            return vec![];
        }
        if self.resting > 0 {
            self.resting -= 1;
            return vec![];
        }
        match &self.source {
            DraftSource::Prediction(source) => {
                let last = context[context.len() - 1];
                let at = match self.cursor {
                    // The answer's first token, or one that followed the source.
                    Some(c) if source.get(c) == Some(&last) && answer > 0 => Some(c + 1),
                    // Nothing answered yet: from the source's start.
                    _ if answer == 0 => Some(0),
                    // Lost: find where the answer's tail appears (only the answer's own
                    // tokens, so the prompt's end does not match by chance).
                    c => rejoin(source, &context[context.len() - answer.min(context.len())..], c.unwrap_or(self.anchor)),
                };
                self.cursor = at;
                if let Some(c) = at {
                    self.anchor = c;
                }
                at.map(|c| source[c.min(source.len())..(c + max).min(source.len())].to_vec()).unwrap_or_default()
            }
            DraftSource::PromptLookup => lookup(context, max),
        }
    }

    /// After a pass: `accepted` of the `proposed` draft tokens were taken.
    pub fn accepted(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        if let Some(c) = &mut self.cursor {
            *c += accepted;
            self.anchor = *c;
        }
        self.len = if accepted == proposed { (self.len * 2).min(MAX_DRAFT) } else { (accepted + 1).max(MIN_DRAFT) };
        if accepted == 0 {
            self.resting = self.next_rest;
            self.next_rest = (self.next_rest * 2).min(MAX_REST);
        } else {
            self.next_rest = FIRST_REST;
        }
    }
}

/// Where in `source` the answer continues: just past the longest n-gram ending `tail` that
/// `source` holds, preferring the first match at or after `from`, else the last before it.
fn rejoin(source: &[u32], tail: &[u32], from: usize) -> Option<usize> {
    for n in (MIN_NGRAM..=MAX_NGRAM.min(tail.len())).rev() {
        let gram = &tail[tail.len() - n..];
        let ends: Vec<usize> = source.windows(n).enumerate().filter(|(_, w)| *w == gram).map(|(i, _)| i + n).collect();
        if let Some(&end) = ends.iter().find(|&&e| e >= from).or(ends.last()) {
            return Some(end);
        }
    }
    None
}

/// Prompt lookup: what followed the most recent earlier occurrence of `context`'s last
/// n-gram (the longest that occurs), up to `max` tokens.
fn lookup(context: &[u32], max: usize) -> Vec<u32> {
    for n in (MIN_NGRAM..=MAX_NGRAM.min(context.len().saturating_sub(1))).rev() {
        let gram = &context[context.len() - n..];
        // Earlier occurrences only (not the tail itself), the latest first.
        let found = (0..context.len() - n).rev().find(|&i| &context[i..i + n] == gram);
        if let Some(i) = found {
            let start = i + n;
            return context[start..(start + max).min(context.len())].to_vec();
        }
    }
    vec![]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_followed_from_its_start_and_rejoined_after_an_edit() {
        let source: Vec<u32> = vec![10, 11, 12, 13, 14, 15, 16, 17, 18, 19];
        let mut d = Drafter::new(DraftSource::Prediction(source));
        // Nothing answered yet: from the start.
        let mut context = vec![1, 2, 3];
        assert_eq!(d.propose(&context, 0, 2), [10, 11]);
        // The first token followed the source; the draft goes on from there.
        context.push(10);
        assert_eq!(d.propose(&context, 1, 4), [11, 12, 13, 14]);
        // Two accepted, then the answer went its own way (99 instead of 13).
        d.accepted(4, 2);
        context.extend([11, 12, 99]);
        assert_eq!(d.propose(&context, 4, 4), Vec::<u32>::new(), "99 is nowhere in the source");
        // The answer rejoins the source at 14, 15, 16: the draft continues from there.
        context.extend([14, 15, 16]);
        assert_eq!(d.propose(&context, 7, 8), [17, 18, 19], "the miss cut the draft to 3");
        d.accepted(3, 3);
        context.extend([17, 18, 19]);
        assert_eq!(d.propose(&context, 10, 8), Vec::<u32>::new(), "the source is used up");
    }

    #[test]
    fn rejoining_prefers_the_match_past_the_cursor_over_an_earlier_repeat() {
        // "5 6 7" occurs twice.
        let source: Vec<u32> = vec![5, 6, 7, 1, 2, 3, 5, 6, 7, 8];
        assert_eq!(rejoin(&source, &[9, 5, 6, 7], 0), Some(3));
        assert_eq!(rejoin(&source, &[9, 5, 6, 7], 4), Some(9), "the answer is past the first one");
        assert_eq!(rejoin(&source, &[9, 5, 6, 7], 10), Some(9), "none past the cursor: the last before it");
        assert_eq!(rejoin(&source, &[9, 6, 7], 0), None, "'6 7' alone is too short to place the answer");
    }

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_earlier_occurrence() {
        let context = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3];
        assert_eq!(lookup(&context, 3), [5, 6, 7], "the later '1 2 3' wins");
        assert_eq!(lookup(&[1, 2, 3], 3), Vec::<u32>::new());
        let mut d = Drafter::new(DraftSource::PromptLookup);
        assert_eq!(d.propose(&context, 0, 2), [5, 6]);
    }

    #[test]
    fn the_draft_length_doubles_on_full_acceptance_and_shrinks_on_a_miss() {
        let mut d = Drafter::new(DraftSource::PromptLookup);
        assert_eq!(d.len, FIRST_DRAFT);
        d.accepted(8, 8);
        assert_eq!(d.len, 16);
        d.accepted(16, 16);
        d.accepted(32, 32);
        assert_eq!(d.len, MAX_DRAFT);
        d.accepted(32, 4);
        assert_eq!(d.len, 5);
        d.accepted(5, 0);
        assert_eq!(d.len, MIN_DRAFT);
        d.accepted(0, 0);
        assert_eq!(d.len, MIN_DRAFT, "no draft, no change");
    }

    #[test]
    fn drafting_rests_after_wholly_rejected_drafts_longer_each_time_in_a_row() {
        let context = [1, 2, 3, 7, 1, 2, 3];
        let mut d = Drafter::new(DraftSource::PromptLookup);
        let drafts = |d: &mut Drafter, steps: usize| (0..steps).filter(|_| !d.propose(&context, 4, 8).is_empty()).count();
        d.accepted(2, 0);
        assert_eq!(drafts(&mut d, FIRST_REST + 1), 1, "a rest of {FIRST_REST} steps, then a draft");
        d.accepted(2, 0);
        assert_eq!(drafts(&mut d, 2 * FIRST_REST), 0, "the second miss in a row rests twice as long");
        assert_eq!(drafts(&mut d, 1), 1);
        d.accepted(2, 1);
        d.accepted(2, 0);
        assert_eq!(drafts(&mut d, FIRST_REST + 1), 1, "an accepted token resets the rest");
    }
}
