//! The pipeline's messages over MLX's ring: rank 0 sends each model pass (the ops ahead of
//! it and the hidden states after its layers) to rank 1; every rank runs its layers and
//! passes on; the last sends the hidden states back to rank 0 (its right-hand neighbour in
//! the ring), which holds the final norm and head. Hidden states, not logits, cross the
//! links: `hidden_size` floats a row instead of `vocab_size`.
//!
//! A rank sleeps on its [`Doorbell`] until the rank before it is about to send (MLX's own
//! receive would keep a core busy polling), and rank 0 waits at most the pass timeout for
//! a pass to come back.
//!
//! Tensor parallel uses the same messages forwards only: each rank passes rank 0's message
//! on before it runs the pass, and the ranks' reports come back with an `all_gather`.
//!
//! A message is three arrays: the header's length (int32), the header as JSON bytes (the
//! ops, and the reports of the ranks passed so far), then the hidden states, whose shape
//! the ops imply (`[1, rows, hidden]`).
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};

use super::doorbell::Doorbell;
use super::group::Group;
use super::report::RankReport;
use crate::engine::executor::Op;

/// What crosses a link ahead of a pass's hidden states.
#[derive(Serialize, Deserialize)]
struct Header {
    ops: Vec<Op>,
    /// The figures of the ranks the pass went through so far.
    reports: Vec<RankReport>,
}

pub struct Message {
    pub ops: Vec<Op>,
    pub reports: Vec<RankReport>,
    /// After the sender's layers; None for a message without a pass (stop).
    pub hidden: Option<Array>,
}

/// One rank's ends of the ring.
pub struct Link {
    group: Rc<Group>,
    bell: Doorbell,
    /// Each rank's host (the host file's `ssh`), for messages.
    hosts: Vec<String>,
    /// Rank 0: how long a pass may take to come back round the ring.
    pass_timeout: Duration,
    /// Tensor parallel (every rank runs every pass together), else pipeline.
    tensor: bool,
    /// How long the last message took from the previous rank's doorbell waking this rank to its
    /// last byte: the link into this rank (not the sleep before: idle, or the ranks before
    /// computing).
    inbound: Duration,
}

/// Bytes a rank's report takes in tensor parallel's `all_gather` (JSON, space-padded).
const REPORT_BYTES: usize = 1024;

impl Link {
    pub fn new(group: Rc<Group>, bell: Doorbell, hosts: Vec<String>, pass_timeout: Duration, tensor: bool) -> Link {
        Link { group, bell, hosts, pass_timeout, tensor, inbound: Duration::ZERO }
    }

    /// How long the last message took on the link into this rank, from its doorbell.
    pub fn inbound(&self) -> Duration {
        self.inbound
    }

    /// Each rank's host (the host file's `ssh`).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Tensor parallel, else pipeline.
    pub fn tensor(&self) -> bool {
        self.tensor
    }

    /// Whether the next rank is rank 0.
    pub fn is_last(&self) -> bool {
        self.next() == 0
    }

    /// Tensor parallel: every rank's report on the pass just run, in rank order (every rank
    /// calls it after each pass).
    pub fn gather_reports(&self, mine: &RankReport) -> Result<Vec<RankReport>> {
        let mut bytes = serde_json::to_vec(mine)?;
        anyhow::ensure!(bytes.len() <= REPORT_BYTES, "a rank's report of {} bytes", bytes.len());
        bytes.resize(REPORT_BYTES, b' ');
        let all = self.group.all_gather(&Array::from_slice(&bytes, &[1, REPORT_BYTES as i32]))?;
        all.eval().context("gathering the ranks' figures")?;
        all.as_slice::<u8>().chunks(REPORT_BYTES).map(|r| Ok(serde_json::from_slice(r)?)).collect()
    }

    /// Calls `lost` (once, on a helper thread) with what was lost when the next rank's
    /// link closes or it sends back bad news, passing the news on to the previous rank
    /// first; nothing once this rank is [`Link::leave`]ing.
    pub fn watch(&self, lost: impl FnOnce(String) + Send + 'static) -> Result<()> {
        self.bell.watch(self.name(self.next()), lost)
    }

    /// Rank 0 gave the cluster up: tells the ranks still up (through the last rank's
    /// doorbell, passed on back round the ring), which exit.
    pub fn tell_lost(&self, why: &str) {
        self.bell.tell_prev(why);
    }

    /// Closes this rank's doorbells: the neighbours still waiting on them hear the link
    /// close (and exit).
    pub fn close(&self) {
        self.bell.close();
    }

    /// How long rank 0 gives a pass (`--pass-timeout`).
    pub fn pass_timeout(&self) -> Duration {
        self.pass_timeout
    }

    /// This rank stops on purpose (a stop came, or rank 0 sends it): neighbours leaving
    /// from now on are no news.
    pub fn leave(&self) {
        self.bell.leave();
    }

