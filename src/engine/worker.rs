//! The engine thread: owns the model (MLX arrays are not `Send`), takes requests from the
//! queue in arrival order and steps the running sequences. Today at most one sequence
//! runs at a time; the loop is shaped as admit -> step all running -> retire, so batched
//! decode steps slot in without changing its callers.
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use anyhow::Result;

use super::kv_cache::KvCache;
use super::model::Model;
use super::request::{Completion, Event, FinishReason, GenerationRequest, Timings};
use super::sampling::Sampler;
use super::text_stream::{Step, TextStream};
use super::tokenizer::TextCodec;
use super::Shared;


/// Prompt tokens per forward pass: bounds the attention scratch memory of long prompts.
const PREFILL_CHUNK: usize = 512;
/// Sequences stepped together (1 until batched decode lands).
const MAX_RUNNING: usize = 1;

pub enum Job {
    Generate(GenerationRequest),
    Shutdown,
}

struct Sequence {
    req: GenerationRequest,
    cache: KvCache,
    sampler: Sampler,
    text: TextStream,
    logits: Vec<f32>,
    generated: usize,
    timings: Timings,
    first_token_at: Option<Instant>,
}

enum Outcome {
    Running,
    Finished(FinishReason),
    Cancelled,
}

pub fn run(model: Model, codec: Arc<TextCodec>, jobs: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    let mut running: Vec<Sequence> = Vec::new();
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            for seq in &running {
                retire(&shared, || drop(seq.req.events.send(Event::Error("the server is shutting down".into()))));
            }
            return;
        }
        // Admit: block when idle, otherwise only take what is already queued.
        while running.len() < MAX_RUNNING {
            let job = if running.is_empty() { jobs.recv().ok() } else { jobs.try_recv().ok() };
            match job {
                Some(Job::Generate(req)) => {
                    shared.waiting.fetch_sub(1, Ordering::Relaxed);
                    shared.running.fetch_add(1, Ordering::Relaxed);
                    let events = req.events.clone();
                    match guarded(|| start(&model, req)) {
                        Ok(seq) => running.push(seq),
                        Err(msg) => {
                            retire(&shared, || drop(events.send(Event::Error(msg))));
                        }
                    }
                }
                Some(Job::Shutdown) | None if running.is_empty() => return,
                Some(Job::Shutdown) | None => break,
            }
        }
        if !running.is_empty() {
            shared.steps.fetch_add(1, Ordering::Relaxed);
        }
        running.retain_mut(|seq| match guarded(|| step(&model, &codec, &codec.stop_ids, seq)) {
            Ok(Outcome::Running) => true,
            Ok(Outcome::Finished(reason)) => retire(&shared, || finish(seq, reason)),
            Ok(Outcome::Cancelled) => retire(&shared, || ()),
            Err(msg) => retire(&shared, || drop(seq.req.events.send(Event::Error(msg)))),
        });
    }
}

/// Counts a sequence out *before* its last event goes out, so a client that has its
/// answer never sees it still counted as running.
fn retire(shared: &Shared, last_words: impl FnOnce()) -> bool {
    shared.running.fetch_sub(1, Ordering::Relaxed);
    last_words();
    false
}

/// Runs `f`, turning an error or a panic into a message for this request only.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T, String> {
    let msg = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => format!("{e:#}"),
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "engine panicked".into()),
    };
    tracing::error!("generation failed: {msg}");
    Err(msg)
}

/// Prefill: runs the prompt through the model in chunks.
fn start(model: &Model, req: GenerationRequest) -> Result<Sequence> {
    let taken = Instant::now();
    let mut cache = model.new_cache();
    let mut logits = None;
    for chunk in req.prompt_ids.chunks(PREFILL_CHUNK) {
        if req.events.is_closed() {
            break;
        }
        logits = Some(model.forward(chunk, &mut cache)?);
    }
    if req.inject_panic {
        panic!("injected engine failure (test hook)");
    }
    let logits = match logits {
        Some(l) => l.as_slice::<f32>().to_vec(),
        None => vec![],
    };
    let timings = Timings { queue: taken - req.enqueued_at, prefill: taken.elapsed(), ..Default::default() };
    Ok(Sequence {
        cache,
        sampler: Sampler::new(req.sampling),
        text: TextStream::new(req.stop.clone()),
        logits,
        generated: 0,
        timings,
        first_token_at: None,
        req,
    })
}

/// Samples one token from the last logits, emits its text, and computes the next logits.
fn step(model: &Model, codec: &TextCodec, stop_ids: &BTreeSet<u32>, seq: &mut Sequence) -> Result<Outcome> {
    if seq.req.events.is_closed() || seq.logits.is_empty() {
        return Ok(Outcome::Cancelled);
    }
    let token = seq.sampler.sample(&seq.logits);
    let now = Instant::now();
    if seq.first_token_at.is_none() {
        seq.first_token_at = Some(now);
        seq.timings.time_to_first_token = now - seq.req.enqueued_at;
    }
    if stop_ids.contains(&token) {
        return Ok(Outcome::Finished(FinishReason::Stop));
    }
    seq.generated += 1;
    let (text, stopped) = match seq.text.push(codec, token)? {
        Step::Text(t) => (t, false),
        Step::Stopped(t) => (t, true),
    };
    if seq.req.events.send(Event::Token { text }).is_err() {
        return Ok(Outcome::Cancelled);
    }
    if stopped {
        return Ok(Outcome::Finished(FinishReason::Stop));
    }
    if seq.generated >= seq.req.max_tokens {
        return Ok(Outcome::Finished(FinishReason::Length));
    }
    let logits = model.forward(&[token], &mut seq.cache)?;
    seq.logits = logits.as_slice::<f32>().to_vec();
    Ok(Outcome::Running)
}

fn finish(seq: &mut Sequence, finish_reason: FinishReason) {
    let rest = seq.text.flush();
    if !rest.is_empty() {
        let _ = seq.req.events.send(Event::Text(rest));
    }
    if let Some(first) = seq.first_token_at {
        seq.timings.decode = first.elapsed();
    }
    let _ = seq.req.events.send(Event::Done(Completion {
        finish_reason,
        prompt_tokens: seq.req.prompt_ids.len(),
        completion_tokens: seq.generated,
        timings: seq.timings.clone(),
    }));
}
