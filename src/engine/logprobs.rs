//! Log-probabilities of a sampled token and its likeliest alternatives, for `logprobs`.
//!
//! They come from the distribution the token was drawn from: the logits after the grammar
//! mask (forbidden tokens have none) and divided by the temperature (1 when greedy, where
//! the draw itself is an argmax). top-k / top-p truncation is not applied: those cut the
//! candidate list, and reporting their renormalised tail would hide how confident the model
//! was.

/// One generated token's log-probability and the `top` likeliest tokens' (best first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits / temperature` at `chosen`, with the `top` largest entries.
pub fn compute(logits: &[f32], temperature: f32, chosen: u32, top: usize) -> TokenLogprobs {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Sum in f64: 49k+ terms, most of them tiny.
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| (((l - max) / t) as f64).exp()).sum();
    let log_norm = max / t + sum.ln() as f32;
    let lp = |id: u32| logits[id as usize] / t - log_norm;
    let mut best: Vec<u32> = Vec::new();
    if top > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        let k = top.min(idx.len());
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by_logit);
        }
        idx.truncate(k);
        idx.sort_unstable_by(by_logit);
        best = idx;
    }
    TokenLogprobs { id: chosen, logprob: lp(chosen), top: best.into_iter().map(|i| (i, lp(i))).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_with_the_best_first() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY];
        let out = compute(&logits, 1.0, 2, 3);
        let z: f32 = logits[..3].iter().map(|l| l.exp()).sum();
        assert!((out.logprob - (2.0f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        // probabilities sum to one over the allowed tokens; the masked one is never listed
        let total: f32 = out.top.iter().map(|t| t.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(compute(&logits, 1.0, 1, 20).top.len(), 3);
    }

    #[test]
    fn temperature_sharpens() {
        let logits = [1.0f32, 2.0];
        assert!(compute(&logits, 0.5, 1, 0).logprob > compute(&logits, 1.0, 1, 0).logprob);
        // greedy reports the model's own distribution
        assert_eq!(compute(&logits, 0.0, 1, 0).logprob, compute(&logits, 1.0, 1, 0).logprob);
    }
}
