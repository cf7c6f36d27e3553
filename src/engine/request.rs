//! What goes into the engine and what comes back out, per request.
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::sampling::SamplingParams;

pub struct GenerationRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Dropping the receiver cancels the request within one decode step.
    pub events: mpsc::UnboundedSender<Event>,
    pub enqueued_at: Instant,
    /// Test hook: the engine panics while serving this request (see `EngineOptions::test_fail_marker`).
    pub inject_panic: bool,
}

#[derive(Debug)]
pub enum Event {
    /// One generated token and the text it released (empty while a character or a possible
    /// stop string is incomplete).
    Token { text: String },
    /// Text held back until the end (a partial stop string that never completed).
    Text(String),
    Done(Completion),
    /// The engine failed this request; the server keeps running.
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
}

#[derive(Debug, Clone)]
pub struct Completion {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (not recomputed).
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub timings: Timings,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Enqueued -> taken by the engine.
    pub queue: Duration,
    /// Prompt processing.
    pub prefill: Duration,
    /// Enqueued -> first token.
    pub time_to_first_token: Duration,
    /// First token -> last token.
    pub decode: Duration,
}

impl Timings {
    /// Enqueued -> last token.
    pub fn end_to_end(&self) -> Duration {
        self.time_to_first_token + self.decode
    }
}
