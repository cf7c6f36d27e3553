//! The engine thread's scheduler: owns the executor (the model and every sequence's KV;
//! MLX arrays are not `Send`) and runs continuous batching, naming sequences by id. Each
//! iteration it
//! 1. takes new requests off the channel (blocking only when there is nothing to do),
//! 2. admits waiting requests in arrival order while the batch has room, the KV budget
//!    covers them and memory pressure allows (a cached prompt prefix is copied in),
//! 3. runs one prefill chunk of the oldest newcomer (short when others are decoding, so
//!    their inter-token latency stays steady),
//! 4. runs one decode step for every sequence past its prefill, as one batched forward
//!    pass over the batch's padded KV (the executor moves a sequence's cache in when it
//!    starts decoding); finished sequences move out, and their KV goes to the prefix cache.
//!    A sequence with a draft this step (Predicted Outputs; prompt lookup while it decodes
//!    alone) runs a pass of its own instead: its next token and the draft, verified at
//!    once ([`speculate`]).
use std::collections::{BTreeSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::draft::Drafter;
use super::executor::Executor;
use super::logprobs;
use super::quiet::QuietRelease;
use super::request::{Completion, EngineError, ErrorKind, Event, FinishReason, GenerationRequest, Timings};
use super::sampling::Sampler;
use super::stats::EngineStats;
use super::text_stream::{Step, TextStream};
use super::tokenizer::TextCodec;
use super::{AdmissionGate, Shared};

/// Prompt tokens per prefill pass (shared by the newcomers in it) when nothing else runs:
/// bounds attention scratch memory (and sizes MLX's cache: `registry::budget`).
pub const PREFILL_CHUNK: usize = 512;
/// ... and while other sequences decode: each pass delays their next token.
const PREFILL_CHUNK_SHARED: usize = 256;
/// How often a blocked admission (memory pressure) looks again.
const BLOCKED_RECHECK: Duration = Duration::from_millis(200);
/// How often an idle cluster's rank 0 looks whether a rank was lost meanwhile.
const CLUSTER_RECHECK: Duration = Duration::from_secs(1);

pub enum Job {
    Generate(GenerationRequest),
    Shutdown,
}

/// Limits the worker keeps to.
pub struct Limits {
    pub max_batch: usize,
    /// Prompt + max_tokens of all running requests stay within this (one request alone is
    /// always admitted).
    pub kv_budget_tokens: usize,
    pub gate: Option<AdmissionGate>,
    /// What MLX's memory limit leaves beside the weights (0: unknown, no check): a request
    /// whose KV and prefill scratch alone exceed it is refused instead of failing mid-way.
    pub request_memory_bytes: usize,
    pub kv_bytes_per_token: usize,
    pub attention_heads: usize,
    /// Held from admission to the step's end (see [`super::DeviceLock`]).
    pub device_lock: super::DeviceLock,
    /// With no work anywhere for this long, MLX's buffer cache goes back (`mlx_cache_idle_seconds`).
    pub cache_idle: Duration,
}

impl Limits {
    /// Bytes a request needs at most: its KV (prompt + max_tokens) and the attention
    /// scores of one prefill chunk against the whole sequence.
    fn request_bytes(&self, tokens: usize) -> usize {
        let scores = PREFILL_CHUNK.min(tokens) * tokens * self.attention_heads * std::mem::size_of::<f32>();
        tokens * self.kv_bytes_per_token + scores
    }
}

struct Sequence {
    /// Names the sequence to the executor, which holds its keys and values.
    id: u64,
    req: GenerationRequest,
    /// The tokens whose keys and values the executor holds, in order.
    tokens: Vec<u32>,
    /// Prompt tokens taken from the prefix cache at admission.
    cached: usize,
    sampler: Sampler,
    text: TextStream,
    /// Logits for the next token; empty until the prompt is through.
    logits: Vec<f32>,
    generated: usize,
    timings: Timings,
    admitted_at: Instant,
    first_token_at: Option<Instant>,
    /// Speculative decoding's drafts.
    drafter: Option<Drafter>,
    /// This step's draft: when there is one, the sequence runs a pass of its own instead of
    /// a row in the batch.
    draft: Vec<u32>,
    /// A token already sent whose keys and values the next pass computes (speculation).
    pending: Option<u32>,
    /// The token `emit` drew last.
    sampled: Option<u32>,
    accepted_drafts: usize,
    rejected_drafts: usize,
    /// KV tokens promised to this request.
    reserved: usize,
    #[cfg(feature = "test-hooks")]
    fault: Option<super::faults::Fault>,
    /// The answer's tokens a test scripted ([`super::faults::SCRIPT`]).
    #[cfg(feature = "test-hooks")]
    script: Option<Vec<u32>>,
}

impl Sequence {
    fn prefilled(&self) -> bool {
        self.tokens.len() >= self.req.prompt_ids.len()
    }
}

enum Outcome {
    Continue(u32),
    Finished(FinishReason),
    Cancelled,
}

/// Runs until shut down or its queue closes (None), or until the executor cannot go on (a
/// cluster lost a rank): then every request fails and the reason is returned.
pub fn run(mut exec: Executor, codec: Arc<TextCodec>, jobs: mpsc::Receiver<Job>, shared: Arc<Shared>, limits: Limits) -> Option<String> {
    let mut pending: VecDeque<GenerationRequest> = VecDeque::new();
    let mut running: Vec<Sequence> = Vec::new();
    let mut next_id = 0u64;
    let mut quiet = QuietRelease::new(limits.cache_idle);
    shared.stats.set_limits(limits.max_batch, limits.kv_budget_tokens);
    shared.stats.set_prefix(&exec.prefix_stats());
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            for seq in running.drain(..) {
                retire(&shared, || drop(seq.req.events.send(Event::Error(EngineError::shutting_down()))));
            }
            exec.shutdown();
            turn_away(&shared, &mut pending, &jobs, EngineError::shutting_down());
            return None;
        }

        // 1. New requests. Block only when idle (waking once, at the end of a quiet spell,
        // to give MLX's buffer cache back).
        if running.is_empty() && pending.is_empty() {
            let clustered = exec.cluster_stats().is_some();
            let job = loop {
                // A cluster's rank 0 also wakes to notice a rank lost while idle.
                let wait = match (quiet.wait(), clustered) {
                    (None, false) => break jobs.recv(),
                    (wait, _) => wait.unwrap_or(CLUSTER_RECHECK).min(if clustered { CLUSTER_RECHECK } else { Duration::MAX }),
                };
                match jobs.recv_timeout(wait) {
                    Ok(job) => break Ok(job),
                    Err(mpsc::RecvTimeoutError::Timeout) if exec.broken().is_some() => {
                        turn_away(&shared, &mut pending, &jobs, EngineError::from_message(exec.broken().unwrap_or_default()));
                        return exec.broken();
                    }
                    // The quiet spell's own end (not a cluster's recheck): give the cache back.
                    Err(mpsc::RecvTimeoutError::Timeout) if quiet.wait().is_some_and(|w| w.is_zero()) => {
                        quiet.maybe_release(&limits.device_lock)
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break Err(mpsc::RecvError),
                }
            };
            match job {
                Ok(Job::Generate(req)) => pending.push_back(req),
                // Shutdown sets the stopping flag first (handled at the top); a closed
                // channel with nothing left to do ends the thread.
                Ok(Job::Shutdown) | Err(_) if shared.stopping.load(Ordering::Relaxed) => continue,
                Ok(Job::Shutdown) | Err(_) => {
                    exec.shutdown();
                    return None;
                }
            }
        }
        while let Ok(job) = jobs.try_recv() {
            if let Job::Generate(req) = job {
                pending.push_back(req);
            }
        }
        quiet.busy();
        // Clients that left while waiting.
        pending.retain(|req| {
            let gone = req.events.is_closed();
            if gone {
                shared.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            !gone
        });

        // 2. Admission, in arrival order. From here to the step's end this engine has the
        // device (other loaded models wait for it).
        let device = limits.device_lock.lock();
        let blocked = limits.gate.as_ref().is_some_and(|g| g());
        shared.stats.set_admission_blocked(blocked && !pending.is_empty());
        while !blocked && running.len() < limits.max_batch {
            let Some(front) = pending.front() else { break };
            let need = front.prompt_ids.len() + front.max_tokens;
            // The decoding batch pads every sequence's KV to the longest one's.
            let widest = running.iter().map(|s| s.reserved).max().unwrap_or(0).max(need);
            if !running.is_empty() && (running.len() + 1) * widest > limits.kv_budget_tokens {
                break; // waits until running requests free their share
            }
            let req = pending.pop_front().unwrap();
            shared.waiting.fetch_sub(1, Ordering::Relaxed);
            shared.running.fetch_add(1, Ordering::Relaxed);
            let events = req.events.clone();
            let bytes = limits.request_bytes(need);
            if limits.request_memory_bytes > 0 && bytes > limits.request_memory_bytes {
                let message = format!(
                    "this request needs ~{} MB for its KV cache and prefill ({need} tokens), more than the {} MB MLX's memory limit leaves beside the model; shorten the prompt or max_tokens",
                    bytes.div_ceil(1 << 20),
                    limits.request_memory_bytes >> 20
                );
                fail(&shared, &events, EngineError { kind: ErrorKind::OutOfMemory, message });
                continue;
            }
            next_id += 1;
            match guarded(|| admit(&mut exec, &codec, req, need, next_id)) {
                Ok(seq) => running.push(seq),
                Err(e) => fail(&shared, &events, e),
            }
        }
        if running.is_empty() {
            drop(device);
            if !pending.is_empty() {
                // Held back by memory pressure: wait for it to ease (or for news).
                if let Ok(Job::Generate(req)) = jobs.recv_timeout(BLOCKED_RECHECK) {
                    pending.push_back(req);
                }
            }
            publish(&shared, &running, &exec);
            shared.stats.mark_progress();
            continue;
        }
        shared.steps.fetch_add(1, Ordering::Relaxed);

        // Clients that left during their prefill stop it here, before the next chunk;
        // their KV goes with them.
        let mut i = 0;
        while i < running.len() {
            if !running[i].prefilled() && running[i].req.events.is_closed() {
                exec.retire(running.remove(i).id, None);
                retire(&shared, || ());
            } else {
                i += 1;
            }
        }
        if running.is_empty() {
            publish(&shared, &running, &exec);
            shared.stats.mark_progress();
            continue;
        }

        // 3. One prefill pass for the newcomers, oldest first, within the chunk budget:
        //    newcomers that arrive together are prefilled together.
        let decoding = running.iter().filter(|s| s.prefilled()).count();
        let mut budget = if decoding > 0 { PREFILL_CHUNK_SHARED } else { PREFILL_CHUNK };
        let mut chunks: Vec<(usize, usize)> = vec![];
        for (i, seq) in running.iter().enumerate().filter(|(_, s)| !s.prefilled()) {
            if budget == 0 {
                break;
            }
            let take = (seq.req.prompt_ids.len() - seq.tokens.len()).min(budget);
            chunks.push((i, take));
            budget -= take;
        }
        if !chunks.is_empty() {
            if let Err(e) = guarded(|| prefill(&mut exec, &mut running, &chunks)) {
                for &(i, _) in chunks.iter().rev() {
                    let seq = running.remove(i);
                    exec.retire(seq.id, None);
                    fail(&shared, &seq.req.events, e.clone());
                }
            }
        }

        // 4. One decode step for everyone past prefill.
        let mut next: Vec<(usize, u32)> = Vec::new();
        let mut done: Vec<(usize, Result<Outcome, EngineError>)> = Vec::new();
        let decoding = running.iter().filter(|s| s.prefilled() && !s.logits.is_empty()).count();
        for (i, seq) in running.iter_mut().enumerate() {
            if !seq.prefilled() || seq.logits.is_empty() {
                continue;
            }
            // The next token: sent already by a speculating pass, or sampled now.
            let token = match seq.pending.take() {
                Some(token) => token,
                None => match guarded(|| emit(&codec, &codec.stop_ids, &shared.stats, seq)) {
                    Ok(Outcome::Continue(token)) => token,
                    other => {
                        done.push((i, other));
                        continue;
                    }
                },
            };
            // With a draft it takes a pass of its own; without one, a row in the batch.
            seq.draft = propose(seq, token, decoding);
            if seq.draft.is_empty() {
                next.push((i, token));
            } else {
                seq.pending = Some(token);
            }
        }
        #[cfg(feature = "test-hooks")]
        for seq in running.iter_mut() {
            match seq.fault {
                Some(super::faults::Fault::KillEngine) => panic!("injected engine thread death (test hook)"),
                Some(super::faults::Fault::Stall) => {
                    seq.fault = None;
                    super::faults::stall();
                }
                _ => {}
            }
        }
        // One batched step for the rows; sequences that stopped decoding leave the batch
        // (their KV kept apart, for the prefix cache or a pass of their own).
        if !next.is_empty() {
            let rows: Vec<(u64, u32)> = next.iter().map(|&(i, t)| (running[i].id, t)).collect();
            let result = guarded(|| {
                let logits = exec.decode(&rows)?;
                shared.stats.record_decode_step(rows.len());
                Ok(logits)
            });
            match result {
                Ok(step) => {
                    for (row, &(i, token)) in next.iter().enumerate() {
                        // The sequence's buffer is reused: a fresh vocabulary-sized vector
                        // each token came from fresh pages.
                        let logits = &mut running[i].logits;
                        logits.clear();
                        logits.extend_from_slice(step.row(row));
                        running[i].tokens.push(token);
                    }
                }
                // The step's KV goes (on every rank): those sequences end with the error
                // and leave nothing to the prefix cache.
                Err(e) => {
                    exec.drop_step();
                    done.extend(next.iter().map(|&(i, _)| (i, Err(e.clone()))));
                }
            }
        }
        // Sequences with drafts: a pass each.
        for (i, seq) in running.iter_mut().enumerate() {
            if seq.draft.is_empty() {
                continue;
            }
            match guarded(|| speculate(&mut exec, &codec, &shared.stats, seq)) {
                Ok(None) => {}
                Ok(Some(outcome)) => done.push((i, Ok(outcome))),
                Err(e) => done.push((i, Err(e))),
            }
        }
        // Remove from the back so the indices stay valid.
        done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, outcome) in done {
            let mut seq = running.remove(i);
            match outcome {
                // The KV goes to the prefix cache (and the stats out) before the answer
                // does, so a client's next turn, sent the moment it has this one, finds it.
                Ok(Outcome::Finished(reason)) => {
                    shared.stats.record_service(seq.admitted_at.elapsed().as_secs_f64());
                    exec.retire(seq.id, Some(std::mem::take(&mut seq.tokens)));
                    publish(&shared, &running, &exec);
                    retire(&shared, || finish(&mut seq, reason));
                }
                Ok(Outcome::Cancelled) => {
                    exec.retire(seq.id, Some(std::mem::take(&mut seq.tokens)));
                    retire(&shared, || ());
                }
                Ok(Outcome::Continue(_)) => unreachable!("continuing sequences are not done"),
                Err(e) => {
                    exec.retire(seq.id, None);
                    fail(&shared, &seq.req.events, e)
                }
            }
        }
        publish(&shared, &running, &exec);
        shared.stats.mark_progress();
        if let Some(why) = exec.broken() {
            let e = EngineError::from_message(why.clone());
            for seq in running.drain(..) {
                fail(&shared, &seq.req.events, e.clone());
            }
            turn_away(&shared, &mut pending, &jobs, e);
            return Some(why);
        }
    }
}

