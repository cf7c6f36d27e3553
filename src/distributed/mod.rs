//! One model served by several processes (several Macs, when it does not fit one) on MLX's
//! own distributed layer, as `mlx.launch` with mlx-lm's server and exo do: the ring
//! backend over TCP, ranks and addresses from MLX's host file ([`hostfile`]).
//!
//! Two ways to split it ([`Parallel`]). Tensor parallel (llama-style layers): every rank
//! holds a share of every layer's heads and MLP units ([`crate::engine::model::shard`]);
//! rank 0 hands each pass's embedded input round the ring and all ranks run the pass
//! together, adding up their partial outputs with `all_sum` twice a layer.
//!
//! Pipeline parallel: each rank holds a contiguous run of layers ([`plan`]: in proportion
//! to each rank's memory budget); rank 0 also holds the embedding, final norm and head,
//! serves HTTP and schedules. Its executor ([`crate::engine::executor`]) sends each model
//! pass down the ring with the KV-state ops ahead of it ([`link`]); every other rank
//! replays them on its layers ([`follow`]) and the last hands the hidden states back to
//! rank 0. So batching, the prefix cache, constrained decoding and cancellation work as on
//! one process: they all happen on rank 0, and the others only see ops.
//!
//! Starting: every rank loads its part after a handshake over the ring ([`join_and_load`]):
//! each says what it can hold and which model it read, and all compute the same plan.
pub mod doorbell;
pub mod follower;
pub mod group;
pub mod hostfile;
pub mod launch;
pub mod link;
pub mod plan;
pub mod rejoin;
pub mod report;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mlx_rs::Array;

use crate::engine::executor::Executor;
use crate::engine::model::quantized::QuantSpec;
use crate::engine::model::shard::Shard;
use crate::engine::model::{config::ModelConfig, Model, Slice, TensorMap, WeightFormat};
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::{loader, ModelInfo, TextCodec};
use doorbell::Doorbell;
use group::Group;
use hostfile::Hostfile;
use link::Link;

/// This process's part in a cluster (`mlxbar serve --hostfile F --rank N`).
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub hosts: Hostfile,
    pub rank: usize,
    /// The ring's first port ([`hostfile::RING_PORT`] by default).
    pub ring_port: u16,
    /// How long joining the ring may take (every rank started and reachable).
    pub join_timeout: std::time::Duration,
    /// How long rank 0 waits for a pass to come back round the ring (a rank that hangs
    /// while its socket stays open would otherwise hold every request forever).
    pub pass_timeout: std::time::Duration,
    pub parallel: Parallel,
    /// Exit or restart to rejoin once the cluster is lost ([`rejoin`]).
    pub on_lost: rejoin::OnRankLost,
    /// Why this process was restarted to rejoin (none: started by hand or by the launcher),
    /// and how many restarts in a row found no cluster.
    pub rejoining: Option<String>,
    pub tries: u32,
}

/// How the ranks split the model (`--parallel`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Parallel {
    /// Tensor where the model's layers allow it (llama-style, heads divisible by the
    /// ranks), else pipeline; as mlx-lm's server chooses.
    #[default]
    Auto,
    /// Each rank a contiguous run of layers: any architecture, hidden states cross each
    /// link once a pass.
    Pipeline,
    /// Each rank a share of every layer's heads and MLP units: two all_sums a layer.
    Tensor,
}

impl ClusterSpec {
    /// This rank of the host file at `hostfile`, its ring from `ring_port`; joining within
    /// `join_timeout`, each pass back within `pass_timeout`.
    pub fn new(
        hostfile: &Path,
        rank: usize,
        ring_port: u16,
        [join_timeout, pass_timeout]: [Duration; 2],
        parallel: Parallel,
        on_lost: rejoin::OnRankLost,
    ) -> Result<ClusterSpec> {
        let hosts = Hostfile::read(hostfile)?;
        if rank >= hosts.hosts.len() {
            bail!("--rank {rank}: the host file names {} ranks (0..{})", hosts.hosts.len(), hosts.hosts.len() - 1);
        }
        hosts.backend_env(rank, ring_port)?;
        // Read (and cleared) before any thread starts; only a rejoining rank has them.
        let (rejoining, tries) = rejoin::take_reason();
        Ok(ClusterSpec { hosts, rank, ring_port, join_timeout, pass_timeout, parallel, on_lost, rejoining, tries })
    }

