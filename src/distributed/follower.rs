//! A rank past 0 (`mlxbar serve --hostfile F --rank N`, N > 0): no HTTP server; it loads
//! its layers and replays rank 0's ops on them until rank 0 stops (exit 0) or the ring
//! fails (an error: the process exits, as the cluster cannot go on without it).
use anyhow::{Context, Result};

use super::{join_and_load, ClusterSpec};
use crate::config::Config;
use crate::engine::{cpu_backend, DeviceKind};
use crate::registry::budget::Budget;

pub fn run(spec: &ClusterSpec, config: &Config) -> Result<()> {
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
    let joined = join_and_load(spec, &path, &id, config.weight_format, budget.ceiling, 0, &|_| {})?;
    let (mut exec, _, info, link) = joined.into_executor();
    let mut link = link.context("rank 0 serves; it does not follow")?;
    // The next rank lost: the news went on towards rank 0; this rank cannot go on either.
    let rank = spec.rank;
    link.watch(move |what| {
        tracing::error!("rank {rank}: the cluster lost {what}; exiting");
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
