//! A sparse layer whose experts are streamed: the router runs as usual; the experts its
//! tokens chose are taken from the shared [`ExpertCache`] or read from disk, and run with
//! the same `gather_mm`/`gather_qmm` as the resident layer (over a small stack of just
//! those experts, indices remapped into it), so a streamed model computes what the
//! resident one computes. When a step needs more experts than the cache holds (a long
//! prefill), they run in groups that fit, each group evaluated before the next is loaded,
//! so the experts in memory never exceed the budget.
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mlx_rs::{ops, Array};

use super::cache::{ExpertCache, Key, Lookup};
use super::locate::ExpertFiles;
use super::stats::ExpertStats;
use crate::engine::model::config::Activation;
use crate::engine::model::linear::Weight;
use crate::engine::model::switch::{SwitchGlu, SwitchLinear};

/// Converts a weight read from disk to the model's format (what `Model::assemble` does to
/// resident weights).
pub type Hold = Box<dyn Fn(Weight) -> Result<Weight>>;

/// Everything a streamed model's sparse layers share: the files, the cache, the stats.
pub struct ExpertStore {
    files: ExpertFiles,
    cache: Mutex<ExpertCache<Rc<SwitchGlu>>>,
    hold: Hold,
    activation: Activation,
    pub stats: Arc<ExpertStats>,
    /// Experts the cache holds at once (all take alike, measured on the first one read): a
    /// step's group of experts is at most this many.
    per_group: usize,
}

impl ExpertStore {
    /// A store over `files` with a cache of `budget` bytes. Reads one expert to learn their
    /// size in memory (it stays cached); a budget that cannot hold one is an error.
    pub fn new(files: ExpertFiles, budget: u64, hold: Hold, activation: Activation, num_experts: u32) -> Result<ExpertStore> {
        let layers = files.layers();
        let first = *layers.first().context("no expert tensors to stream")?;
        let (expert, took) = read_expert(&files, (first, 0), &hold, activation)?;
        let expert_bytes = expert.nbytes() as u64;
        anyhow::ensure!(
            budget >= expert_bytes,
            "an expert cache of {budget} bytes cannot hold one expert ({expert_bytes} bytes in memory)"
        );
        let stats = Arc::new(ExpertStats::new(budget, &layers, num_experts, expert_bytes));
        stats.record_load(files.disk_bytes((first, 0)), took);
        let mut cache = ExpertCache::new(budget);
        cache.get_or_load::<anyhow::Error>((first, 0), 0, &[], || Ok((Rc::new(expert), expert_bytes)))?;
        stats.set_resident(cache.len(), cache.bytes());
        let per_group = (budget / expert_bytes) as usize;
        Ok(ExpertStore { files, cache: Mutex::new(cache), hold, activation, stats, per_group })
    }

    pub fn has(&self, key: Key) -> bool {
        self.files.has(key)
    }

    /// Layer `layer`'s experts for `x` `[T, hidden]` routed by `indices` `[T, k]` (uint32):
    /// `[T, k, hidden]`, as [`SwitchGlu::forward`] computes it.
    pub fn forward(&self, layer: u32, x: &Array, indices: &Array) -> Result<Array> {
        let (t, k) = (indices.shape()[0], indices.shape()[1]);
        let hidden = x.shape()[1];
        // The routing to the host: the one sync a streamed layer costs.
        let chosen = indices.as_type::<u32>()?.contiguous()?;
        chosen.eval()?;
        let chosen: Vec<u32> = chosen.try_as_slice::<u32>().map_err(|e| anyhow::anyhow!("reading the routing: {e:?}"))?.to_vec();
        self.stats.record_routing(layer, &chosen);
        // Pairs in expert order (stable), as the resident layer's sorted path takes them.
        let mut order: Vec<u32> = (0..chosen.len() as u32).collect();
        order.sort_by_key(|&p| chosen[p as usize]);
        let mut outs = Vec::new();
        let mut start = 0;
        while start < order.len() {
            // The next run of pairs whose distinct experts fit the cache together: the
            // experts, the selections of each, and each pair's index into the group.
            let (mut group, mut uses, mut local): (Vec<u32>, Vec<u64>, Vec<u32>) = (vec![], vec![], vec![]);
            let mut end = start;
            while end < order.len() {
                let e = chosen[order[end] as usize];
                if group.last() != Some(&e) {
                    if group.len() == self.per_group {
                        break;
                    }
                    group.push(e);
                    uses.push(0);
                }
                *uses.last_mut().expect("an expert pushed") += 1;
                local.push(group.len() as u32 - 1);
                end += 1;
            }
            let pairs = &order[start..end];
            let experts = self.take(layer, &group, &uses)?;
            let rows: Vec<u32> = pairs.iter().map(|&p| p / k as u32).collect();
            let xs = x.reshape(&[t, 1, hidden])?.take_axis(Array::from_slice(&rows, &[rows.len() as i32]), 0)?;
            let idx = Array::from_slice(&local, &[local.len() as i32]);
            let y = stack(&experts)?.experts(&xs, &idx, true)?;
            // Evaluated here, so this group's experts can leave before the next is read.
            y.eval()?;
            outs.push(y);
            start = end;
        }
        let y = if outs.len() == 1 { outs.pop().unwrap() } else { ops::concatenate(&outs, 0)? };
        let mut inverse = vec![0u32; order.len()];
        for (sorted, &p) in order.iter().enumerate() {
            inverse[p as usize] = sorted as u32;
        }
        Ok(y.take_axis(Array::from_slice(&inverse, &[inverse.len() as i32]), 0)?.reshape(&[t, k, hidden])?)
    }

