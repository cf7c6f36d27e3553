//! What goes into the engine and what comes back out, per request.
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::constraint::ConstraintState;
use super::logprobs::TokenLogprobs;
use super::sampling::SamplingParams;

pub struct GenerationRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// The grammar the output must follow: applied as a token mask before each sampling.
    pub constraint: Option<Box<ConstraintState>>,
    /// Log-probabilities to report with each token: `Some(n)` gives the chosen token's and
    /// the `n` most likely alternatives'.
    pub logprobs: Option<usize>,
    /// Decode special tokens into the text (stop tokens aside): tool-call markers are
    /// special tokens in some families.
    pub special_tokens_as_text: bool,
    /// Where speculative decoding takes its drafts from (None: one token a pass).
    pub draft: Option<super::draft::DraftSource>,
    /// Dropping the receiver cancels the request within one decode step.
    pub events: mpsc::UnboundedSender<Event>,
    pub enqueued_at: Instant,
}

#[derive(Debug)]
pub enum Event {
    /// One generated token and the text it released (empty while a character or a possible
    /// stop string is incomplete).
    Token {
        text: String,
        /// When the request asked for logprobs.
        logprobs: Option<TokenLogprobs>,
    },
    /// Text held back until the end (a partial stop string that never completed).
    Text(String),
    Done(Completion),
    /// The engine failed this request; the server keeps running.
    Error(EngineError),
}

/// Why the engine ended a request early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bug or an MLX error: 500.
    Internal,
    /// The request's KV and activations do not fit in MLX's memory limit: 507.
    OutOfMemory,
    /// The server is stopping (or the engine is being reloaded): 503.
    ShuttingDown,
    /// The engine's thread is stuck in a step and was left behind (restart required): 503.
    Stuck,
    /// The request's grammar (a JSON Schema, tools) reached llguidance's limits while
    /// generating, as a schema with thousands of optional properties side by side does: 400.
    Grammar,
}

#[derive(Debug, Clone)]
pub struct EngineError {
    pub kind: ErrorKind,
    pub message: String,
}

impl EngineError {
    pub fn internal(message: impl Into<String>) -> Self {
        EngineError { kind: ErrorKind::Internal, message: message.into() }
    }

    pub fn shutting_down() -> Self {
        EngineError { kind: ErrorKind::ShuttingDown, message: "the server is shutting down".into() }
    }

    pub fn stuck(reason: String) -> Self {
        EngineError { kind: ErrorKind::Stuck, message: reason }
    }

    /// Tells an MLX allocation failure from other errors by its message.
    pub fn from_message(message: String) -> Self {
        if message.starts_with(crate::engine::constraint::RUNTIME_ERROR) {
            return EngineError { kind: ErrorKind::Grammar, message };
        }
        let m = message.to_ascii_lowercase();
        let oom = ["unable to allocate", "out of memory", "bad_alloc", "memory limit"].iter().any(|k| m.contains(k));
        EngineError { kind: if oom { ErrorKind::OutOfMemory } else { ErrorKind::Internal }, message }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A request's events as its client reads them. The channel alone would never close when the
/// engine's thread is stuck (that thread keeps the sender), so the request also ends, with a
/// [`ErrorKind::Stuck`] error, once its engine is left behind.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    stuck: tokio::sync::watch::Receiver<Option<String>>,
}

impl Events {
    pub fn new(rx: mpsc::UnboundedReceiver<Event>, stuck: tokio::sync::watch::Receiver<Option<String>>) -> Self {
        Events { rx, stuck }
    }

    /// The next event; None once the engine dropped the request.
    pub async fn recv(&mut self) -> Option<Event> {
        tokio::select! {
            biased;
            ev = self.rx.recv() => ev,
            // Err (the engine is gone without being stuck) disables this branch.
            Ok(reason) = self.stuck.wait_for(Option::is_some) => Some(Event::Error(EngineError::stuck(reason.clone().unwrap_or_default()))),
        }
    }
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
    /// Speculative decoding: draft tokens taken into the answer, and those verified but
    /// not taken (OpenAI's `accepted_prediction_tokens` / `rejected_prediction_tokens`).
    pub accepted_draft_tokens: usize,
    pub rejected_draft_tokens: usize,
    /// The stop string that ended the answer (Anthropic's `stop_sequence`), if one did.
    pub stop_sequence: Option<String>,
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