    pub fn size(&self) -> usize {
        self.hosts.hosts.len()
    }

    /// The cluster is lost (`why`): with `--on-rank-lost rejoin`, restarts this process to
    /// join again (returns only if it does not: asked to stop, or the restart failed);
    /// `joined`: whether this process had formed the cluster (callers restart one that had
    /// not only for a [`rejoin::NotFormed`] failure). With `exit`, returns at once.
    pub fn rejoin(&self, why: &str, joined: bool) {
        if self.on_lost != rejoin::OnRankLost::Rejoin {
            return;
        }
        // The advice for --on-rank-lost exit ("restart every rank") is this rank's to follow;
        // a restart that did not form the cluster goes on saying what was lost first.
        let why = why.trim_end_matches("; restart every rank");
        let why = match (&self.rejoining, joined) {
            (Some(first), false) => {
                tracing::warn!("the cluster did not form again: {why}");
                first.as_str()
            }
            _ => why,
        };
        rejoin::restart(why, joined, self.tries);
    }

    /// Points MLX's backend at this rank: writes the file it reads (the ring's addresses
    /// or jaccl's devices; user-only, in `dir`) and sets the variables naming it, `MLX_RANK`
    /// and the host file's `envs`. Call before the process starts threads (the environment
    /// is process-wide).
    pub fn export_env(&self, dir: &Path) -> Result<PathBuf> {
        crate::private_fs::create_dir_all(dir)?;
        let env = self.hosts.backend_env(self.rank, self.ring_port)?;
        let (var, name, contents) = env.file;
        let path = dir.join(name);
        crate::private_fs::write_atomic(&path, contents.as_bytes())?;
        // jaccl reads its own names before MLX's: none inherited may point elsewhere.
        for stale in ["JACCL_RANK", "JACCL_COORDINATOR", "JACCL_IBV_DEVICES", "JACCL_RING", "MLX_JACCL_RING"] {
            std::env::remove_var(stale);
        }
        for (name, value) in env.vars {
            std::env::set_var(name, value);
        }
        std::env::set_var(var, &path);
        Ok(path)
    }
}

/// What every rank says in the handshake: its budget, rank 0's prefix cache budget, its
/// host's cores, and the model it read and how to split it (from [`MODEL`] on).
const HELLO: usize = 13;
const CORES: usize = 2;
const MODEL: usize = 3;

/// A rank's part, loaded, and its link to the others.
pub struct Joined {
    pub model: Model,
    pub codec: TextCodec,
    pub info: ModelInfo,
    pub link: Link,
    /// The prefix cache's budget for the whole model (rank 0's): every rank's prefix cache
    /// decides as rank 0's does ([`crate::engine::prefix_cache::PrefixCache::with_share`]).
    pub prefix_bytes: usize,
}

