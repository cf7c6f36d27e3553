//! Picks the next token from a logits vector: greedy at temperature 0, otherwise
//! temperature + top-k + top-p (nucleus) with a seedable RNG. Before that, [`Sampler::adjust`]
//! applies OpenAI's logit bias and presence / frequency penalties (over the tokens this
//! sequence generated, not its prompt).
use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = no limit.
    pub top_k: usize,
    pub seed: Option<u64>,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it was generated.
    pub frequency_penalty: f32,
    /// Added to the logits of these tokens.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: vec![],
        }
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// How often each token was generated so far (for the penalties).
    generated: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Sampler { params, rng, generated: HashMap::new() }
    }

    /// Applies the logit bias and the penalties in place.
    pub fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &self.generated {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
    }

    /// Draws the next token and counts it as generated.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let token = self.draw(logits);
        *self.generated.entry(token).or_default() += 1;
        token
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            None => argmax(logits),
            Some((idx, probs)) => self.pick(&idx, &probs),
        }
    }

    /// The candidates and their probabilities (summing to 1) after temperature, top-k and
    /// top-p; None when decoding is greedy.
    fn distribution(&self, logits: &[f32]) -> Option<(Vec<u32>, Vec<f32>)> {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return None;
        }
        // Candidates by descending logit, cut to top-k.
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = if p.top_k == 0 { logits.len() } else { p.top_k.min(logits.len()) };
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by_logit);
            idx.truncate(k);
        }
        // Only the nucleus needs the candidates in order: a full-vocabulary sort costs
        // milliseconds a token, and the draw below does not care about order.
        if p.top_p < 1.0 {
            idx.sort_unstable_by(by_logit);
        }
        // Softmax at temperature, then the smallest prefix with mass >= top_p.
        let max = idx.iter().map(|&i| logits[i as usize]).fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i as usize] - max) / p.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = probs
                .iter()
                .position(|x| {
                    mass += x;
                    mass >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            idx.truncate(keep);
            let total: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        Some((idx, probs))
    }

    /// One of `idx` drawn by its weight in `probs` (which need not sum to 1).
    fn pick(&mut self, idx: &[u32], probs: &[f32]) -> u32 {
        let total: f32 = probs.iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, x) in probs.iter().enumerate() {
            r -= x;
            if r <= 0.0 && *x > 0.0 {
                return idx[i];
            }
        }
        // Rounding left r above 0: the last candidate with any weight.
        probs.iter().rposition(|&x| x > 0.0).map_or(idx[0], |i| idx[i])
    }
}

/// Index of the largest value; the first one on ties, so greedy runs are reproducible.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams { temperature, top_p, top_k, seed: Some(seed), ..Default::default() }
    }

    #[test]
    fn bias_and_penalties_shift_logits() {
        let p = SamplingParams { logit_bias: vec![(2, 5.0)], presence_penalty: 1.0, frequency_penalty: 0.5, ..params(0.0, 1.0, 0, 1) };
        let mut s = Sampler::new(p);
        let mut logits = vec![1.0, 0.0, 0.0];
        s.adjust(&mut logits);
        assert_eq!(logits, vec![1.0, 0.0, 5.0]);
        assert_eq!(s.sample(&logits), 2);
        assert_eq!(s.sample(&logits), 2);
        let mut logits = vec![1.0, 0.0, 0.0];
        s.adjust(&mut logits);
        // token 2 was generated twice: 5 - (1 + 0.5 * 2)
        assert_eq!(logits, vec![1.0, 0.0, 3.0]);
    }

    #[test]
    fn temperature_zero_is_argmax() {
        let mut s = Sampler::new(params(0.0, 1.0, 0, 1));
        assert_eq!(s.sample(&[0.1, 3.0, 2.9, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_limits_choices() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(1.5, 1.0, 3, seed));
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        // top-3 of values 1.8 (i%7==6): only those indices may appear
        assert!(run(7).iter().all(|&t| t % 7 == 6));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // one token holds ~88% of the mass at T=1: top_p 0.5 must always pick it
        let logits = [5.0, 3.0, 0.0, 0.0];
        let mut s = Sampler::new(params(1.0, 0.5, 0, 3));
        assert!((0..200).all(|_| s.sample(&logits) == 0));
        // with top_p 1.0 others appear
        let mut s = Sampler::new(params(1.0, 1.0, 0, 3));
        assert!((0..500).any(|_| s.sample(&logits) != 0));
    }

    /// Unsorted candidates (no nucleus) and a top-k cut both draw each token with its
    /// softmax probability at the temperature, renormalized over the candidates.
    #[test]
    fn draws_follow_the_softmax_at_temperature() {
        let logits = [2.0f32, -1.0, 1.0, 0.0, 1.5];
        for (top_k, seed) in [(0usize, 11u64), (3, 12)] {
            let t = 0.8f32;
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let kept = if top_k == 0 { logits.len() } else { top_k };
            let weights: Vec<f64> =
                (0..logits.len()).map(|i| if order[..kept].contains(&i) { ((logits[i] / t) as f64).exp() } else { 0.0 }).collect();
            let total: f64 = weights.iter().sum();
            let mut s = Sampler::new(params(t, 1.0, top_k, seed));
            let n = 40_000;
            let mut counts = [0usize; 5];
            for _ in 0..n {
                counts[s.sample(&logits) as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let (want, got) = (weights[i] / total, c as f64 / n as f64);
                // 40,000 draws: the standard error of a frequency is at most 0.0025.
                assert!((want - got).abs() < 0.01, "top_k {top_k}, token {i}: drawn {got:.4}, softmax {want:.4}");
            }
        }
    }
}
