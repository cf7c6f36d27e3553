//! Reuse of the KV of a shared token prefix (a common system prompt, the earlier turns of a
//! chat). Finished sequences leave their keys and values here; a new prompt that starts
//! with the same tokens copies them instead of recomputing them.
//!
//! Index: every entry is hashed at each [`BLOCK`]-token boundary (a chain hash of the
//! prefix up to there), so a lookup walks the prompt block by block and stops at the
//! deepest boundary some entry shares, then extends the match token by token. Eviction is
//! least-recently-used under a byte budget. Lives on the engine thread (MLX arrays are not
//! `Send`), so it needs no locking; the stats it publishes are atomics.
use std::collections::HashMap;

use mlx_rs::Array;

/// Prefix granularity of the index, in tokens.
pub const BLOCK: usize = 16;

struct Entry {
    tokens: Vec<u32>,
    /// Per layer: keys and values `[1, kv_heads, >= tokens.len(), head_dim]`.
    kv: Vec<(Array, Array)>,
    bytes: usize,
    last_used: u64,
}

/// A prefix found for a prompt: how many tokens, and their KV per layer.
pub struct Hit<'a> {
    pub tokens: usize,
    pub kv: &'a [(Array, Array)],
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PrefixStats {
    pub entries: usize,
    pub bytes: usize,
    pub budget: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub tokens_saved: u64,
}

pub struct PrefixCache {
    budget: usize,
    /// Layers held and the model's: a rank of a cluster counts each entry at what the
    /// whole model's KV for it would take, so every rank, holding different layers, keeps
    /// and evicts the same entries as rank 0 ([`crate::engine::executor`]).
    share: (usize, usize),
    next_id: u64,
    tick: u64,
    entries: HashMap<u64, Entry>,
    /// Chain hash of a block-aligned prefix -> entries that start with it.
    index: HashMap<u64, Vec<u64>>,
    stats: PrefixStats,
}

/// Chain hashes of `tokens` at each block boundary (FNV-1a over the token bytes).
fn block_hashes(tokens: &[u32]) -> impl Iterator<Item = (usize, u64)> + '_ {
    let mut h: u64 = 0xcbf29ce484222325;
    tokens.chunks_exact(BLOCK).enumerate().map(move |(i, block)| {
        for t in block {
            for b in t.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100000001b3);
            }
        }
        ((i + 1) * BLOCK, h)
    })
}

impl PrefixCache {
    /// `budget` bytes of KV at most; 0 disables the cache.
    pub fn new(budget: usize) -> Self {
        Self::with_share(budget, 1, 1)
    }

    /// The cache of a process holding `held` of a model's `layers` layers: `budget` and the
    /// figures count the whole model's KV (the entries' bytes times `layers / held`).
    pub fn with_share(budget: usize, held: usize, layers: usize) -> Self {
        PrefixCache {
            budget,
            share: (held.max(1), layers.max(1)),
            next_id: 0,
            tick: 0,
            entries: HashMap::new(),
            index: HashMap::new(),
            stats: PrefixStats { budget, ..Default::default() },
        }
    }

    pub fn stats(&self) -> PrefixStats {
        PrefixStats { entries: self.entries.len(), bytes: self.bytes(), ..self.stats }
    }