/// Joins the ring, then loads this rank's part of the model at `path`: every rank reads
/// the file's config and tensor sizes, says what it can hold (`budget` bytes) and which
/// model it read; all check they read the same and compute the same [`plan::split`].
/// `prefix_bytes`: rank 0's prefix cache budget (the others' is ignored).
pub fn join_and_load(
    spec: &ClusterSpec,
    path: &Path,
    id: &str,
    format: WeightFormat,
    budget: u64,
    prefix_bytes: usize,
    progress: &dyn Fn(f64),
) -> Result<Joined> {
    let group = Group::join_within(spec.hosts.backend, spec.join_timeout, spec.size())?;
    let mut prefix = 0;
    let mut tensor = false;
    if (group.rank(), group.size()) != (spec.rank, spec.size()) {
        bail!("MLX's ring says rank {} of {}, the host file rank {} of {}", group.rank(), group.size(), spec.rank, spec.size());
    }
    let ips: Vec<_> = spec.hosts.hosts.iter().map(|h| h.ips[0]).collect();
    let bell = Doorbell::connect(&group, &ips, spec.join_timeout)?;
    let mut handshake = |config: &ModelConfig, tensors: &TensorMap| -> Result<Slice> {
        let (layers, ends) = layer_bytes(config, tensors);
        let mine: [i32; HELLO] = [
            (budget >> 20).min(i32::MAX as u64) as i32,
            (prefix_bytes >> 10).min(i32::MAX as usize) as i32,
            std::thread::available_parallelism().map_or(1, |n| n.get()) as i32,
            config.num_layers as i32,
            config.hidden_size,
            config.vocab_size,
            config.num_heads,
            config.num_kv_heads,
            config.intermediate_size,
            // The same arithmetic everywhere, or the hidden states would not be what the
            // next rank expects: weight format asked, device, and the file's quantization.
            format as i32,
            crate::engine::DeviceKind::for_this_platform() as i32,
            tensors.quantization().map_or(0, |q| q.bits * 1000 + q.group_size),
            spec.parallel as i32,
        ];
        let all = group.all_gather(&Array::from_slice(&mine, &[1, HELLO as i32]))?;
        all.eval().context("the handshake with the other ranks").map_err(rejoin::not_formed)?;
        let all = all.as_slice::<i32>();
        for (rank, hello) in all.chunks(HELLO).enumerate() {
            if hello[MODEL..] != all[MODEL..HELLO] {
                bail!(
                    "rank {rank} runs another model or arithmetic (layers, hidden, vocab, heads, KV heads, MLP, weight format, device, quantization, --parallel: {:?}; rank 0: {:?}): every rank needs the same model file, --weight-format, --parallel and kind of device",
                    &hello[MODEL..],
                    &all[MODEL..HELLO]
                );
            }
        }
        prefix = (all[1].max(0) as usize) << 10;
        let budgets: Vec<u64> = all.chunks(HELLO).map(|h| (h[0].max(0) as u64) << 20).collect();
        let cores: Vec<i32> = all.chunks(HELLO).map(|h| h[CORES]).collect();
        let crowded = crowded_host(&spec.hosts, &cores);
        if tensor_parallel(spec.parallel, config, spec.size(), tensors.quantization(), crowded)? {
            plan::check_shares(&layers, ends, &budgets)?;
            tracing::info!("cluster of {}, tensor parallel: 1/{} of every layer's heads and MLP units a rank (rank 0 also the embedding and head); this is rank {}", spec.size(), spec.size(), spec.rank);
            tensor = true;
            let shard = Shard { rank: spec.rank, of: spec.size() };
            return Ok(Slice { layers: 0..config.num_layers, ends: spec.rank == 0, shard: Some(shard) });
        }
        let plan = plan::split(&layers, ends, &budgets)?;
        tracing::info!(
            "cluster of {}, pipeline parallel: layers {:?} (rank 0 also the embedding and head); this is rank {}",
            plan.len(),
            plan,
            spec.rank
        );
        Ok(Slice { layers: plan[spec.rank].clone(), ends: spec.rank == 0, shard: None })
    };
    let (mut model, codec, info) = loader::load_part(path, id, format, None, progress, &mut handshake)?;
    let group = Rc::new(group);
    if tensor {
        let sum = group.clone();
        model.set_reduce(Rc::new(move |x: &Array| sum.all_sum(x)));
    }
    let hosts = spec.hosts.hosts.iter().map(|h| h.ssh.clone()).collect();
    let link = Link::new(group, bell, hosts, spec.pass_timeout, tensor);
    Ok(Joined { model, codec, info, link, prefix_bytes: prefix })
}