    /// `group`'s experts of `layer`, from the cache or disk; `uses[i]` selections of `group[i]`.
    fn take(&self, layer: u32, group: &[u32], uses: &[u64]) -> Result<Vec<Rc<SwitchGlu>>> {
        let pinned: Vec<Key> = group.iter().map(|&e| (layer, e)).collect();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::with_capacity(group.len());
        for (&e, &n) in group.iter().zip(uses) {
            let key = (layer, e);
            let (expert, lookup) = cache.get_or_load(key, n, &pinned, || -> Result<_> {
                let (expert, took) = read_expert(&self.files, key, &self.hold, self.activation)?;
                self.stats.record_load(self.files.disk_bytes(key), took);
                let bytes = expert.nbytes() as u64;
                Ok((Rc::new(expert), bytes))
            })?;
            // The first of a step's tokens to ask for a missing expert misses; the others
            // find it loaded.
            match lookup {
                Lookup::Hit => self.stats.record_lookups(n, 0),
                Lookup::Miss => self.stats.record_lookups(n - 1, 1),
            }
            out.push(expert);
        }
        self.stats.set_resident(cache.len(), cache.bytes());
        Ok(out)
    }
}

/// Expert `key` read from disk and materialized (so the read is timed here, not by the
/// first step that uses it), and how long that took.
fn read_expert(files: &ExpertFiles, key: Key, hold: &Hold, activation: Activation) -> Result<(SwitchGlu, Duration)> {
    let started = Instant::now();
    let expert = files.read(key, hold, activation)?;
    mlx_rs::transforms::eval(expert.arrays())?;
    Ok((expert, started.elapsed()))
}

/// One-expert stacks side by side: a `[group, out, in]` stack the gather ops index.
fn stack(experts: &[Rc<SwitchGlu>]) -> Result<SwitchGlu> {
    let cat = |pick: fn(&SwitchGlu) -> &SwitchLinear| -> Result<SwitchLinear> {
        let parts: Vec<&SwitchLinear> = experts.iter().map(|e| pick(e)).collect();
        let weights: Vec<Weight> = parts.iter().map(|p| p.0.clone()).collect();
        let weight = Weight::concat_rows(&weights)?.context("experts of one layer in different formats")?;
        let bias = match parts[0].1 {
            Some(_) => Some(ops::concatenate(
                &parts.iter().map(|p| p.1.as_ref().context("bias on some experts only")).collect::<Result<Vec<_>>>()?,
                0,
            )?),
            None => None,
        };
        Ok(SwitchLinear(weight, bias))
    };
    if experts.len() == 1 {
        let e = &experts[0];
        let clone = |l: &SwitchLinear| SwitchLinear(l.0.clone(), l.1.clone());
        return Ok(SwitchGlu { gate: clone(&e.gate), up: clone(&e.up), down: clone(&e.down), activation: e.activation });
    }
    Ok(SwitchGlu { gate: cat(|e| &e.gate)?, up: cat(|e| &e.up)?, down: cat(|e| &e.down)?, activation: experts[0].activation })
}