    /// The longest cached prefix of `prompt`, leaving at least one prompt token to compute
    /// (the model must see it to produce logits). Counts a hit or a miss.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit<'_>> {
        if self.budget == 0 {
            return None;
        }
        let usable = prompt.len().saturating_sub(1);
        let mut best: Option<(usize, u64)> = None;
        for (end, h) in block_hashes(&prompt[..usable]) {
            let Some(ids) = self.index.get(&h) else { break };
            // Hash chains can collide: confirm on the tokens.
            match ids.iter().copied().find(|id| self.entries[id].tokens.get(..end) == Some(&prompt[..end])) {
                Some(id) => best = Some((end, id)),
                None => break,
            }
        }
        let Some((mut matched, id)) = best else {
            self.stats.misses += 1;
            return None;
        };
        self.tick += 1;
        let e = self.entries.get_mut(&id).unwrap();
        e.last_used = self.tick;
        while matched < usable && e.tokens.get(matched) == Some(&prompt[matched]) {
            matched += 1;
        }
        self.stats.hits += 1;
        self.stats.tokens_saved += matched as u64;
        Some(Hit { tokens: matched, kv: &e.kv })
    }

    /// Keeps the KV of `tokens` (computed: `kv` holds at least `tokens.len()` positions).
    /// Entries that are a prefix of it are dropped (it covers them); then least recently
    /// used entries go until the budget holds.
    pub fn insert(&mut self, tokens: Vec<u32>, kv: Vec<(Array, Array)>) {
        if self.budget == 0 || tokens.len() < BLOCK {
            return;
        }
        let kv = match trim(kv, tokens.len() as i32) {
            Ok(kv) => kv,
            Err(e) => {
                tracing::warn!("trimming a prefix for the cache: {e:#}");
                return;
            }
        };
        // Exact: every layer's entry has the same shape, so `held` divides the sum.
        let bytes: usize = kv.iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum::<usize>() / self.share.0 * self.share.1;
        if bytes > self.budget {
            return;
        }
        let covered: Vec<u64> = self.entries.iter().filter(|(_, e)| tokens.starts_with(&e.tokens)).map(|(id, _)| *id).collect();
        for id in covered {
            self.remove(id);
        }
        if self.entries.values().any(|e| e.tokens.starts_with(&tokens)) {
            return; // already covered by a longer entry
        }
        self.tick += 1;
        let id = self.next_id;
        self.next_id += 1;
        for (_, h) in block_hashes(&tokens) {
            self.index.entry(h).or_default().push(id);
        }
        self.entries.insert(id, Entry { tokens, kv, bytes, last_used: self.tick });
        while self.bytes() > self.budget {
            let oldest = *self.entries.iter().min_by_key(|(_, e)| e.last_used).unwrap().0;
            self.remove(oldest);
            self.stats.evictions += 1;
        }
    }

    /// Bytes the entries hold.
    pub fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.bytes).sum()
    }

    fn remove(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            for (_, h) in block_hashes(&e.tokens) {
                if let Some(ids) = self.index.get_mut(&h) {
                    ids.retain(|x| *x != id);
                    if ids.is_empty() {
                        self.index.remove(&h);
                    }
                }
            }
        }
    }
}