/// Ends every request not yet admitted with `e`.
fn turn_away(shared: &Shared, pending: &mut VecDeque<GenerationRequest>, jobs: &mpsc::Receiver<Job>, e: EngineError) {
    for req in pending.drain(..).chain(jobs.try_iter().filter_map(|j| match j {
        Job::Generate(req) => Some(req),
        Job::Shutdown => None,
    })) {
        shared.waiting.fetch_sub(1, Ordering::Relaxed);
        let _ = req.events.send(Event::Error(e.clone()));
    }
}

fn publish(shared: &Shared, running: &[Sequence], exec: &Executor) {
    let (tokens, bytes) = exec.kv_held();
    let reserved = running.iter().map(|s| s.reserved).sum();
    shared.stats.set_kv(tokens, bytes, reserved);
    shared.stats.set_prefix(&exec.prefix_stats());
}

/// Counts a sequence out *before* its last event goes out, so a client that has its
/// answer never sees it still counted as running.
fn retire(shared: &Shared, last_words: impl FnOnce()) {
    shared.running.fetch_sub(1, Ordering::Relaxed);
    last_words();
}

/// Ends a request with the engine's error, counted for the `engine_error` alert.
fn fail(shared: &Shared, events: &tokio::sync::mpsc::UnboundedSender<Event>, e: EngineError) {
    shared.stats.count_failure();
    retire(shared, || drop(events.send(Event::Error(e))));
}