impl Joined {
    /// The executor of this rank's part, with its codec and info. Rank 0's executor sends
    /// each pass down the ring; another rank gets the link back to [`Executor::follow`] it.
    pub fn into_executor(self) -> (Executor, TextCodec, ModelInfo, Option<Link>) {
        let held = self.model.slice.layers.len();
        let prefix = PrefixCache::with_share(self.prefix_bytes, held, self.model.config.num_layers);
        let (mine, theirs) = match self.link.rank() {
            0 => (Some(self.link), None),
            _ => (None, Some(self.link)),
        };
        (Executor::new(self.model, prefix, mine), self.codec, self.info, theirs)
    }
}

/// A host that more ranks share than it has cores, said as why auto avoids tensor parallel
/// there: every token meets two all_sums a layer, and MLX's ring waits in them by spinning,
/// so ranks crowding the cores wait for peers the scheduler has set aside (measured: 3 ranks
/// on 2 cores ran at 1 % of one process's speed).
fn crowded_host(hosts: &Hostfile, cores: &[i32]) -> Option<String> {
    let mut by_ip: std::collections::BTreeMap<_, Vec<usize>> = Default::default();
    for (rank, h) in hosts.hosts.iter().enumerate() {
        by_ip.entry(h.ips[0]).or_default().push(rank);
    }
    by_ip.into_iter().find_map(|(ip, ranks)| {
        let least = ranks.iter().map(|&r| cores.get(r).copied().unwrap_or(1)).min().unwrap_or(1);
        (ranks.len() as i32 > least).then(|| format!("{} ranks share {ip}'s {least} cores", ranks.len()))
    })
}

/// Whether to split `config` by heads over `ranks`: `--parallel tensor` where it cannot is
/// refused, saying why; auto falls back to pipeline, saying why (also where ranks crowd a
/// host's cores: `crowded`).
fn tensor_parallel(
    parallel: Parallel,
    config: &ModelConfig,
    ranks: usize,
    quantization: Option<QuantSpec>,
    crowded: Option<String>,
) -> Result<bool> {
    let refusal = Shard::refusal(config, ranks, quantization);
    if let (Parallel::Auto, None, Some(why)) = (parallel, &refusal, crowded) {
        tracing::info!("pipeline parallel: {why}, and tensor parallel's all_sums spin (--parallel tensor to insist)");
        return Ok(false);
    }
    match (parallel, refusal) {
        (Parallel::Pipeline, _) => Ok(false),
        (Parallel::Tensor, Some(why)) => bail!("--parallel tensor: {why}; use --parallel pipeline, or a number of ranks that divides them"),
        (Parallel::Auto, Some(why)) => {
            tracing::info!("pipeline parallel: {why} (tensor parallel needs that)");
            Ok(false)
        }
        (_, None) => Ok(true),
    }
}

/// Each layer's weights and the rest's (embedding, norm, head), as stored.
fn layer_bytes(config: &ModelConfig, t: &TensorMap) -> (Vec<u64>, u64) {
    let mut layers = vec![0u64; config.num_layers];
    let mut ends = 0u64;
    let sizes = t.weights.iter().map(|(n, w)| (n, w.nbytes() as u64)).chain(t.vectors.iter().map(|(n, a)| (n, a.nbytes() as u64)));
    for (name, bytes) in sizes {
        match name.strip_prefix("layers.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok()) {
            Some(i) if i < layers.len() => layers[i] += bytes,
            _ => ends += bytes,
        }
    }
    (layers, ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_crowding_a_hosts_cores_are_named() {
        let local = |n: usize| {
            Hostfile::parse(&serde_json::to_string(&vec![serde_json::json!({"ssh": "localhost", "ips": ["127.0.0.1"]}); n]).unwrap())
                .unwrap()
        };
        assert_eq!(crowded_host(&local(3), &[2, 2, 2]).unwrap(), "3 ranks share 127.0.0.1's 2 cores");
        assert_eq!(crowded_host(&local(3), &[8, 8, 8]), None);
        let two_macs = Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]"#).unwrap();
        assert_eq!(crowded_host(&two_macs, &[1, 1]), None);
    }
}
