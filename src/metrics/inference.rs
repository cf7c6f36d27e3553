//! Per-request inference metrics, fed from the engine's event stream as the API relays it.
use std::sync::Arc;
use std::time::Instant;

use super::live::FinishedRequest;
use super::Metrics;
use crate::engine::{Completion, Event, FinishReason};

/// Records one request; dropped without a result (client gone) it counts as cancelled.
pub struct InferenceRecorder {
    metrics: Arc<Metrics>,
    model: String,
    endpoint: &'static str,
    stream: bool,
    started: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    tokens: u64,
    finished: bool,
}

impl InferenceRecorder {
    pub fn new(metrics: Arc<Metrics>, model: &str, endpoint: &'static str, stream: bool) -> Self {
        InferenceRecorder {
            metrics,
            model: model.to_owned(),
            endpoint,
            stream,
            started: Instant::now(),
            first_token: None,
            last_token: None,
            tokens: 0,
            finished: false,
        }
    }

    /// Takes note of the next engine event (None: the engine dropped the request).
    pub fn observe(&mut self, ev: Option<&Event>) {
        match ev {
            Some(Event::Token { .. }) => self.token(),
            Some(Event::Done(done)) => self.done(done),
            Some(Event::Error(_)) | None => self.error(),
            Some(Event::Text(_)) => {}
        }
    }

    /// `max_tokens` cut a tool call short (the answer keeps the complete ones).
    pub fn tool_call_cut(&self) {
        if self.metrics.per_request {
            self.metrics.tool_calls_cut_total.with_label_values(&[&self.model]).inc();
        }
    }

    fn token(&mut self) {
        if !self.metrics.per_request {
            return;
        }
        let now = Instant::now();
        let gap = self.last_token.map(|prev| now - prev);
        if let Some(gap) = gap {
            self.metrics.inter_token_latency_seconds.with_label_values(&[&self.model]).observe(gap.as_secs_f64());
        }
        self.metrics.live.token(gap);
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.tokens += 1;
    }

    fn done(&mut self, c: &Completion) {
        if !self.metrics.per_request {
            self.finished = true;
            return;
        }
        let m = &self.metrics;
        let model = [self.model.as_str()];
        let t = &c.timings;
        m.queue_wait_seconds.with_label_values(&model).observe(t.queue.as_secs_f64());
        m.prefill_duration_seconds.with_label_values(&model).observe(t.prefill.as_secs_f64());
        m.time_to_first_token_seconds.with_label_values(&model).observe(t.time_to_first_token.as_secs_f64());
        m.request_duration_seconds.with_label_values(&model).observe(t.end_to_end().as_secs_f64());
        m.prompt_tokens_total.with_label_values(&model).inc_by(c.prompt_tokens as u64);
        m.generation_tokens_total.with_label_values(&model).inc_by(c.completion_tokens as u64);
        let result = match c.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        let record = FinishedRequest { result, ..self.record() }.with_completion(c);
        m.live.finished(record);
        self.finish(result);
    }

    /// What the API side saw of the request; the engine's [`Completion`] adds the rest.
    fn record(&self) -> FinishedRequest {
        FinishedRequest {
            finished_at: super::live::unix_seconds(),
            endpoint: self.endpoint,
            stream: self.stream,
            result: "cancelled",
            prompt_tokens: None,
            cached_prompt_tokens: None,
            completion_tokens: self.tokens,
            queue_seconds: None,
            ttft_seconds: self.first_token.map(|t| (t - self.started).as_secs_f64()),
            prefill_tokens_per_second: None,
            decode_tokens_per_second: None,
            e2e_seconds: self.started.elapsed().as_secs_f64(),
        }
    }

    fn error(&mut self) {
        if !self.finished {
            self.metrics.live.error();
        }
        self.finish("error");
    }

    fn finish(&mut self, result: &'static str) {
        if !self.finished && self.metrics.per_request {
            self.finished = true;
            if result == "cancelled" || result == "error" {
                self.metrics.live.finished(FinishedRequest { result, ..self.record() });
            }
            let stream = if self.stream { "true" } else { "false" };
            self.metrics.requests_total.with_label_values(&[&self.model, self.endpoint, stream, result]).inc();
        }
    }
}

impl FinishedRequest {
    /// The engine's own figures: token counts and timings from enqueue to last token.
    fn with_completion(self, c: &Completion) -> FinishedRequest {
        let t = &c.timings;
        let rate = |tokens: usize, time: std::time::Duration| (tokens > 0 && !time.is_zero()).then(|| tokens as f64 / time.as_secs_f64());
        FinishedRequest {
            prompt_tokens: Some(c.prompt_tokens as u64),
            cached_prompt_tokens: Some(c.cached_prompt_tokens as u64),
            completion_tokens: c.completion_tokens as u64,
            queue_seconds: Some(t.queue.as_secs_f64()),
            ttft_seconds: Some(t.time_to_first_token.as_secs_f64()),
            prefill_tokens_per_second: rate(c.prompt_tokens.saturating_sub(c.cached_prompt_tokens), t.prefill),
            // Tokens after the first, over the time after the first.
            decode_tokens_per_second: rate(c.completion_tokens.saturating_sub(1), t.decode),
            e2e_seconds: t.end_to_end().as_secs_f64(),
            ..self
        }
    }
}

impl Drop for InferenceRecorder {
    fn drop(&mut self) {
        self.finish("cancelled");
    }
}
