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
/// One pass for the normalizer and one for the best (per token and row of a batch, so
/// neither sorts nor allocates the vocabulary: together ~0.4 ms a token before, on the
/// engine's thread).
pub fn compute(logits: &[f32], temperature: f32, chosen: u32, top: usize) -> TokenLogprobs {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_norm = max / t + exp_sum(logits, max, t).ln() as f32;
    let lp = |id: u32| logits[id as usize] / t - log_norm;
    TokenLogprobs { id: chosen, logprob: lp(chosen), top: best(logits, top).into_iter().map(|i| (i, lp(i))).collect() }
}

/// `Σ e^((l - max) / t)` over the finite logits, summed in float64 (49k+ terms, most of
/// them tiny): eight at a time where the CPU has AVX2 and FMA (the exponential within 2 ulp
/// of libm's float32 one), else one at a time in float64.
fn exp_sum(logits: &[f32], max: f32, t: f32) -> f64 {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if super::cpu_backend::simd::available() {
        // SAFETY: AVX2 and FMA detected just now.
        return unsafe { super::cpu_backend::simd::exp_sum(logits, max, t) };
    }
    logits.iter().filter(|l| l.is_finite()).map(|&l| (((l - max) / t) as f64).exp()).sum()
}

/// The `top` largest finite logits' ids, largest first (ties: the lower id first), from
/// one scan that keeps the best so far in order: an insertion costs up to `top` moves, a
/// few for the API's at most 20 (`inference::run` refuses more).
fn best(logits: &[f32], top: usize) -> Vec<u32> {
    let mut best: Vec<u32> = Vec::with_capacity(top.min(logits.len()) + 1);
    if top == 0 {
        return best;
    }
    for (i, &l) in logits.iter().enumerate() {
        // Full: only a logit above the worst kept gets in (an equal one has a higher id).
        if !l.is_finite() || (best.len() == top && l <= logits[best[top - 1] as usize]) {
            continue;
        }
        // After every kept logit >= l: equal logits keep their ids' order.
        let at = best.partition_point(|&b| logits[b as usize] >= l);
        best.insert(at, i as u32);
        best.truncate(top);
    }
    best
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

    /// The scan's best against a full sort (ties by id), and the normalizer against
    /// float64's, at the default model's vocabulary size with masked tokens and ties.
    #[test]
    fn the_best_and_the_normalizer_match_a_full_sort_and_float64() {
        let mut state = 0x2545_f491u32;
        let mut logits: Vec<f32> = (0..49_152)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                // Quantized to 1/8: many exact ties.
                ((state >> 8) % 400) as f32 / 8.0 - 25.0
            })
            .collect();
        for i in (0..logits.len()).step_by(97) {
            logits[i] = f32::NEG_INFINITY;
        }
        logits[49_151] = f32::NAN;
        let mut sorted: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        sorted.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
        for top in [1, 5, 20] {
            assert_eq!(best(&logits, top), sorted[..top], "top {top}");
        }
        assert_eq!(best(&[1.0, f32::NEG_INFINITY, 2.0], 5), vec![2, 0], "fewer finite logits than asked");
        // The whole vocabulary (NaN last), and a length with a last partial eight.
        for len in [logits.len(), logits.len() - 3] {
            let finite: Vec<f32> = logits[..len].iter().copied().filter(|l| l.is_finite()).collect();
            let max = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for t in [1.0f32, 0.7] {
                let want: f64 = finite.iter().map(|&l| ((l as f64 - max as f64) / t as f64).exp()).sum();
                let got = exp_sum(&logits[..len], max, t);
                assert!((got / want - 1.0).abs() < 1e-6, "{len} logits, t {t}: {got} vs float64 {want}");
            }
        }
    }
}
