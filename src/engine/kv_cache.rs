//! Per-sequence key/value cache. Buffers grow in steps of [`STEP`] tokens and are written
//! with slice updates, which MLX performs in place when the old buffer has no other user,
//! so a decode step copies one token's keys and values, not the whole history.
use anyhow::Result;
use mlx_rs::{
    ops::{self, indexing::{IndexOp, TryIndexMutOp}},
    Array,
};

pub const STEP: i32 = 256;

#[derive(Default)]
struct LayerKv {
    keys: Option<Array>,
    values: Option<Array>,
}

/// One sequence's cache: keys and values `[1, kv_heads, capacity, head_dim]` per layer.
pub struct KvCache {
    layers: Vec<LayerKv>,
    /// Tokens held (the position of the next token).
    offset: i32,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        KvCache { layers: (0..num_layers).map(|_| LayerKv::default()).collect(), offset: 0 }
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Appends `k`, `v` (`[1, kv_heads, L, head_dim]`) to `layer` and returns all keys and
    /// values so far. Call for every layer, then [`KvCache::advance`] by L.
    pub fn update(&mut self, layer: usize, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let (start, len) = (self.offset, k.shape()[2]);
        let end = start + len;
        let slot = &mut self.layers[layer];
        let capacity = slot.keys.as_ref().map_or(0, |a| a.shape()[2]);
        if end > capacity {
            let grow = ((end - capacity + STEP - 1) / STEP) * STEP;
            let extend = |old: Option<&Array>, like: &Array| -> Result<Array> {
                let s = like.shape();
                let fresh = ops::zeros_dtype(&[s[0], s[1], grow, s[3]], like.dtype())?;
                Ok(match old {
                    Some(old) => ops::concatenate(&[old.index((.., .., ..start, ..)), fresh], 2)?,
                    None => fresh,
                })
            };
            slot.keys = Some(extend(slot.keys.as_ref(), k)?);
            slot.values = Some(extend(slot.values.as_ref(), v)?);
        }
        let keys = slot.keys.as_mut().unwrap();
        keys.try_index_mut((.., .., start..end, ..), k)?;
        let values = slot.values.as_mut().unwrap();
        values.try_index_mut((.., .., start..end, ..), v)?;
        Ok((keys.index((.., .., ..end, ..)), values.index((.., .., ..end, ..))))
    }

    /// A cache holding the first `tokens` positions of `kv` (per layer, as
    /// [`KvCache::layers`] returns them), copied into buffers of its own.
    pub fn from_prefix(kv: &[(Array, Array)], tokens: i32) -> Result<KvCache> {
        let capacity = ((tokens + STEP - 1) / STEP).max(1) * STEP;
        let copy = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let pad = ops::zeros_dtype(&[s[0], s[1], capacity - tokens, s[3]], a.dtype())?;
            Ok(ops::concatenate(&[a.index((.., .., ..tokens, ..)), pad], 2)?)
        };
        let mut layers = Vec::with_capacity(kv.len());
        for (k, v) in kv {
            layers.push(LayerKv { keys: Some(copy(k)?), values: Some(copy(v)?) });
        }
        Ok(KvCache { layers, offset: tokens })
    }

    /// Each layer's keys and values (the whole buffers; the first [`KvCache::offset`]
    /// positions are filled). For the prefix cache, once the sequence is done.
    pub fn into_layers(self) -> Vec<(Array, Array)> {
        self.layers.into_iter().filter_map(|l| l.keys.zip(l.values)).collect()
    }

    /// Computes the buffers now (they may be lazy views of other arrays).
    pub fn eval(&self) -> Result<()> {
        mlx_rs::transforms::eval(self.layers.iter().flat_map(|l| [&l.keys, &l.values]).flatten())?;
        Ok(())
    }

    pub fn advance(&mut self, tokens: i32) {
        self.offset += tokens;
    }

    /// Bytes held by the buffers (capacity, not just the filled part).
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| [&l.keys, &l.values])
            .flatten()
            .map(|a| a.nbytes())
            .sum()
    }
}