/// Runs `f`, turning an error or a panic into an error for the requests involved (an MLX
/// allocation failure is told apart, so the client hears it was memory).
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T, EngineError> {
    let msg = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(e)) => format!("{e:#}"),
        Err(panic) => panic_message(panic.as_ref()),
    };
    tracing::error!("generation failed: {msg}");
    Err(EngineError::from_message(msg))
}

/// The text a panic carried.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "engine panicked".into())
}

/// A new sequence, starting from the longest cached prefix of its prompt.
fn admit(exec: &mut Executor, codec: &TextCodec, mut req: GenerationRequest, reserved: usize, id: u64) -> Result<Sequence> {
    #[cfg(feature = "test-hooks")]
    let fault = super::faults::for_prompt(&codec.decode(&req.prompt_ids)?);
    #[cfg(feature = "test-hooks")]
    let script = match super::faults::script_for_prompt(&codec.decode_with(&req.prompt_ids, false)?) {
        Some(text) => Some(codec.tokenizer.encode_fast(text, false).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?.get_ids().to_vec()),
        None => None,
    };
    #[cfg(not(feature = "test-hooks"))]
    let _ = codec;
    let admitted_at = Instant::now();
    let cached = exec.admit(id, &req.prompt_ids)?;
    let mut tokens = Vec::with_capacity(req.prompt_ids.len() + req.max_tokens);
    tokens.extend_from_slice(&req.prompt_ids[..cached]);
    Ok(Sequence {
        id,
        cached,
        tokens,
        sampler: Sampler::new(req.sampling.clone()),
        text: TextStream::new(req.stop.clone(), req.special_tokens_as_text),
        logits: vec![],
        generated: 0,
        timings: Timings { queue: admitted_at - req.enqueued_at, ..Default::default() },
        admitted_at,
        first_token_at: None,
        drafter: req.draft.take().map(Drafter::new),
        draft: vec![],
        pending: None,
        sampled: None,
        accepted_drafts: 0,
        rejected_drafts: 0,
        reserved,
        req,
        #[cfg(feature = "test-hooks")]
        fault,
        #[cfg(feature = "test-hooks")]
        script,
    })
}

