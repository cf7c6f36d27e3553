//! Per-request inference metrics, fed from the engine's event stream as the API relays it.
use std::sync::Arc;
use std::time::Instant;

use super::Metrics;
use crate::engine::{Completion, Event, FinishReason};

/// Records one request; dropped without a result (client gone) it counts as cancelled.
pub struct InferenceRecorder {
    metrics: Arc<Metrics>,
    model: String,
    endpoint: &'static str,
    stream: &'static str,
    last_token: Option<Instant>,
    finished: bool,
}

impl InferenceRecorder {
    pub fn new(metrics: Arc<Metrics>, model: &str, endpoint: &'static str, stream: bool) -> Self {
        InferenceRecorder { metrics, model: model.to_owned(), endpoint, stream: if stream { "true" } else { "false" }, last_token: None, finished: false }
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
        self.last_token = Some(now);
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
        m.request_duration_seconds.with_label_values(&model).observe((t.time_to_first_token + t.decode).as_secs_f64());
        m.live.request(t.time_to_first_token, t.time_to_first_token + t.decode);
        m.prompt_tokens_total.with_label_values(&model).inc_by(c.prompt_tokens as u64);
        m.generation_tokens_total.with_label_values(&model).inc_by(c.completion_tokens as u64);
        let result = match c.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        self.finish(result);
    }

    fn error(&mut self) {
        if !self.finished {
            self.metrics.live.error();
        }
        self.finish("error");
    }

    fn finish(&mut self, result: &str) {
        if !self.finished && self.metrics.per_request {
            self.finished = true;
            self.metrics.requests_total.with_label_values(&[&self.model, self.endpoint, self.stream, result]).inc();
        }
    }
}

impl Drop for InferenceRecorder {
    fn drop(&mut self) {
        self.finish("cancelled");
    }
}
