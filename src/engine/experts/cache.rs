//! Which experts stay in memory: a byte-budgeted cache keyed by (layer, expert), evicting by
//! frequency with decay (LFU whose counts halve every [`HALF_LIFE`] lookups), so an expert
//! the router keeps choosing stays while one that was hot a thousand tokens ago leaves.
//! Plain LRU evicts a hot expert after one burst of others; plain LFU never forgets a
//! prompt's experts once the topic changes. Pure bookkeeping over values of known size, so
//! its unit tests run without MLX.
use std::collections::HashMap;

/// Lookups after which an expert's count has halved.
pub const HALF_LIFE: f64 = 512.0;

/// A cached expert: `layer`, `expert`.
pub type Key = (u32, u32);

struct Entry<V> {
    value: V,
    bytes: u64,
    /// Decayed lookup count as of `tick`.
    score: f64,
    tick: u64,
}

pub struct ExpertCache<V> {
    budget: u64,
    bytes: u64,
    /// Lookups so far: the clock the decay runs on.
    tick: u64,
    entries: HashMap<Key, Entry<V>>,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    Miss,
}

impl<V: Clone> ExpertCache<V> {
    pub fn new(budget: u64) -> Self {
        ExpertCache { budget, bytes: 0, tick: 0, entries: HashMap::new() }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: Key) -> bool {
        self.entries.contains_key(&key)
    }

    /// The value of `key`, counted as `uses` lookups (the tokens routed to it this step), or
    /// `load`'s, kept when it fits beside `pinned` (the experts the current step holds) after
    /// evicting the lowest decayed counts. A value larger than the budget is returned
    /// without being kept.
    pub fn get_or_load<E>(
        &mut self,
        key: Key,
        uses: u64,
        pinned: &[Key],
        load: impl FnOnce() -> Result<(V, u64), E>,
    ) -> Result<(V, Lookup), E> {
        self.tick += uses;
        let now = self.tick;
        if let Some(e) = self.entries.get_mut(&key) {
            e.score = decayed(e.score, now - e.tick) + uses as f64;
            e.tick = now;
            return Ok((e.value.clone(), Lookup::Hit));
        }
        let (value, bytes) = load()?;
        if self.make_room(bytes, pinned) {
            self.bytes += bytes;
            self.entries.insert(key, Entry { value: value.clone(), bytes, score: uses as f64, tick: now });
        }
        Ok((value, Lookup::Miss))
    }

    /// Evicts the lowest decayed counts (never `pinned`) until `bytes` more fit; false when
    /// they cannot.
    fn make_room(&mut self, bytes: u64, pinned: &[Key]) -> bool {
        if bytes > self.budget {
            return false;
        }
        while self.bytes + bytes > self.budget {
            let now = self.tick;
            let victim = self
                .entries
                .iter()
                .filter(|(k, _)| !pinned.contains(k))
                .min_by(|a, b| decayed(a.1.score, now - a.1.tick).total_cmp(&decayed(b.1.score, now - b.1.tick)))
                .map(|(k, _)| *k);
            let Some(victim) = victim else { return false };
            let e = self.entries.remove(&victim).expect("victim is present");
            self.bytes -= e.bytes;
        }
        true
    }
}

fn decayed(score: f64, elapsed: u64) -> f64 {
    score * (-(elapsed as f64) * std::f64::consts::LN_2 / HALF_LIFE).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(v: u32) -> impl FnOnce() -> Result<(u32, u64), ()> {
        move || Ok((v, 10))
    }

    #[test]
    fn keeps_within_budget_and_counts_hits() {
        let mut c = ExpertCache::new(30);
        for e in 0..3 {
            assert_eq!(c.get_or_load((0, e), 1, &[], load(e)).unwrap(), (e, Lookup::Miss));
        }
        assert_eq!((c.len(), c.bytes()), (3, 30));
        assert_eq!(c.get_or_load((0, 1), 1, &[], load(1)).unwrap().1, Lookup::Hit);
        // A fourth evicts one; the budget holds.
        c.get_or_load((0, 3), 1, &[], load(3)).unwrap();
        assert_eq!((c.len(), c.bytes()), (3, 30));
        assert!(c.contains((0, 1)), "the expert looked up twice stays");
    }

    /// The frequently chosen expert survives a burst of one-off ones (LRU would evict it);
    /// an expert hot long ago loses to one hot now (plain LFU would keep it).
    #[test]
    fn frequency_with_decay_beats_recency_and_forgets() {
        let mut c = ExpertCache::new(20);
        for _ in 0..8 {
            c.get_or_load((0, 0), 1, &[], load(0)).unwrap();
        }
        for e in 1..6 {
            c.get_or_load((0, e), 1, &[], load(e)).unwrap();
        }
        assert!(c.contains((0, 0)), "hot expert kept through a burst");

        // Thousands of lookups later, expert 0's 8 counts have decayed below a fresh 2.
        for _ in 0..(HALF_LIFE as u32 * 6) {
            c.get_or_load((1, 7), 1, &[], load(7)).unwrap();
        }
        c.get_or_load((0, 9), 2, &[], load(9)).unwrap();
        assert!(!c.contains((0, 0)) && c.contains((0, 9)) && c.contains((1, 7)));
    }

    #[test]
    fn pinned_experts_are_never_evicted_and_oversize_is_not_kept() {
        let mut c = ExpertCache::new(20);
        c.get_or_load((0, 0), 1, &[], load(0)).unwrap();
        c.get_or_load((0, 1), 1, &[], load(1)).unwrap();
        let pinned = [(0, 0), (0, 1), (0, 2)];
        // Both entries pinned: the third is returned but not kept.
        assert_eq!(c.get_or_load((0, 2), 1, &pinned, load(2)).unwrap(), (2, Lookup::Miss));
        assert!(c.contains((0, 0)) && c.contains((0, 1)) && !c.contains((0, 2)));
        let big = c.get_or_load((0, 5), 1, &[], || Ok::<_, ()>((5, 21))).unwrap();
        assert_eq!(big, (5, Lookup::Miss));
        assert_eq!(c.bytes(), 20);
        assert!(c.get_or_load((0, 6), 1, &[], || Err("disk")).is_err());
    }
}
