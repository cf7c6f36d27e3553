//! The pipeline's messages over MLX's ring: rank 0 sends each model pass (the ops ahead of
//! it and the hidden states after its layers) to rank 1; every rank runs its layers and
//! passes on; the last sends the hidden states back to rank 0 (its right-hand neighbour in
//! the ring), which holds the final norm and head. Hidden states, not logits, cross the
//! links: `hidden_size` floats a row instead of `vocab_size`.
//!
//! A message is three arrays: the ops' length (int32), the ops as JSON bytes, then the
//! hidden states, whose shape the ops imply (`[1, rows, hidden]`).
use anyhow::{Context, Result};
use mlx_rs::{Array, Dtype};

use super::group::Group;
use crate::engine::executor::Op;

pub struct Message {
    pub ops: Vec<Op>,
    /// After the sender's layers; None for a message without a pass (stop).
    pub hidden: Option<Array>,
}

/// One rank's ends of the ring.
pub struct Link {
    group: Group,
    /// Each rank's host (the host file's `ssh`), for messages.
    hosts: Vec<String>,
}

impl Link {
    pub fn new(group: Group, hosts: Vec<String>) -> Link {
        Link { group, hosts }
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

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Sends `msg` to the next rank.
    pub fn send(&mut self, msg: &Message) -> Result<()> {
        let bytes = serde_json::to_vec(&msg.ops)?;
        let len = Array::from_slice(&[bytes.len() as i32], &[1]);
        let body = Array::from_slice(&bytes, &[bytes.len() as i32]);
        // One at a time: MLX may run independent sends of one eval in any order.
        for part in [Some(&len), Some(&body), msg.hidden.as_ref()].into_iter().flatten() {
            self.group.send(part, self.next())?.eval().with_context(|| format!("sending to {}", self.name(self.next())))?;
        }
        Ok(())
    }

    /// The next message from the previous rank; its hidden states are `[1, rows, hidden]`
    /// of `dtype`, received (evaluated) with it.
    pub fn receive(&mut self, hidden: i32, dtype: Dtype) -> Result<Message> {
        let len = self.group.recv(&[1], Dtype::Int32, self.prev())?;
        len.eval().with_context(|| format!("receiving from {}", self.name(self.prev())))?;
        let n = len.as_slice::<i32>()[0];
        anyhow::ensure!(n > 0, "a message of {n} bytes");
        let body = self.group.recv(&[n], Dtype::Uint8, self.prev())?;
        body.eval().with_context(|| format!("receiving from {}", self.name(self.prev())))?;
        let ops: Vec<Op> =
            serde_json::from_slice(body.as_slice::<u8>()).with_context(|| format!("a message from {}", self.name(self.prev())))?;
        let rows: i32 = ops.iter().map(Op::rows).sum();
        let hidden = match rows {
            0 => None,
            rows => {
                let h = self.group.recv(&[1, rows, hidden], dtype, self.prev())?;
                h.eval().with_context(|| format!("receiving hidden states from {}", self.name(self.prev())))?;
                Some(h)
            }
        };
        Ok(Message { ops, hidden })
    }

    /// Passes a message on after this rank's layers: to the next rank, or from the last
    /// rank only the hidden states, back to rank 0.
    pub fn forward(&mut self, msg: Message) -> Result<()> {
        if self.next() != 0 {
            return self.send(&msg);
        }
        if let Some(h) = &msg.hidden {
            self.group.send(h, 0)?.eval().with_context(|| format!("sending hidden states to {}", self.name(0)))?;
        }
        Ok(())
    }

    /// Rank 0: the last rank's hidden states for the pass just sent (shaped like `like`).
    pub fn receive_hidden(&mut self, like: &Array) -> Result<Array> {
        let h = self.group.recv(like.shape(), like.dtype(), self.prev())?;
        h.eval().with_context(|| format!("receiving hidden states from {}", self.name(self.prev())))?;
        Ok(h)
    }
}
