//! The executor: the model and every sequence's keys and values (their caches, the
//! decoding batch, the prefix cache), changed only through [`Op`]s. The worker schedules
//! (admission, prefill chunks, sampling, cancellation) and names sequences by id; this
//! runs what it decided.
//!
//! One process runs the ops itself. When several serve one model ([`crate::distributed`]),
//! rank 0's executor also sends each op round the ring, the state-changing ones ahead of
//! the next model pass, and every other rank's executor replays them on what it holds
//! ([`Executor::follow`]): its run of layers (pipeline, whose pass goes rank to rank) or its
//! share of every layer (tensor parallel, whose pass all ranks run at once): the same ops in the same
//! order leave every rank's state the same, its prefix cache included (every rank counts
//! an entry at the whole model's size against rank 0's budget: [`PrefixCache::with_share`]).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use mlx_rs::Array;
use serde::{Deserialize, Serialize};

use super::batch_kv::BatchKv;
use super::kv_cache::KvCache;
use super::model::Model;
use super::prefix_cache::{PrefixCache, PrefixStats};
use crate::distributed::link::{Link, Message};
use crate::distributed::report::{ClusterStats, Meter};

/// One change to the KV state or pass through the model, named by sequence ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// A new sequence; its cache starts from the longest cached prefix of `prompt`
    /// (`cached` tokens: what rank 0 found, checked by the others).
    Admit { id: u64, prompt: Vec<u32>, cached: usize },
    /// The next tokens of several sequences in one pass: `(id, tokens)` in order.
    Prefill { parts: Vec<(u64, i32)> },
    /// One decode step for these sequences, one batch row each, in this order.
    Decode { ids: Vec<u64> },
    /// `len` tokens of one sequence, every position's logits (a draft's verification).
    Verify { id: u64, len: i32 },
    /// Forgets a sequence's positions from `tokens` on (rejected draft tokens).
    Truncate { id: u64, tokens: i32 },
    /// A sequence is done: its KV goes to the prefix cache as `keep` (when it holds
    /// exactly those tokens), or away.
    Retire { id: u64, keep: Option<Vec<u32>> },
    /// After a failed decode step: the batch's other rows leave it (as the step would have
    /// moved them), then the step's rows' KV is dropped wherever it is and the batch
    /// emptied; every rank ends alike however far the step got on each.
    DropStep { ids: Vec<u64> },
    /// The engine stops: the other ranks exit.
    Shutdown,
}

impl Op {
    /// Rows of the hidden states this op's pass carries (0: no pass).
    pub(crate) fn rows(&self) -> i32 {
        match self {
            Op::Prefill { parts } => parts.iter().map(|p| p.1).sum(),
            Op::Decode { ids } => ids.len() as i32,
            Op::Verify { len, .. } => *len,
            _ => 0,
        }
    }
}

/// How long rank 0 waits for its stop to go round the ring before it exits anyway.
const STOP_ROUND: Duration = Duration::from_secs(5);
/// How long rank 0, its link failed, waits to hear which rank was lost.
const NEWS_WAIT: Duration = Duration::from_secs(2);

pub struct Executor {
    pub model: Model,
    /// Caches of sequences not in the batch (prefilling, speculating, or between steps).
    caches: HashMap<u64, KvCache>,
    batch: BatchKv,
    prefix: PrefixCache,
    /// Rank 0 of a cluster: its end of the ring.
    ring: Option<Ring>,
    /// This rank's figures, reported with every pass of a cluster.
    meter: Meter,
    /// The rows of the decode step under way ([`Executor::drop_step`]).
    step_ids: Vec<u64>,
}

/// Rank 0's end of the ring: the link to the ranks holding the rest of the model, the ops they
/// have not been sent yet, and every rank's figures (with why the ring broke, once it has:
/// the other ranks' state is lost with it, so every later pass fails at once with that, and
/// the engine ends: [`Executor::broken`]).
struct Ring {
    link: Link,
    pending: Vec<Op>,
    stats: Arc<ClusterStats>,
}

/// A decode step's logits, evaluated, `[rows, vocab]` in the batch's row order, read by
/// the step's own row order without copying the whole (the caller copies each row once,
/// into the buffer its sequence keeps).
pub struct StepLogits {
    logits: Array,
    /// The batch row of each of the step's rows.
    order: Vec<usize>,
}