/// `kv` cut to its first `tokens` positions, in buffers of their own: a finished sequence's
/// cache is padded to the next 256 tokens, and kept as is that padding would take up to half
/// the cache's budget. Two slices concatenated always make a fresh buffer (a single slice
/// may stay a view of the padded one), and evaluating it now lets the padded one go.
fn trim(kv: Vec<(Array, Array)>, tokens: i32) -> anyhow::Result<Vec<(Array, Array)>> {
    use mlx_rs::ops::indexing::IndexOp;
    if kv.iter().all(|(k, _)| k.shape()[2] == tokens) {
        return Ok(kv);
    }
    let cut = |a: &Array| -> anyhow::Result<Array> {
        let (head, last) = (a.index((.., .., ..tokens - 1, ..)), a.index((.., .., tokens - 1..tokens, ..)));
        Ok(mlx_rs::ops::concatenate(&[head, last], 2)?)
    };
    let trimmed = kv.iter().map(|(k, v)| Ok((cut(k)?, cut(v)?))).collect::<anyhow::Result<Vec<_>>>()?;
    mlx_rs::transforms::eval(trimmed.iter().flat_map(|(k, v)| [k, v]))?;
    Ok(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KV of `n` positions with 1 layer, 1 head, head_dim 1: the value is the position.
    fn kv(n: usize) -> Vec<(Array, Array)> {
        let a = Array::from_slice(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), &[1, 1, n as i32, 1]);
        vec![(a.clone(), a)]
    }

    fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
        range.collect()
    }

    #[test]
    fn longest_prefix_wins_and_one_token_is_left_to_compute() {
        let mut c = PrefixCache::new(1 << 20);
        assert!(c.lookup(&toks(0..40)).is_none());
        c.insert(toks(0..40), kv(40));
        // shares 40 tokens, then differs
        let mut p = toks(0..40);
        p.extend([999, 998]);
        assert_eq!(c.lookup(&p).unwrap().tokens, 40);
        // shares 20 (a block and 4 tokens), then differs
        let mut p = toks(0..20);
        p.extend([7, 7, 7]);
        assert_eq!(c.lookup(&p).unwrap().tokens, 20);
        // the prompt is the cached sequence itself: all but its last token
        assert_eq!(c.lookup(&toks(0..40)).unwrap().tokens, 39);
        // under one block in common: a miss
        let mut p = toks(0..10);
        p.extend(toks(100..130));
        assert!(c.lookup(&p).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.tokens_saved, s.entries), (3, 2, 99, 1));
    }

    #[test]
    fn ranks_holding_different_layers_keep_and_evict_the_same_entries() {
        // A 3-layer model split 1 + 2: each rank counts an entry at the whole model's size,
        // so both keep and evict alike under the same budget (rank 0's). Three entries of
        // 32, 40 and 48 tokens; the budget holds the last two (88 tokens' worth) only.
        let layers = |n: usize, held: usize| (0..held).flat_map(|_| kv(n)).collect::<Vec<_>>();
        let per_token = 3 * kv(1).iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum::<usize>();
        let mut ranks = [PrefixCache::with_share(90 * per_token, 1, 3), PrefixCache::with_share(90 * per_token, 2, 3)];
        for (held, c) in [1, 2].into_iter().zip(&mut ranks) {
            for (start, n) in [(0u32, 32usize), (1000, 40), (2000, 48)] {
                c.insert(toks(start..start + n as u32), layers(n, held));
            }
        }
        for c in &mut ranks {
            assert_eq!((c.stats().entries, c.stats().bytes, c.stats().evictions), (2, 88 * per_token, 1));
            assert!(c.lookup(&toks(0..33)).is_none());
            assert_eq!(c.lookup(&toks(2000..2049)).map(|h| (h.tokens, h.kv.len())), Some((48, if c.share.0 == 1 { 1 } else { 2 })));
        }
    }

    #[test]
    fn a_longer_turn_replaces_the_prefix_it_extends() {
        let mut c = PrefixCache::new(1 << 20);
        c.insert(toks(0..32), kv(32));
        c.insert(toks(0..64), kv(64));
        assert_eq!(c.stats().entries, 1);
        c.insert(toks(0..48), kv(48)); // covered by the longer one
        assert_eq!(c.stats().entries, 1);
        assert_eq!(c.lookup(&toks(0..70)).unwrap().tokens, 64);
    }

    #[test]
    fn least_recently_used_entries_go_first_under_the_budget() {
        let one = kv(32).iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum::<usize>();
        let mut c = PrefixCache::new(2 * one);
        c.insert(toks(0..32), kv(32));
        c.insert(toks(1000..1032), kv(32));
        assert!(c.lookup(&toks(0..33)).is_some()); // touch the first
        c.insert(toks(2000..2032), kv(32)); // evicts the second
        assert!(c.lookup(&toks(1000..1033)).is_none());
        assert!(c.lookup(&toks(0..33)).is_some());
        assert!(c.lookup(&toks(2000..2033)).is_some());
        assert_eq!(c.stats().evictions, 1);
        assert!(c.stats().bytes <= 2 * one);
    }

    #[test]
    fn a_padded_cache_is_kept_at_its_length() {
        // 40 positions filled of a 256-position buffer, 2 heads (as a sequence's cache leaves).
        let padded = Array::from_slice(&(0..2 * 256).map(|i| i as f32).collect::<Vec<_>>(), &[1, 2, 256, 1]);
        let mut c = PrefixCache::new(1 << 20);
        c.insert(toks(0..40), vec![(padded.clone(), padded)]);
        assert_eq!(c.bytes(), 2 * (2 * 40 * 4), "keys and values, 2 heads × 40 positions × float32");
        let hit = c.lookup(&toks(0..41)).unwrap();
        let (k, _) = &hit.kv[0];
        assert_eq!(k.shape(), &[1, 2, 40, 1]);
        let got: Vec<f32> = k.as_slice::<f32>().to_vec();
        let want: Vec<f32> = (0..40).map(|i| i as f32).chain((256..296).map(|i| i as f32)).collect();
        assert_eq!(got, want, "each head's first 40 positions, in order");
    }

    #[test]
    fn a_zero_budget_disables_it() {
        let mut c = PrefixCache::new(0);
        c.insert(toks(0..32), kv(32));
        assert!(c.lookup(&toks(0..40)).is_none());
        assert_eq!(c.stats().entries, 0);
    }
}