/// Runs the next `take` prompt tokens of each `(index, take)` sequence in one pass; a
/// sequence whose prompt is through gets its first logits.
fn prefill(exec: &mut Executor, running: &mut [Sequence], chunks: &[(usize, usize)]) -> Result<()> {
    let tokens: Vec<Vec<u32>> = chunks
        .iter()
        .map(|&(i, take)| {
            let done = running[i].tokens.len();
            running[i].req.prompt_ids[done..done + take].to_vec()
        })
        .collect();
    let parts: Vec<(u64, &[u32])> = chunks.iter().zip(&tokens).map(|(&(i, _), t)| (running[i].id, t.as_slice())).collect();
    let logits = exec.prefill(&parts)?;
    let vocab = logits.shape()[1] as usize;
    let all = logits.as_slice::<f32>();
    for (row, (&(i, _), part)) in chunks.iter().zip(&tokens).enumerate() {
        let seq = &mut running[i];
        seq.tokens.extend_from_slice(part);
        if seq.prefilled() {
            seq.logits = all[row * vocab..(row + 1) * vocab].to_vec();
            seq.timings.prefill = seq.admitted_at.elapsed();
        }
    }
    Ok(())
}

/// The draft to verify after `token` (the sequence's next token), if it speculates this
/// step beside `decoding` sequences in all: within the tokens the answer may still have
/// (each pass sends at most its draft and one more token).
fn propose(seq: &mut Sequence, token: u32, decoding: usize) -> Vec<u32> {
    let Some(drafter) = seq.drafter.as_mut().filter(|d| d.speculates(decoding)) else { return vec![] };
    let room = seq.req.max_tokens.saturating_sub(seq.generated).saturating_sub(1);
    seq.tokens.push(token);
    let draft = drafter.propose(&seq.tokens, seq.generated, room);
    seq.tokens.pop();
    draft
}

