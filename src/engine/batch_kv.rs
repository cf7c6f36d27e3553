//! The decoding batch's keys and values: one padded tensor per layer, `[n, kv_heads,
//! capacity, head_dim]`, one row per sequence. A decode step writes every row's new token
//! with one scatter and attends with one masked SDPA per layer, so MLX dispatches a handful
//! of ops per layer instead of a dozen per sequence and layer (on the CPU device that
//! per-op cost, not arithmetic, bounded batched decoding).
//!
//! A sequence's cache moves in when it starts decoding ([`BatchKv::join`]) and back out
//! when it stops ([`BatchKv::leave`]); both copy its rows once.
use anyhow::{ensure, Result};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, Array};

use super::kv_cache::{KvCache, STEP};

#[derive(Default)]
pub struct BatchKv {
    /// Per layer (keys, values); empty while no sequence is in.
    layers: Vec<(Array, Array)>,
    /// Sequence id per row.
    ids: Vec<u64>,
    /// Tokens each row holds (the position its next token goes to).
    lens: Vec<i32>,
    capacity: i32,
}

impl BatchKv {
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    pub fn contains(&self, id: u64) -> bool {
        self.ids.contains(&id)
    }

    /// Tokens held by all rows.
    pub fn tokens(&self) -> usize {
        self.lens.iter().map(|&l| l as usize).sum()
    }

    /// Bytes of the padded buffers.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    /// Moves `cache` in as the last row.
    pub fn join(&mut self, id: u64, cache: KvCache) -> Result<()> {
        let len = cache.offset();
        let rows = cache.into_layers();
        ensure!(!rows.is_empty() && len > 0, "only a prefilled cache can join the batch");
        self.reserve(len)?;
        let capacity = self.capacity;
        let fit = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let filled = a.index((.., .., ..len, ..));
            Ok(ops::concatenate(&[filled, ops::zeros_dtype(&[s[0], s[1], capacity - len, s[3]], a.dtype())?], 2)?)
        };
        if self.layers.is_empty() {
            self.layers = rows.iter().map(|(k, v)| Ok((fit(k)?, fit(v)?))).collect::<Result<_>>()?;
        } else {
            for ((k, v), (rk, rv)) in self.layers.iter_mut().zip(&rows) {
                *k = ops::concatenate(&[&*k, &fit(rk)?], 0)?;
                *v = ops::concatenate(&[&*v, &fit(rv)?], 0)?;
            }
        }
        self.ids.push(id);
        self.lens.push(len);
        Ok(())
    }

    /// Moves sequence `id` out into a cache of its own (evaluated, so it holds no
    /// reference to the batch's buffers).
    pub fn leave(&mut self, id: u64) -> Result<KvCache> {
        let row = self.ids.iter().position(|&i| i == id).ok_or_else(|| anyhow::anyhow!("sequence {id} is not in the batch"))? as i32;
        let len = self.lens[row as usize];
        let mine: Vec<(Array, Array)> = self.layers.iter().map(|(k, v)| (k.index(row..row + 1), v.index(row..row + 1))).collect();
        let cache = KvCache::from_prefix(&mine, len)?;
        cache.eval()?;
        let n = self.ids.len() as i32;
        if n == 1 {
            *self = BatchKv::default();
            return Ok(cache);
        }
        let without = |a: &Array| -> Result<Array> {
            Ok(match row {
                0 => a.index(1..),
                r if r == n - 1 => a.index(..r),
                r => ops::concatenate(&[a.index(..r), a.index(r + 1..)], 0)?,
            })
        };
        for (k, v) in self.layers.iter_mut() {
            *k = without(k)?;
            *v = without(v)?;
        }
        self.ids.remove(row as usize);
        self.lens.remove(row as usize);
        Ok(cache)
    }

    /// Grows every buffer so a row can hold `tokens`.
    fn reserve(&mut self, tokens: i32) -> Result<()> {
        if tokens <= self.capacity {
            return Ok(());
        }
        let capacity = (tokens + STEP - 1) / STEP * STEP;
        for (k, v) in self.layers.iter_mut() {
            let grow = |a: &Array| -> Result<Array> {
                let s = a.shape();
                Ok(ops::concatenate(&[a, &ops::zeros_dtype(&[s[0], s[1], capacity - s[2], s[3]], a.dtype())?], 2)?)
            };
            *k = grow(k)?;
            *v = grow(v)?;
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Before a step: room for one more token in every row, and the step's inputs: each
    /// row's position (`[n]`) and the attention mask `[n, 1, 1, L]` (true where a row may
    /// look: its held tokens and the new one), L = the longest row after the step.
    pub fn prepare_step(&mut self) -> Result<(Array, Array)> {
        let longest = self.lens.iter().copied().max().unwrap_or(0) + 1;
        self.reserve(longest)?;
        let n = self.ids.len() as i32;
        let positions = Array::from_slice(&self.lens, &[n]);
        let columns = ops::arange::<_, i32>(0, longest, None)?.reshape(&[1, 1, 1, longest])?;
        let mask = columns.le(&positions.reshape(&[n, 1, 1, 1])?)?;
        Ok((positions, mask))
    }

    /// Writes `k`, `v` (`[n, kv_heads, 1, head_dim]`) at each row's position in `layer` and
    /// returns the keys and values up to the longest row (`[n, kv_heads, L, head_dim]`).
    pub fn update(&mut self, layer: usize, k: &Array, v: &Array, positions: &Array) -> Result<(Array, Array)> {
        let s = k.shape();
        let at = ops::broadcast_to(positions.reshape(&[s[0], 1, 1, 1])?, s)?;
        let longest = self.lens.iter().copied().max().unwrap_or(0) + 1;
        let (keys, values) = &mut self.layers[layer];
        // The old buffers have no other user once replaced, so MLX scatters in place.
        *keys = ops::indexing::put_along_axis(&*keys, &at, k, 2)?;
        *values = ops::indexing::put_along_axis(&*values, &at, v, 2)?;
        Ok((keys.index((.., .., ..longest, ..)), values.index((.., .., ..longest, ..))))
    }

    /// After a step: every row holds one more token.
    pub fn advance(&mut self) {
        for l in &mut self.lens {
            *l += 1;
        }
    }
}