impl StepLogits {
    /// Row `i`'s logits (as `decode` was given the rows).
    pub fn row(&self, i: usize) -> &[f32] {
        let all = self.logits.as_slice::<f32>();
        let vocab = all.len() / self.order.len();
        &all[self.order[i] * vocab..][..vocab]
    }
}

impl Executor {
    pub fn new(model: Model, prefix: PrefixCache, link: Option<Link>) -> Executor {
        let rank = link.as_ref().map_or(0, Link::rank);
        let meter = Meter::new(rank, model.slice.layers.len(), model.nbytes() as u64);
        let ring = link.map(|link| {
            let stats = Arc::new(ClusterStats::new(link.hosts().to_vec(), link.tensor()));
            // A rank lost while rank 0 is idle: /health and the next request hear it at once.
            let watched = stats.clone();
            let lost = move |what: String| {
                let why = format!("the cluster lost {what}; restart every rank");
                tracing::error!("{why}");
                watched.set_broken(&why);
            };
            // Without the watch a lost rank could hold rank 0 for ever: no cluster then.
            if let Err(e) = link.watch(lost) {
                stats.set_broken(&format!("the cluster cannot watch its ring ({e:#}); restart every rank"));
            }
            if link.tensor() {
                stats.watch_deadlines(link.pass_timeout());
            }
            Ring { stats, link, pending: vec![] }
        });
        Executor { model, caches: HashMap::new(), batch: BatchKv::default(), prefix, ring, meter, step_ids: vec![] }
    }

    /// Rank 0 of a cluster: every rank's figures, as the last pass reported them.
    pub fn cluster_stats(&self) -> Option<Arc<ClusterStats>> {
        self.ring.as_ref().map(|r| r.stats.clone())
    }

    /// Starts sequence `id`; returns the prompt tokens the prefix cache already holds.
    pub fn admit(&mut self, id: u64, prompt: &[u32]) -> Result<usize> {
        let cached = self.start(id, prompt, None)?;
        self.record(Op::Admit { id, prompt: prompt.to_vec(), cached });
        Ok(cached)
    }

    /// Runs each `(id, tokens)` after what its cache holds, in one pass; the logits of each
    /// part's last position (`[parts, vocab]`, float32), evaluated.
    pub fn prefill(&mut self, parts: &[(u64, &[u32])]) -> Result<Array> {
        let lens: Vec<i32> = parts.iter().map(|p| p.1.len() as i32).collect();
        let tokens: Vec<&[u32]> = parts.iter().map(|p| p.1).collect();
        let h = self.model.embed_parts(&tokens)?;
        let h = self.pass(Op::Prefill { parts: parts.iter().map(|p| p.0).zip(lens.iter().copied()).collect() }, h)?;
        self.model.head_of_parts(&h, &lens, false)
    }

    /// One decode step: `(id, token)` rows; their logits ([`StepLogits::row`] by the
    /// rows' order here). Sequences in the batch but not in `rows` leave it first.
    pub fn decode(&mut self, rows: &[(u64, u32)]) -> Result<StepLogits> {
        let ids: Vec<u64> = rows.iter().map(|r| r.0).collect();
        self.step_ids = ids.clone();
        self.arrange(&ids)?;
        // The batch's row order (sequences that stayed, then those that joined).
        let at: Vec<usize> = self.batch.ids().iter().map(|id| ids.iter().position(|i| i == id).unwrap()).collect();
        let tokens: Vec<u32> = at.iter().map(|&i| rows[i].1).collect();
        let h = self.model.embed_parts(&[&tokens])?;
        let h = self.pass(Op::Decode { ids: self.batch.ids().to_vec() }, h)?;
        let logits = self.model.head(&h.reshape(&[rows.len() as i32, self.model.config.hidden_size])?)?;
        logits.eval()?;
        // Checked here, inside the caller's guard: `row` then reads it without failing.
        logits.try_as_slice::<f32>()?;
        let mut order = vec![0; rows.len()];
        for (batch_row, &i) in at.iter().enumerate() {
            order[i] = batch_row;
        }
        Ok(StepLogits { logits, order })
    }

    /// Runs `tokens` after what sequence `id` holds; every position's logits
    /// (`[tokens, vocab]`, float32), evaluated.
    pub fn verify(&mut self, id: u64, tokens: &[u32]) -> Result<Array> {
        let h = self.model.embed_parts(&[tokens])?;
        let h = self.pass(Op::Verify { id, len: tokens.len() as i32 }, h)?;
        self.model.head_of_parts(&h, &[tokens.len() as i32], true)
    }

