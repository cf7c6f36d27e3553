//! Synthetic prompts of a given size. The same (cell, round, stream) gives the same prompt
//! on every server, so compared servers do the same work; a unique first line per request
//! keeps any server from reusing a cached prefix.
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

/// Common English words, one BPE token each (with the leading space) in the usual
/// tokenizers, so a prompt of n words is close to n tokens anywhere.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "name",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "sea",
    "light",
    "storm",
    "ship",
    "road",
];

/// Tokens the chat template and the instruction add around the words (SmolLM2: ~24).
const OVERHEAD_TOKENS: usize = 24;

/// Chat messages of roughly `tokens` prompt tokens.
pub fn messages(tokens: usize, cell: usize, round: usize, stream: usize) -> Value {
    let seed = (cell as u64) << 40 | (round as u64) << 20 | stream as u64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n = tokens.saturating_sub(OVERHEAD_TOKENS).max(1);
    let text: Vec<&str> = (0..n).map(|_| *WORDS.choose(&mut rng).unwrap()).collect();
    json!([
        {"role": "system", "content": format!("Request {cell}-{round}-{stream}.")},
        {"role": "user", "content": format!("{}\nTell a long story about the words above.", text.join(" "))}
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_inputs_same_prompt_and_sizes_scale() {
        assert_eq!(messages(128, 1, 2, 3), messages(128, 1, 2, 3));
        assert_ne!(messages(128, 1, 2, 3)[1], messages(128, 1, 2, 4)[1]);
        let words = |v: &Value| v[1]["content"].as_str().unwrap().split_whitespace().count();
        assert_eq!(words(&messages(1024, 0, 0, 0)), 1000 + 8);
        assert_eq!(words(&messages(4, 0, 0, 0)), 1 + 8);
    }
}