    /// Rank 0, after sending a stop: waits (at most `timeout`) until the stop has gone
    /// round the ring, so no rank sees rank 0 leave before it heard the stop.
    pub fn await_stop(&mut self, timeout: Duration) -> Result<()> {
        self.bell.wait(Some(timeout)).with_context(|| format!("waiting for the stop to reach {}", self.name(self.prev())))
    }

    /// "rank N (host)".
    fn name(&self, rank: usize) -> String {
        format!("rank {rank} ({})", self.hosts.get(rank).map_or("?", String::as_str))
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn size(&self) -> usize {
        self.group.size()
    }

    fn next(&self) -> usize {
        (self.rank() + 1) % self.size()
    }

    fn prev(&self) -> usize {
        (self.rank() + self.size() - 1) % self.size()
    }

    /// Sends `msg` to the next rank; the bytes sent.
    pub fn send(&mut self, msg: &Message) -> Result<usize> {
        self.send_parts(&Header { ops: msg.ops.clone(), reports: msg.reports.clone() }, msg.hidden.as_ref())
    }

    fn send_parts(&mut self, header: &Header, hidden: Option<&Array>) -> Result<usize> {
        let bytes = serde_json::to_vec(header)?;
        let len = Array::from_slice(&[bytes.len() as i32], &[1]);
        let body = Array::from_slice(&bytes, &[bytes.len() as i32]);
        self.bell.ring().with_context(|| format!("sending to {}", self.name(self.next())))?;
        // One at a time: MLX may run independent sends of one eval in any order.
        let mut sent = 0;
        for part in [Some(&len), Some(&body), hidden].into_iter().flatten() {
            self.group.send(part, self.next())?.eval().with_context(|| format!("sending to {}", self.name(self.next())))?;
            sent += part.nbytes();
        }
        Ok(sent)
    }

    /// A header from the previous rank, once it rang (within `timeout`, None: no limit),
    /// and when it rang.
    fn receive_header(&mut self, timeout: Option<Duration>) -> Result<(Header, Instant)> {
        let from = || format!("receiving from {}", self.name(self.prev()));
        self.bell.wait(timeout).with_context(from)?;
        let rang = Instant::now();
        let len = self.group.recv(&[1], Dtype::Int32, self.prev())?;
        len.eval().with_context(from)?;
        let n = len.as_slice::<i32>()[0];
        anyhow::ensure!(n > 0, "a message of {n} bytes from {}", self.name(self.prev()));
        let body = self.group.recv(&[n], Dtype::Uint8, self.prev())?;
        body.eval().with_context(from)?;
        let header = serde_json::from_slice(body.as_slice::<u8>()).with_context(|| format!("a message from {}", self.name(self.prev())))?;
        Ok((header, rang))
    }

    /// Hidden states of `shape` and `dtype` from the previous rank.
    fn receive_hidden(&mut self, shape: &[i32], dtype: Dtype) -> Result<Array> {
        let h = self.group.recv(shape, dtype, self.prev())?;
        h.eval().with_context(|| format!("receiving hidden states from {}", self.name(self.prev())))?;
        Ok(h)
    }

    /// The next message from the previous rank; its hidden states are `[1, rows, hidden]`
    /// of `dtype` (rows from its ops), received with it.
    pub fn receive(&mut self, hidden: i32, dtype: Dtype) -> Result<Message> {
        let (header, rang) = self.receive_header(None)?;
        let rows: i32 = header.ops.iter().map(Op::rows).sum();
        let hidden = match rows {
            0 => None,
            rows => Some(self.receive_hidden(&[1, rows, hidden], dtype)?),
        };
        self.inbound = rang.elapsed();
        Ok(Message { ops: header.ops, reports: header.reports, hidden })
    }

    /// Passes a message on after this rank's layers: to the next rank, or from the last
    /// rank back to rank 0, only the reports and the hidden states (after a stop, only the
    /// doorbell: [`Link::await_stop`]). The bytes sent.
    pub fn forward(&mut self, msg: Message) -> Result<usize> {
        if self.next() != 0 {
            return self.send(&msg);
        }
        match &msg.hidden {
            Some(h) => self.send_parts(&Header { ops: vec![], reports: msg.reports }, Some(h)),
            None if msg.ops.iter().any(|op| matches!(op, Op::Shutdown)) => self.bell.ring().map(|_| 0),
            None => Ok(0),
        }
    }

    /// Rank 0: the last rank's hidden states for the pass just sent (shaped like `like`),
    /// and every other rank's report on it.
    pub fn receive_back(&mut self, like: &Array) -> Result<(Array, Vec<RankReport>)> {
        let (header, rang) = self.receive_header(Some(self.pass_timeout))?;
        let hidden = self.receive_hidden(like.shape(), like.dtype())?;
        self.inbound = rang.elapsed();
        Ok((hidden, header.reports))
    }
}