    /// After a decode step failed (an error or a panic): its sequences' KV goes on every
    /// rank alike (they fail with it), the batch is emptied.
    pub fn drop_step(&mut self) {
        let ids = std::mem::take(&mut self.step_ids);
        self.drop_kv(&ids);
        self.record(Op::DropStep { ids });
    }

    pub fn truncate(&mut self, id: u64, tokens: i32) -> Result<()> {
        self.cache(id)?.truncate(tokens);
        self.record(Op::Truncate { id, tokens });
        Ok(())
    }

    /// Ends sequence `id`: its KV is kept for later prompts as `keep`'s tokens when given
    /// (and it holds exactly them), else freed. Unknown ids are ignored (a sequence may
    /// fail before the executor heard of it).
    pub fn retire(&mut self, id: u64, keep: Option<Vec<u32>>) {
        self.finish(id, keep.clone());
        self.record(Op::Retire { id, keep });
    }

    /// Why the cluster can serve no more (a rank was lost), if it cannot.
    pub fn broken(&self) -> Option<String> {
        self.ring.as_ref().and_then(|r| r.stats.broken())
    }

    /// Tells the other ranks to exit (no-op on one process, or once the ring is broken).
    pub fn shutdown(&mut self) {
        let Some(ring) = self.ring.as_mut().filter(|r| r.stats.broken().is_none()) else { return };
        ring.link.leave();
        ring.pending.push(Op::Shutdown);
        let sent = ring.link.send(&Message { ops: std::mem::take(&mut ring.pending), reports: vec![], hidden: None });
        if let Err(e) = sent.and_then(|_| ring.link.await_stop(STOP_ROUND)) {
            tracing::warn!("telling the other ranks to stop: {e:#}");
        }
    }

    /// Tokens and bytes of KV held by running sequences (this process's layers).
    pub fn kv_held(&self) -> (usize, usize) {
        let tokens = self.caches.values().map(|c| c.offset() as usize).sum::<usize>() + self.batch.tokens();
        let bytes = self.caches.values().map(|c| c.nbytes()).sum::<usize>() + self.batch.nbytes();
        (tokens, bytes)
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats()
    }

    /// A rank past 0: receives ops from the rank before it and runs them on its layers
    /// until rank 0 says stop (Ok) or the link fails. Pipeline: passes each pass's hidden
    /// states on after its layers. Tensor parallel: passes rank 0's message on first, then
    /// runs the pass with the others (their all_sums meet) and gathers the figures.
    pub fn follow(&mut self, link: &mut Link) -> Result<()> {
        self.meter.report.rank = link.rank();
        let tensor = link.tensor();
        loop {
            let mut msg = link.receive(self.model.config.hidden_size, self.model.dtype)?;
            // Time on the link only: not the sleep until rank 0 had work.
            self.meter.waited(link.inbound());
            self.meter.received(link.inbound());
            let stop = msg.ops.iter().any(|op| matches!(op, Op::Shutdown));
            if stop {
                link.leave();
            }
            if tensor {
                let on = Message { ops: msg.ops.clone(), reports: vec![], hidden: msg.hidden.clone().filter(|_| !link.is_last()) };
                let sent = link.forward(on)?;
                self.meter.sent(sent);
            }
            let mut hidden = None;
            for op in &msg.ops {
                match op {
                    Op::Shutdown => {}
                    op if op.rows() > 0 => {
                        let h = msg.hidden.clone().context("a pass without hidden states")?;
                        let computing = Instant::now();
                        let h = self.layers(op, h)?;
                        h.eval()?;
                        self.meter.computed(computing.elapsed());
                        hidden = Some(h);
                    }
                    op => self.apply(op)?,
                }
            }
            if hidden.is_some() {
                let report = self.meter.after_pass(self.kv_held().1);
                match tensor {
                    true => drop(link.gather_reports(&report)?),
                    false => msg.reports.push(report),
                }
            }
            if !tensor {
                let sent = link.forward(Message { ops: msg.ops, reports: msg.reports, hidden })?;
                self.meter.sent(sent);
            }
            if stop {
                return Ok(());
            }
        }
    }