/// One pass of a sequence with a draft: its next token (sent already) and the draft go
/// through the model together; each draft token the sampler draws from the logits before
/// it is sent at once, and the first it does not draw ends the pass (the token drawn
/// instead waits for the next step). The cache then forgets the rejected tokens.
/// Drawing as without a draft and keeping a draft token only when it is the one drawn is
/// speculative sampling's rule for a draft that is certain: the answer's distribution is
/// the sampler's, and a seeded answer is the same with drafts or without.
/// Some(outcome) when the sequence ended.
fn speculate(exec: &mut Executor, codec: &TextCodec, stats: &EngineStats, seq: &mut Sequence) -> Result<Option<Outcome>> {
    let token = seq.pending.take().expect("a speculating sequence has its next token");
    let draft = std::mem::take(&mut seq.draft);
    seq.tokens.push(token);
    let mut feed = Vec::with_capacity(draft.len() + 1);
    feed.push(token);
    feed.extend_from_slice(&draft);
    let logits = exec.verify(seq.id, &feed)?;
    let all = logits.as_slice::<f32>();
    let vocab = all.len() / feed.len();
    let mut accepted = 0;
    let ended = loop {
        seq.logits = all[accepted * vocab..(accepted + 1) * vocab].to_vec();
        let proposed = draft.get(accepted).copied();
        match emit(codec, &codec.stop_ids, stats, seq)? {
            Outcome::Continue(t) if Some(t) == proposed => {
                seq.tokens.push(t);
                accepted += 1;
            }
            Outcome::Continue(t) => {
                seq.pending = Some(t);
                break None;
            }
            ended => {
                // A draft token that ended the answer (its last, a stop) was taken too.
                if matches!(ended, Outcome::Finished(_)) && proposed.is_some() && seq.sampled == proposed {
                    accepted += 1;
                }
                break Some(ended);
            }
        }
    };
    exec.truncate(seq.id, seq.tokens.len() as i32)?;
    if let Some(d) = &mut seq.drafter {
        d.accepted(draft.len(), accepted);
    }
    seq.accepted_drafts += accepted;
    seq.rejected_drafts += draft.len() - accepted;
    stats.record_draft(draft.len(), accepted);
    Ok(ended)
}

