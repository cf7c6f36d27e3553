//! Which layers each rank holds: contiguous runs in order, sized in proportion to what each
//! rank's memory budget leaves for layers (rank 0 first pays for the embedding and head),
//! as exo splits by memory. Pure arithmetic, computed on every rank from the same inputs
//! (the budgets are gathered over the ring), so every rank arrives at the same plan.
use std::ops::Range;

use anyhow::{bail, Result};

use crate::registry::budget::human;

/// `layer_bytes[i]`: layer i's weights as held; `ends_bytes`: the embedding, final norm and
/// head (on rank 0); `budgets[r]`: what rank r may hold. Every rank gets at least one layer.
pub fn split(layer_bytes: &[u64], ends_bytes: u64, budgets: &[u64]) -> Result<Vec<Range<usize>>> {
    let (layers, ranks) = (layer_bytes.len(), budgets.len());
    if ranks == 0 || layers < ranks {
        bail!("{layers} layers cannot be split over {ranks} ranks (each holds at least one)");
    }
    let total: u64 = layer_bytes.iter().sum::<u64>() + ends_bytes;
    let room: Vec<u64> = budgets.iter().enumerate().map(|(r, &b)| if r == 0 { b.saturating_sub(ends_bytes) } else { b }).collect();
    let all_room: u64 = room.iter().sum();
    if all_room + ends_bytes < total || room[0] == 0 {
        bail!(
            "the model's weights ({}) do not fit the ranks' budgets together ({}; rank 0 also holds the embedding and head, {})",
            human(total),
            human(budgets.iter().sum()),
            human(ends_bytes)
        );
    }
    // Each rank's share of the layers' bytes, in proportion to its room: walk the layers
    // and close a rank's run once it reaches its cumulative share (leaving one layer for
    // each rank after it).
    let layers_total: u64 = layer_bytes.iter().sum();
    let mut plan = Vec::with_capacity(ranks);
    let (mut start, mut cum_room, mut cum_bytes) = (0usize, 0u128, 0u64);
    for (r, &rm) in room.iter().enumerate() {
        cum_room += rm as u128;
        let target = (layers_total as u128 * cum_room / all_room.max(1) as u128) as u64;
        let last_allowed = layers - (ranks - r - 1);
        let mut end = start + 1;
        cum_bytes += layer_bytes[start];
        while end < last_allowed && (r == ranks - 1 || cum_bytes + layer_bytes[end] / 2 <= target) {
            cum_bytes += layer_bytes[end];
            end += 1;
        }
        let held: u64 = layer_bytes[start..end].iter().sum::<u64>() + if r == 0 { ends_bytes } else { 0 };
        if held > budgets[r] {
            bail!("rank {r} would hold {} of layers {start}..{end}, over its budget of {}", human(held), human(budgets[r]));
        }
        plan.push(start..end);
        start = end;
    }
    Ok(plan)
}

/// Tensor parallel: every rank holds an equal share of every layer (rank 0 also the ends);
/// an error names the first rank whose share exceeds its budget.
pub fn check_shares(layer_bytes: &[u64], ends_bytes: u64, budgets: &[u64]) -> Result<()> {
    let share = layer_bytes.iter().sum::<u64>() / budgets.len().max(1) as u64;
    for (r, &budget) in budgets.iter().enumerate() {
        let held = share + if r == 0 { ends_bytes } else { 0 };
        if held > budget {
            bail!(
                "rank {r} would hold {} (1/{} of every layer{}), over its budget of {}",
                human(held),
                budgets.len(),
                if r == 0 { " and the ends" } else { "" },
                human(budget)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_shares_are_checked_against_each_budget() {
        assert!(check_shares(&[300; 3], 100, &[400, 300, 300]).is_ok());
        let e = check_shares(&[300; 3], 100, &[399, 300, 300]).unwrap_err().to_string();
        assert!(e.contains("rank 0 would hold") && e.contains("and the ends"), "{e}");
        let e = check_shares(&[300; 3], 0, &[900, 900, 299]).unwrap_err().to_string();
        assert!(e.contains("rank 2 would hold"), "{e}");
    }

    #[test]
    fn equal_budgets_split_evenly_with_rank_0_paying_for_the_ends() {
        // 30 layers of 4 MB, ends 28 MB (SmolLM2-135M's shape, packed), ample budgets.
        let layers = vec![4 << 20; 30];
        assert_eq!(split(&layers, 28 << 20, &[8 << 30, 8 << 30]).unwrap(), vec![0..15, 15..30]);
        // Tight budgets (88 MB each): rank 0's room after the ends is 60 MB of 148, so it
        // takes 12 layers (48 MB + 28 MB of ends), rank 1 the other 18 (72 MB).
        assert_eq!(split(&layers, 28 << 20, &[88 << 20, 88 << 20]).unwrap(), vec![0..12, 12..30]);
    }

    #[test]
    fn budgets_weigh_the_split_and_every_rank_holds_a_layer() {
        let layers = vec![1u64 << 30; 8];
        assert_eq!(split(&layers, 0, &[16 << 30, 48 << 30]).unwrap(), vec![0..2, 2..8]);
        assert_eq!(split(&layers, 0, &[1 << 40, 1 << 30, 1 << 30]).unwrap(), vec![0..6, 6..7, 7..8]);
        assert_eq!(split(&[5, 5, 5], 0, &[10, 10, 10]).unwrap(), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn refusals_say_why() {
        let e = split(&[1, 1], 0, &[10, 10, 10]).unwrap_err().to_string();
        assert!(e.contains("2 layers cannot be split over 3 ranks"), "{e}");
        let e = split(&[100; 4], 50, &[100, 100]).unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
        let e = split(&[100; 4], 0, &[350, 60]).unwrap_err().to_string();
        assert!(e.contains("rank 1 would hold"), "{e}");
    }
}
