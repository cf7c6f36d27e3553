//! The `edit` workload: an editor asks the model to rewrite a small source file with a
//! one-line change and to answer with the whole file. Plans with `workload = "edit"` run each
//! cell twice, without and with an OpenAI Predicted Outputs `prediction` holding the original
//! file ([`prediction`]), so a server that drafts from the prediction shows its speed-up.
//! The same (cell, round, stream) gives the same request on every server; a unique first
//! line per request keeps any server from reusing a cached prefix.
use serde_json::{json, Value};

/// The file to rewrite: a small, realistic Python module (`limiter.py`).
pub const FILE: &str = r#""""Token-bucket rate limiting for outgoing API calls."""
import threading
import time
from dataclasses import dataclass, field

DEFAULT_RATE = 10.0
DEFAULT_BURST = 20
MAX_WAIT_SECONDS = 30.0


@dataclass
class Bucket:
    rate: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST
    tokens: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self):
        self.tokens = float(self.burst)
        self.updated = time.monotonic()

    def take(self, cost=1.0):
        now = time.monotonic()
        elapsed = now - self.updated
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate


class RateLimiter:
    """One bucket per key, created on first use."""

    def __init__(self, rate=DEFAULT_RATE, burst=DEFAULT_BURST):
        self.rate = rate
        self.burst = burst
        self.buckets = {}
        self.lock = threading.Lock()

    def acquire(self, key, cost=1.0):
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while True:
            with self.lock:
                if key not in self.buckets:
                    self.buckets[key] = Bucket(self.rate, self.burst)
                wait = self.buckets[key].take(cost)
            if wait == 0.0:
                return True
            if time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)
"#;

/// [`FILE`]'s length in SmolLM2's tokenizer, counted with llama-server's `/tokenize` on the
/// default model (other tokenizers count code within ~15% of it).
pub const FILE_TOKENS: usize = 421;

/// The whole request's prompt tokens (SmolLM2, chat template included), as llama-server
/// counted them: what edit cells report as their prompt size.
pub const PROMPT_TOKENS: usize = 534;

/// Enough for the whole file and its code fence.
pub const OUTPUT_TOKENS: usize = 450;

/// The one line to change, before and after (line 8 of [`FILE`]).
const OLD_LINE: &str = "MAX_WAIT_SECONDS = 30.0";
const NEW_LINE: &str = "MAX_WAIT_SECONDS = 45.0";

/// The chat messages of one edit request.
pub fn messages(cell: usize, round: usize, stream: usize) -> Value {
    json!([
        {"role": "system", "content": format!("Request {cell}-{round}-{stream}. You are a code editor: answer with the complete edited file and nothing else.")},
        {"role": "user", "content": format!(
            "Here is a Python file, limiter.py:\n\n```python\n{FILE}```\n\nRewrite this file, changing line 8 from `{OLD_LINE}` to `{NEW_LINE}`. Answer with the whole file only, in one code block."
        )}
    ])
}

/// The `prediction` field of a predicted request: the file as it was, which the answer
/// repeats but for one line.
pub fn prediction() -> Value {
    json!({"type": "content", "content": FILE})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_the_one_whose_tokens_were_counted() {
        // FILE_TOKENS was counted on exactly this text: an edit to the file must recount.
        assert_eq!((FILE.len(), FILE.lines().count()), (1527, 53), "recount FILE_TOKENS and PROMPT_TOKENS");
        const { assert!(350 <= FILE_TOKENS && FILE_TOKENS <= 450, "about 400 tokens") };
        const { assert!(OUTPUT_TOKENS > FILE_TOKENS + 8, "room for the whole file and its fence") };
    }

    #[test]
    fn the_change_is_one_line_that_exists() {
        assert_eq!(FILE.lines().nth(7), Some(OLD_LINE));
        assert_eq!(FILE.matches(OLD_LINE).count(), 1);
        assert!(!FILE.contains(NEW_LINE));
    }

    #[test]
    fn requests_carry_the_file_and_differ_only_in_their_first_line() {
        assert_eq!(messages(1, 2, 3), messages(1, 2, 3));
        let (a, b) = (messages(1, 2, 3), messages(1, 2, 4));
        assert_ne!(a[0], b[0]);
        assert_eq!(a[1], b[1]);
        assert!(a[1]["content"].as_str().unwrap().contains(FILE));
        assert_eq!(prediction()["content"], FILE);
        assert_eq!(prediction()["type"], "content");
    }
}