/// Samples the next token from the last logits (within the grammar, if the request has
/// one) and sends its text; says whether the sequence goes on (and with which token).
fn emit(codec: &TextCodec, stop_ids: &BTreeSet<u32>, stats: &EngineStats, seq: &mut Sequence) -> Result<Outcome> {
    #[cfg(feature = "test-hooks")]
    if seq.fault == Some(super::faults::Fault::PanicInRequest) {
        panic!("injected engine failure (test hook)");
    }
    if seq.req.events.is_closed() {
        return Ok(Outcome::Cancelled);
    }
    seq.sampler.adjust(&mut seq.logits);
    if let Some(grammar) = &mut seq.req.constraint {
        let started = Instant::now();
        grammar.mask(&mut seq.logits)?;
        stats.record_mask(started.elapsed().as_secs_f64());
    }
    let token = seq.sampler.sample(&seq.logits);
    #[cfg(feature = "test-hooks")]
    let token = seq.script.as_ref().and_then(|ids| ids.get(seq.generated).copied()).unwrap_or(token);
    seq.sampled = Some(token);
    let logprobs = seq.req.logprobs.map(|top| logprobs::compute(&seq.logits, seq.req.sampling.temperature, token, top));
    let now = Instant::now();
    if seq.first_token_at.is_none() {
        seq.first_token_at = Some(now);
        seq.timings.time_to_first_token = now - seq.req.enqueued_at;
    }
    let finished_grammar = match &mut seq.req.constraint {
        Some(grammar) => {
            grammar.commit(token)?;
            grammar.is_finished()
        }
        None => false,
    };
    if stop_ids.contains(&token) {
        return Ok(Outcome::Finished(FinishReason::Stop));
    }
    seq.generated += 1;
    let (text, stopped) = match seq.text.push(codec, token)? {
        Step::Text(t) => (t, false),
        Step::Stopped(t) => (t, true),
    };
    if seq.req.events.send(Event::Token { text, logprobs }).is_err() {
        return Ok(Outcome::Cancelled);
    }
    if stopped || finished_grammar {
        return Ok(Outcome::Finished(FinishReason::Stop));
    }
    if seq.generated >= seq.req.max_tokens {
        return Ok(Outcome::Finished(FinishReason::Length));
    }
    Ok(Outcome::Continue(token))
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
        cached_prompt_tokens: seq.cached,
        completion_tokens: seq.generated,
        accepted_draft_tokens: seq.accepted_drafts,
        rejected_draft_tokens: seq.rejected_drafts,
        stop_sequence: seq.text.matched_stop().map(str::to_string),
        timings: seq.timings.clone(),
    }));
}
