//! The decoding batch's keys and values: one padded tensor per layer, `[n, kv_heads,
//! capacity, head_dim]`, one row per sequence. A decode step writes every row's new token
//! with one scatter and attends with one masked SDPA per layer, so MLX dispatches a handful
//! of ops per layer instead of a dozen per sequence and layer (on the CPU device that
//! per-op cost, not arithmetic, bounded batched decoding).
//!
//! On the CPU the step writes and attends in one op of mlxbar's per layer instead, in place
//! ([`BatchKv::buffers`]).
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
    /// This step's write positions broadcast to a layer's `[n, kv_heads, 1, head_dim]`:
    /// the same for every layer, so built once a step (two MLX ops fewer per layer).
    step_at: Option<Array>,
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
        self.materialize()
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
        self.materialize()?;
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
        self.materialize()
    }

    /// Evaluates the buffers after they were rebuilt (concatenated, or sliced past a row
    /// that left the front), so each is a dense array ([`BatchKv::buffers`]: an op may
    /// write them in place; it checks they are).
    fn materialize(&mut self) -> Result<()> {
        mlx_rs::transforms::eval(self.layers.iter().flat_map(|(k, v)| [k, v]))?;
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
        self.step_at = None;
        Ok((positions, mask))
    }

    /// Writes `k`, `v` (`[n, kv_heads, 1, head_dim]`) at each row's position in `layer` and
    /// returns the keys and values up to the longest row (`[n, kv_heads, L, head_dim]`).
    pub fn update(&mut self, layer: usize, k: &Array, v: &Array, positions: &Array) -> Result<(Array, Array)> {
        let longest = self.lens.iter().copied().max().unwrap_or(0) + 1;
        let (keys, values) = self.write(layer, k, v, positions)?;
        Ok((keys.index((.., .., ..longest, ..)), values.index((.., .., ..longest, ..))))
    }

    /// Layer `layer`'s buffers (`[n, kv_heads, capacity, head_dim]`; positions past a row's
    /// own are padding), evaluated and dense, for an op that writes each row's new token
    /// at its position in place (`cpu_backend::decode_attention`).
    pub fn buffers(&self, layer: usize) -> (&Array, &Array) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// As [`BatchKv::update`], returning the whole buffers.
    fn write(&mut self, layer: usize, k: &Array, v: &Array, positions: &Array) -> Result<(&Array, &Array)> {
        let s = k.shape();
        let at = match &self.step_at {
            Some(at) if at.shape() == s => at.clone(),
            _ => {
                let at = ops::broadcast_to(positions.reshape(&[s[0], 1, 1, 1])?, s)?;
                self.step_at = Some(at.clone());
                at
            }
        };
        let (keys, values) = &mut self.layers[layer];
        // The old buffers have no other user once replaced, so MLX scatters in place.
        *keys = ops::indexing::put_along_axis(&*keys, &at, k, 2)?;
        *values = ops::indexing::put_along_axis(&*values, &at, v, 2)?;
        Ok((keys, values))
    }

    /// After a step: every row holds one more token.
    pub fn advance(&mut self) {
        for l in &mut self.lens {
            *l += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-layer cache of `len` tokens whose key at position p is `[base + p, base + p]`
    /// (values: the same plus 0.5), one kv head of dimension 2.
    fn cache(base: f32, len: i32) -> KvCache {
        let keys: Vec<f32> = (0..len * 2).map(|i| base + (i / 2) as f32).collect();
        let values: Vec<f32> = keys.iter().map(|k| k + 0.5).collect();
        let mut c = KvCache::new(1);
        c.update(0, &Array::from_slice(&keys, &[1, 1, len, 2]), &Array::from_slice(&values, &[1, 1, len, 2])).unwrap();
        c.advance(len);
        c
    }

    /// Row `row`'s first key component at every position of `keys` (`[n, 1, L, 2]`).
    fn row(keys: &Array, row: i32) -> Vec<f32> {
        keys.index((row, 0, .., 0)).as_slice::<f32>().to_vec()
    }

    #[test]
    fn rows_of_different_lengths_are_padded_masked_and_written_at_their_own_position() {
        let mut b = BatchKv::default();
        b.join(7, cache(0.0, 3)).unwrap();
        b.join(9, cache(100.0, 5)).unwrap();
        assert_eq!(b.ids(), &[7, 9]);
        assert_eq!(b.tokens(), 8);
        let (positions, mask) = b.prepare_step().unwrap();
        assert_eq!(positions.as_slice::<i32>(), &[3, 5]);
        assert_eq!(mask.shape(), &[2, 1, 1, 6]);
        // Row 0 sees its 3 tokens and the new one, not the padding; row 1 sees all 6.
        assert_eq!(mask.as_slice::<bool>(), &[true, true, true, true, false, false, true, true, true, true, true, true]);
        let new_k = Array::from_slice(&[50.0f32, 50.0, 150.0, 150.0], &[2, 1, 1, 2]);
        let (keys, values) = b.update(0, &new_k, &new_k, &positions).unwrap();
        b.advance();
        assert_eq!(keys.shape(), &[2, 1, 6, 2]);
        assert_eq!(row(&keys, 0), &[0.0, 1.0, 2.0, 50.0, 0.0, 0.0]);
        assert_eq!(row(&keys, 1), &[100.0, 101.0, 102.0, 103.0, 104.0, 150.0]);
        assert_eq!(row(&values, 0)[..3], [0.5, 1.5, 2.5]);
        assert_eq!(b.tokens(), 10);
        let (positions, _) = b.prepare_step().unwrap();
        assert_eq!(positions.as_slice::<i32>(), &[4, 6]);
    }

    #[test]
    fn a_row_leaves_with_its_tokens_and_the_others_keep_theirs() {
        let mut b = BatchKv::default();
        b.join(1, cache(0.0, 2)).unwrap();
        b.join(2, cache(10.0, 4)).unwrap();
        b.join(3, cache(20.0, 3)).unwrap();
        let middle = b.leave(2).unwrap();
        assert_eq!(middle.offset(), 4);
        let (k, v) = middle.into_layers().remove(0);
        assert_eq!(k.index((0, 0, ..4, 0)).as_slice::<f32>(), &[10.0, 11.0, 12.0, 13.0]);
        assert_eq!(v.index((0, 0, ..4, 0)).as_slice::<f32>(), &[10.5, 11.5, 12.5, 13.5]);
        assert_eq!(b.ids(), &[1, 3]);
        assert_eq!(b.tokens(), 5);
        let (positions, mask) = b.prepare_step().unwrap();
        assert_eq!(positions.as_slice::<i32>(), &[2, 3]);
        assert_eq!(mask.shape(), &[2, 1, 1, 4]);
        let (keys, _) = b
            .update(0, &Array::from_slice(&[-1.0f32; 4], &[2, 1, 1, 2]), &Array::from_slice(&[-1.0f32; 4], &[2, 1, 1, 2]), &positions)
            .unwrap();
        assert_eq!(row(&keys, 0), &[0.0, 1.0, -1.0, 0.0]);
        assert_eq!(row(&keys, 1), &[20.0, 21.0, 22.0, -1.0]);
        // The last row out empties the batch.
        b.leave(1).unwrap();
        b.leave(3).unwrap();
        assert!(b.ids().is_empty());
        assert_eq!(b.nbytes(), 0);
        assert!(b.leave(3).is_err(), "a sequence not in the batch cannot leave");
    }

    #[test]
    fn a_long_newcomer_grows_every_row_and_an_empty_cache_is_refused() {
        let mut b = BatchKv::default();
        b.join(1, cache(0.0, 2)).unwrap();
        assert_eq!(b.nbytes(), 2 * STEP as usize * 2 * 4);
        b.join(2, cache(0.0, STEP + 10)).unwrap();
        assert_eq!(b.nbytes(), 2 * 2 * (2 * STEP) as usize * 2 * 4, "both rows now hold two steps");
        let (positions, mask) = b.prepare_step().unwrap();
        assert_eq!(positions.as_slice::<i32>(), &[2, STEP + 10]);
        assert_eq!(mask.shape(), &[2, 1, 1, STEP + 11]);
        assert!(b.join(3, KvCache::new(1)).is_err());
    }
}
