//! Whether a mixture-of-experts model loads with its experts resident or streamed from disk
//! ([`crate::engine::experts`]), and how big its expert cache is: `expert_cache_bytes`
//! forces streaming with at most that cache; otherwise a model streams only when its
//! weights do not fit the budget and its other weights plus the least useful cache (one
//! token's experts across all sparse layers) do, and the cache then takes the room left.
use super::budget::{parts_as_held, Budget, Need, Plan, Refusal, Resident};
use crate::engine::WeightFormat;
use crate::library::ModelEntry;

/// A load's plan, and the expert cache's bytes when the model streams.
pub struct ExpertPlan {
    pub plan: Plan,
    pub expert_cache: Option<u64>,
}

/// What the load asks of the budget, beside the entry.
pub struct Ask<'a> {
    pub format: WeightFormat,
    pub on_gpu: bool,
    pub available: u64,
    pub residents: &'a [Resident],
    pub pressure_critical: bool,
    /// `expert_cache_bytes` from the config.
    pub cap: Option<u64>,
    /// Processes the model is split over (a cluster's ranks; 1 alone).
    pub ranks: usize,
}

/// Plans `entry`'s load resident, or streamed when `cap` says so or resident does not fit.
/// A refusal's message says when even streaming did not fit.
pub fn plan(budget: &Budget, entry: &ModelEntry, ask: &Ask) -> Result<ExpertPlan, (Refusal, Option<String>)> {
    let mut need = budget.need(entry, ask.format, ask.on_gpu);
    let run = |need: &Need| budget.plan(need, ask.available, ask.residents, ask.pressure_critical);
    if ask.ranks > 1 {
        // This process's part of a cluster (about its share: the ranks' handshake splits the
        // layers by every rank's budget and checks each fits); experts never stream there.
        need.weights /= ask.ranks as u64;
        return run(&need).map(|plan| ExpertPlan { plan, expert_cache: None }).map_err(|r| (r, None));
    }
    let Some(experts) = &entry.experts else {
        return run(&need).map(|plan| ExpertPlan { plan, expert_cache: None }).map_err(|r| (r, None));
    };
    let held = parts_as_held(&experts.parts, ask.format, ask.on_gpu);
    let per_expert = held / experts.count.max(1);
    let streamed = |cache: u64| Need { weights: need.weights.saturating_sub(held) + cache, ..need };
    if let Some(cap) = ask.cap {
        let cache = cap.min(held).max(per_expert);
        return run(&streamed(cache)).map(|plan| ExpertPlan { plan, expert_cache: Some(cache) }).map_err(|r| (r, None));
    }
    match run(&need) {
        Ok(plan) => Ok(ExpertPlan { plan, expert_cache: None }),
        Err(Refusal::Memory { .. }) => {
            let least = (per_expert * experts.per_token).min(held);
            let need = streamed(least);
            match run(&need) {
                Ok(plan) => {
                    // The cache grows into what is left, up to every expert (less one, or
                    // it would be the resident model that did not fit).
                    let cache = (least + plan.spare).min(held.saturating_sub(per_expert)).max(least);
                    Ok(ExpertPlan { plan, expert_cache: Some(cache) })
                }
                Err(r) => {
                    let note = format!(
                        "even with its experts streamed from disk ({} of other weights and an expert cache of {})",
                        super::budget::human(need.weights - least),
                        super::budget::human(least)
                    );
                    Err((r, Some(note)))
                }
            }
        }
        Err(r) => Err((r, None)),
    }
}