    /// Runs `op`'s pass through this process's layers and, in a cluster, the other ranks'
    /// (with the ops they have not seen yet ahead of it): the last layer's hidden states.
    fn pass(&mut self, op: Op, h: Array) -> Result<Array> {
        let Some(ring) = &self.ring else { return self.layers(&op, h) };
        if let Some(why) = self.broken() {
            anyhow::bail!("{why}");
        }
        let tensor = ring.link.tensor();
        // A panic midway leaves the other ranks mid-pass (tensor parallel: inside an
        // all_sum, where the next message would be read as its data): the cluster is lost.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match tensor {
            true => self.tensor_pass(op, h),
            false => self.pipeline_pass(op, h),
        }));
        match ran {
            Ok(result) => result,
            Err(panic) => {
                let e = anyhow!("a pass panicked: {}", super::worker::panic_message(panic.as_ref()));
                Err(self.lose(e))
            }
        }
    }

    /// Pipeline: this rank's layers, then the pass round the ring and back.
    fn pipeline_pass(&mut self, op: Op, h: Array) -> Result<Array> {
        let computing = Instant::now();
        let h = self.layers(&op, h)?;
        h.eval()?;
        self.meter.computed(computing.elapsed());
        let (_, kv) = self.kv_held();
        let ring = self.ring.as_mut().expect("a cluster's rank 0");
        ring.pending.push(op);
        let msg = Message { ops: std::mem::take(&mut ring.pending), reports: vec![], hidden: Some(h) };
        let waiting = Instant::now();
        let back = ring.link.send(&msg).and_then(|sent| Ok((sent, ring.link.receive_back(msg.hidden.as_ref().unwrap())?)));
        let (sent, (h, mut reports)) = back.map_err(|e| self.lose(e))?;
        self.meter.waited(waiting.elapsed());
        self.meter.received(self.ring.as_ref().expect("a cluster's rank 0").link.inbound());
        self.meter.sent(sent);
        reports.push(self.meter.after_pass(kv));
        self.ring.as_ref().expect("a cluster's rank 0").stats.set_latest(reports);
        Ok(h)
    }

    /// Tensor parallel: the embedded input round the ring, then the pass on every rank at
    /// once. Every rank meets at each layer's all_sums, so any failure leaves the others'
    /// state behind: it ends the cluster.
    fn tensor_pass(&mut self, op: Op, h: Array) -> Result<Array> {
        let ring = self.ring.as_mut().expect("a cluster's rank 0");
        ring.pending.push(op.clone());
        let msg = Message { ops: std::mem::take(&mut ring.pending), reports: vec![], hidden: Some(h.clone()) };
        // A rank that hangs with its sockets open would hold this pass for ever inside MLX:
        // the deadline gives the cluster up meanwhile (ClusterStats::watch_deadlines).
        let stats = ring.stats.clone();
        stats.arm(ring.link.pass_timeout());
        let sent = ring.link.send(&msg).map_err(|e| self.lose(e))?;
        self.meter.sent(sent);
        let computing = Instant::now();
        let out = self.layers(&op, h).and_then(|h| Ok(h.eval().map(|_| h)?)).map_err(|e| self.lose(e))?;
        self.meter.computed(computing.elapsed());
        let report = self.meter.after_pass(self.kv_held().1);
        let reports = self.ring.as_ref().expect("a cluster's rank 0").link.gather_reports(&report).map_err(|e| self.lose(e))?;
        stats.disarm();
        stats.set_latest(reports);
        Ok(out)
    }

    /// The ring failed with `e`: marks the cluster broken, naming the rank lost when its
    /// neighbour's news arrives (it comes a moment after the link fails here), and sends
    /// the news on to the ranks still up, which exit (those before a hung rank when this
    /// rank's doorbells close). The error for the requests.
    fn lose(&mut self, e: anyhow::Error) -> anyhow::Error {
        let ring = self.ring.as_mut().expect("a cluster's rank 0");
        let why = ring.stats.await_broken(NEWS_WAIT).unwrap_or_else(|| format!("the cluster lost a rank ({e:#}); restart every rank"));
        ring.stats.set_broken(&why);
        tracing::error!("{why}");
        ring.stats.disarm();
        ring.link.leave();
        ring.link.tell_lost(&why);
        ring.link.close();
        anyhow!(why)
    }

    /// `op`'s pass through this process's layers.
    fn layers(&mut self, op: &Op, h: Array) -> Result<Array> {
        match op {
            Op::Prefill { parts } => {
                let lens: Vec<i32> = parts.iter().map(|p| p.1).collect();
                for &(id, _) in parts {
                    self.cache(id)?;
                }
                let mut caches: Vec<KvCache> = parts.iter().map(|(id, _)| self.caches.remove(id).unwrap()).collect();
                let out = {
                    let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
                    self.model.prefill_layers(h, &lens, &mut refs)
                };
                for (&(id, _), cache) in parts.iter().zip(caches) {
                    self.caches.insert(id, cache);
                }
                out
            }
            Op::Decode { ids } => {
                // Rank 0 arranged its batch before the pass; the others do it here.
                self.arrange(ids)?;
                ensure!(self.batch.ids() == ids.as_slice(), "the batch's rows are not rank 0's");
                self.model.decode_layers(h, &mut self.batch)
            }
            Op::Verify { id, len } => {
                self.cache(*id)?;
                let mut cache = self.caches.remove(id).unwrap();
                let out = self.model.prefill_layers(h, &[*len], &mut [&mut cache]);
                self.caches.insert(*id, cache);
                out
            }
            other => Err(anyhow!("{other:?} is not a pass")),
        }
    }

    /// A state-changing op from rank 0.
    fn apply(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Admit { id, prompt, cached } => {
                self.start(*id, prompt, Some(*cached))?;
            }
            Op::Truncate { id, tokens } => self.cache(*id)?.truncate(*tokens),
            Op::Retire { id, keep } => self.finish(*id, keep.clone()),
            Op::DropStep { ids } => self.drop_kv(ids),
            other => return Err(anyhow!("{other:?} changes no state")),
        }
        Ok(())
    }

    /// A new sequence's cache, from the prefix cache when it holds part of the prompt; a
    /// follower checks it found what rank 0 did (`expect`).
    fn start(&mut self, id: u64, prompt: &[u32], expect: Option<usize>) -> Result<usize> {
        let (cache, cached) = match self.prefix.lookup(prompt) {
            Some(hit) => (KvCache::from_prefix(hit.kv, hit.tokens as i32)?, hit.tokens),
            None => (self.model.new_cache(), 0),
        };
        if let Some(want) = expect {
            ensure!(want == cached, "sequence {id}: rank 0 found {want} cached prompt tokens, this rank {cached}");
        }
        self.caches.insert(id, cache);
        Ok(cached)
    }

    fn finish(&mut self, id: u64, keep: Option<Vec<u32>>) {
        let cache = match self.batch.contains(id) {
            true => match self.batch.leave(id) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("sequence {id} leaving the batch: {e:#}");
                    None
                }
            },
            false => self.caches.remove(&id),
        };
        if let (Some(cache), Some(tokens)) = (cache, keep) {
            if cache.offset() as usize == tokens.len() {
                self.prefix.insert(tokens, cache.into_layers());
            }
        }
    }

    /// Makes the batch hold exactly `ids`: the others leave (their caches kept apart),
    /// newcomers join at the end in `ids`' order.
    fn arrange(&mut self, ids: &[u64]) -> Result<()> {
        for id in self.batch.ids().to_vec() {
            if !ids.contains(&id) {
                let cache = self.batch.leave(id)?;
                self.caches.insert(id, cache);
            }
        }
        for &id in ids {
            if !self.batch.contains(id) {
                let cache = self.caches.remove(&id).ok_or_else(|| anyhow!("no cache for sequence {id}"))?;
                self.batch.join(id, cache)?;
            }
        }
        Ok(())
    }

    fn drop_kv(&mut self, ids: &[u64]) {
        for id in self.batch.ids().to_vec() {
            if !ids.contains(&id) {
                match self.batch.leave(id) {
                    Ok(cache) => drop(self.caches.insert(id, cache)),
                    Err(e) => tracing::warn!("sequence {id} leaving a failed step's batch: {e:#}"),
                }
            }
        }
        for id in ids {
            self.caches.remove(id);
        }
        self.batch = BatchKv::default();
    }

    fn cache(&mut self, id: u64) -> Result<&mut KvCache> {
        if self.batch.contains(id) {
            let cache = self.batch.leave(id)?;
            self.caches.insert(id, cache);
        }
        self.caches.get_mut(&id).ok_or_else(|| anyhow!("no cache for sequence {id}"))
    }

    /// Rank 0: queues a state-changing op for the other ranks (sent ahead of the next pass).
    fn record(&mut self, op: Op) {
        if let Some(ring) = &mut self.ring {
            ring.pending.push(op);
        }
    }
}
