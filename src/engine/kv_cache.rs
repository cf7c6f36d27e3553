//! Per-sequence key/value cache. Buffers grow by [`STEP`] tokens past what they hold and are written
//! with slice updates, which MLX performs in place when the old buffer has no other user,
//! so a decode step copies one token's keys and values, not the whole history.
use anyhow::Result;
use mlx_rs::{
    ops::{
        self,
        indexing::{IndexOp, TryIndexMutOp},
    },
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
            // Whole steps past `start`, where the held rows end (a prefix copy's buffer
            // runs past them: counting from its end would leave too few for a long append).
            let grow = ((end - start + STEP - 1) / STEP) * STEP;
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

    /// Forgets every position from `tokens` on (a draft's rejected tokens): the next update
    /// writes over them.
    pub fn truncate(&mut self, tokens: i32) {
        self.offset = self.offset.min(tokens.max(0));
    }

    /// Bytes held by the buffers (capacity, not just the filled part).
    pub fn nbytes(&self) -> usize {
        self.layers.iter().flat_map(|l| [&l.keys, &l.values]).flatten().map(|a| a.nbytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[1, 1, len, 2]` holding `start, start+1, ...` in position order.
    fn positions(start: f32, len: i32) -> Array {
        let v: Vec<f32> = (0..len * 2).map(|i| start + (i / 2) as f32).collect();
        Array::from_slice(&v, &[1, 1, len, 2])
    }

    #[test]
    fn grows_in_steps_and_keeps_what_it_held() {
        let mut cache = KvCache::new(1);
        let (k, _) = cache.update(0, &positions(0.0, 200), &positions(1000.0, 200)).unwrap();
        cache.advance(200);
        assert_eq!(k.shape(), &[1, 1, 200, 2]);
        assert_eq!(cache.nbytes(), 2 * STEP as usize * 2 * 4, "one step of capacity for keys and values");
        // 100 more do not fit: the held 200 are kept and one step added after them (as
        // mlx-lm's KVCache does), old rows intact.
        let (k, v) = cache.update(0, &positions(200.0, 100), &positions(1200.0, 100)).unwrap();
        cache.advance(100);
        assert_eq!(k.shape(), &[1, 1, 300, 2]);
        assert_eq!(cache.offset(), 300);
        assert_eq!(cache.nbytes(), 2 * (200 + STEP) as usize * 2 * 4);
        let k = k.index((.., .., .., 0)).reshape(&[-1]).unwrap();
        let v = v.index((.., .., .., 0)).reshape(&[-1]).unwrap();
        let want: Vec<f32> = (0..300).map(|i| i as f32).collect();
        assert_eq!(k.as_slice::<f32>(), &want[..]);
        assert_eq!(v.as_slice::<f32>(), &want.iter().map(|x| x + 1000.0).collect::<Vec<_>>()[..]);
    }

    /// A prompt that continues a cached prefix by more than a step: the prefix copy's buffer
    /// (259 positions in 512) grows to hold all 762 (it grew by one step from 259 to 515
    /// and the write of 503 rows failed).
    #[test]
    fn a_long_append_to_a_prefix_copy_fits() {
        let mut cache = KvCache::new(1);
        cache.update(0, &positions(0.0, 259), &positions(0.0, 259)).unwrap();
        cache.advance(259);
        let mut copy = KvCache::from_prefix(&cache.into_layers(), 259).unwrap();
        let (k, _) = copy.update(0, &positions(259.0, 503), &positions(259.0, 503)).unwrap();
        copy.advance(503);
        assert_eq!(k.shape(), &[1, 1, 762, 2]);
        let k = k.index((.., .., .., 0)).reshape(&[-1]).unwrap();
        assert_eq!(k.as_slice::<f32>(), &(0..762).map(|i| i as f32).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn a_prefix_copy_holds_only_the_prefix() {
        let mut cache = KvCache::new(1);
        cache.update(0, &positions(0.0, 10), &positions(0.0, 10)).unwrap();
        cache.advance(10);
        let layers = cache.into_layers();
        let copy = KvCache::from_prefix(&layers, 4).unwrap();
        assert_eq!(copy.offset(), 4);
        let (k, _) = copy.into_layers().remove(0);
        assert_eq!(k.shape(), &[1, 1, STEP, 2]);
        let head = k.index((.., .., ..6, 0)).reshape(&[-1]).unwrap();
        assert_eq!(head.as_slice::<f32>(), &[0.0, 1.0, 2.0, 3.0, 0.0, 0.0], "positions past the prefix are zeroed");
    }
}
