//! A rank past 0 (`mlxbar serve --hostfile F --rank N`, N > 0): no HTTP server; it loads
//! its layers and replays rank 0's ops on them until rank 0 stops (exit 0) or the ring
//! fails (an error: the process exits, as the cluster cannot go on without it). With
//! `--on-rank-lost rejoin` it restarts instead, either way, and waits for the cluster to
//! form again ([`super::rejoin`]).
use anyhow::{Context, Result};

use super::{join_and_load, ClusterSpec};
use crate::config::Config;
use crate::engine::{cpu_backend, DeviceKind};
use crate::registry::budget::Budget;

pub fn run(spec: &ClusterSpec, config: &Config) -> Result<()> {
    let joined = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let result = follow(spec, config, &joined);
    let joined = joined.load(std::sync::atomic::Ordering::Relaxed);
    match &result {
        Ok(()) => spec.rejoin("rank 0 stopped", true),
        // Before the cluster formed, only what a restart can cure (not another model, a
        // refusal or a missing backend, which would fail the same way for ever).
        Err(e) if joined || super::rejoin::curable(e) => spec.rejoin(&format!("{e:#}"), joined),
        Err(_) => {}
    }
    result
}

/// Joins, loads and follows rank 0 until it stops or the ring fails; `joined` set once
/// the cluster formed.
fn follow(spec: &ClusterSpec, config: &Config, joined: &std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
    if let Some(why) = &spec.rejoining {
        tracing::info!("rank {}: restarted to rejoin the cluster after: {why}", spec.rank);
    }
    let path = match &config.model {
        Some(p) => p.clone(),
        None => crate::model_store::ensure_default_model()?,
    };
    // MLX's limits as `serve` sets them; this rank may hold up to the budget's ceiling.
    let total = crate::telemetry::memory::read().map(|m| m.total).unwrap_or(0);
    let budget = Budget::install(config, total, None);
    cpu_backend::install();
    mlx_rs::Device::set_default(&match DeviceKind::for_this_platform() {
        DeviceKind::Gpu => mlx_rs::Device::gpu(),
        DeviceKind::Cpu => mlx_rs::Device::cpu(),
    });
    tracing::info!("rank {} of {}: joining the ring to serve {}", spec.rank, spec.size(), path.display());
    let id = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let part = join_and_load(spec, &path, &id, config.weight_format, budget.ceiling, 0, &|_| {})?;
    joined.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut exec, _, info, link) = part.into_executor();
    let mut link = link.context("rank 0 serves; it does not follow")?;
    // The next rank lost: the news went on towards rank 0; this rank cannot go on either.
    let rank = spec.rank;
    let me = spec.clone();
    link.watch(move |what| {
        tracing::error!("rank {rank}: the cluster lost {what}");
        me.rejoin(&format!("the cluster lost {what}"), true);
        std::process::exit(1);
    })?;
    tracing::info!("rank {}: layers {:?} loaded ({} MB); following rank 0", spec.rank, exec.model.slice.layers, info.weight_bytes >> 20);
    // This rank's own failure (a step, a mismatch with rank 0): rank 0 hears why.
    if let Err(e) = exec.follow(&mut link) {
        link.tell_lost(&format!("rank {rank} ({}): {e:#}", link.hosts()[rank]));
        return Err(e);
    }
    tracing::info!("rank {}: rank 0 stopped; exiting", spec.rank);
    Ok(())
}
