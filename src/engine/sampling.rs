//! Picks the next token from a logits vector: greedy at temperature 0, otherwise
//! temperature + top-k + top-p (nucleus) with a seedable RNG, in time that stays small
//! beside a decode step at a 49,152-token vocabulary (each row of a batched step samples
//! on its own). Before that, [`Sampler::adjust`]
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
            Some(c) => self.pick(&c),
        }
    }

    /// The candidates and their weights after temperature, top-k and top-p; None when
    /// decoding is greedy.
    ///
    /// Without a top-k cut the whole vocabulary is weighed in one pass (a vectorized `exp`
    /// where the CPU has one: a value at a time through libm took 0.36-0.38 ms a token at
    /// 49,152 tokens). The nucleus needs the candidates by descending logit, but only as
    /// far as its mass reaches: the largest 64 are selected and sorted first, then 256,
    /// 1,024, … until it does (sorting the whole vocabulary took 1.6-1.8 ms a token).
    fn distribution(&self, logits: &[f32]) -> Option<Candidates> {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 || logits.is_empty() {
            return None;
        }
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if p.top_k != 0 && p.top_k < logits.len() {
            // The top-k cut, in order for the nucleus.
            let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
            idx.select_nth_unstable_by(p.top_k - 1, by_logit);
            idx.truncate(p.top_k);
            idx.sort_unstable_by(by_logit);
            let max = logits[idx[0] as usize];
            let weights: Vec<f32> = idx.iter().map(|&i| ((logits[i as usize] - max) / p.temperature).exp()).collect();
            let total = sum(&weights);
            let keep = nucleus(&weights, total, p.top_p);
            return Some(Candidates::of(Some(idx), weights, keep));
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut weights = vec![0f32; logits.len()];
        let total = softmax_weights(logits, max, p.temperature, &mut weights);
        if p.top_p >= 1.0 {
            return Some(Candidates { idx: None, weights, total });
        }
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let mut m = 64.min(idx.len());
        loop {
            idx.select_nth_unstable_by(m - 1, by_logit);
            idx[..m].sort_unstable_by(by_logit);
            let top: Vec<f32> = idx[..m].iter().map(|&i| weights[i as usize]).collect();
            let keep = nucleus(&top, total, p.top_p);
            if keep < m || m == idx.len() {
                return Some(Candidates::of(Some(idx), top, keep));
            }
            m = (m * 4).min(idx.len());
        }
    }

    /// One candidate drawn by its weight: the running subtraction skips whole chunks by
    /// their sums before it walks the chunk the draw falls in.
    fn pick(&mut self, c: &Candidates) -> u32 {
        const CHUNK: usize = 256;
        let token = |i: usize| c.idx.as_ref().map_or(i as u32, |idx| idx[i]);
        let mut r = self.rng.random::<f32>() * c.total;
        for (n, chunk) in c.weights.chunks(CHUNK).enumerate() {
            let s = sum(chunk);
            if r > s {
                r -= s;
                continue;
            }
            for (i, x) in chunk.iter().enumerate() {
                r -= x;
                if r <= 0.0 && *x > 0.0 {
                    return token(n * CHUNK + i);
                }
            }
        }
        // Rounding left r above 0: the last candidate with any weight.
        c.weights.iter().rposition(|&x| x > 0.0).map_or(token(0), token)
    }
}

/// What a draw chooses among: tokens `idx` (the whole vocabulary in order when None), each
/// with its weight (`e^((logit - max) / temperature)`, unnormalized), and their total.
struct Candidates {
    idx: Option<Vec<u32>>,
    weights: Vec<f32>,
    total: f32,
}

impl Candidates {
    /// The first `keep` of `idx` and `weights`.
    fn of(idx: Option<Vec<u32>>, mut weights: Vec<f32>, keep: usize) -> Candidates {
        weights.truncate(keep);
        let idx = idx.map(|mut i| {
            i.truncate(keep);
            i
        });
        Candidates { total: sum(&weights), idx, weights }
    }
}

/// How many of `weights` (by descending logit; `total` the whole distribution's weight)
/// the nucleus keeps: the smallest prefix whose probability reaches `top_p`, or all of
/// them when it does not.
fn nucleus(weights: &[f32], total: f32, top_p: f32) -> usize {
    if top_p >= 1.0 {
        return weights.len();
    }
    let mut mass = 0.0;
    weights
        .iter()
        .position(|w| {
            mass += w / total;
            mass >= top_p
        })
        .map_or(weights.len(), |i| i + 1)
}

/// `out[i] = e^((logits[i] - max) / temperature)`, and their sum.
fn softmax_weights(logits: &[f32], max: f32, temperature: f32, out: &mut [f32]) -> f32 {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if super::cpu_backend::simd::available() {
        // SAFETY: AVX2 and FMA detected just now; the function checks the lengths.
        return unsafe { super::cpu_backend::simd::softmax_weights(logits, max, temperature, out) };
    }
    for (o, l) in out.iter_mut().zip(logits) {
        *o = ((l - max) / temperature).exp();
    }
    sum(out)
}

/// `Σ x` in eight running sums (independent adds the compiler vectorizes, where one
/// running sum is a chain of dependent ones).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
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

    /// Whole-vocabulary candidates, a top-k cut and a nucleus (with and without a cut)
    /// each draw a token with its softmax probability at the temperature, renormalized over
    /// the candidates they keep.
    #[test]
    fn draws_follow_the_softmax_at_temperature() {
        let logits = [2.0f32, -1.0, 1.0, 0.0, 1.5];
        for (top_k, top_p, seed) in [(0usize, 1.0f32, 11u64), (3, 1.0, 12), (0, 0.75, 13), (4, 0.9, 14)] {
            let t = 0.8f32;
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let cut = if top_k == 0 { logits.len() } else { top_k };
            let weight = |i: usize| ((logits[i] / t) as f64).exp();
            let total: f64 = order[..cut].iter().map(|&i| weight(i)).sum();
            let mut mass = 0.0;
            let kept = order[..cut]
                .iter()
                .position(|&i| {
                    mass += weight(i) / total;
                    mass >= top_p as f64
                })
                .map_or(cut, |i| i + 1);
            let weights: Vec<f64> = (0..logits.len()).map(|i| if order[..kept].contains(&i) { weight(i) } else { 0.0 }).collect();
            let total: f64 = weights.iter().sum();
            let mut s = Sampler::new(params(t, top_p, top_k, seed));
            let n = 40_000;
            let mut counts = [0usize; 5];
            for _ in 0..n {
                counts[s.sample(&logits) as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let (want, got) = (weights[i] / total, c as f64 / n as f64);
                // 40,000 draws: the standard error of a frequency is at most 0.0025.
                assert!((want - got).abs() < 0.01, "top_k {top_k}, top_p {top_p}, token {i}: drawn {got:.4}, softmax {want:.4}");
            }
        }
    }

    /// A grammar's mask (`-inf` for every forbidden token) leaves the forbidden tokens no
    /// weight at all, and draws land only on the allowed ones, by their softmax: here three
    /// tokens far apart in a real vocabulary's size, so the draw's skipping of whole chunks
    /// maps back to the right token ids.
    #[test]
    fn masked_tokens_weigh_nothing_and_are_never_drawn() {
        let n = 49152usize;
        let allowed = [(1000usize, 1.0f32), (30000, 2.0), (n - 1, 1.5)];
        let mut logits = vec![f32::NEG_INFINITY; n];
        for (i, l) in allowed {
            logits[i] = l;
        }
        let c = Sampler::new(params(1.0, 1.0, 0, 5)).distribution(&logits).unwrap();
        assert!(c.idx.is_none());
        assert!(c.weights.iter().enumerate().all(|(i, w)| allowed.iter().any(|a| a.0 == i) || w.to_bits() == 0));
        let mut s = Sampler::new(params(1.0, 1.0, 0, 5));
        let draws = 20_000;
        let mut counts = [0usize; 3];
        for _ in 0..draws {
            let t = s.sample(&logits) as usize;
            let k = allowed.iter().position(|a| a.0 == t).unwrap_or_else(|| panic!("drew masked token {t}"));
            counts[k] += 1;
        }
        let total: f64 = allowed.iter().map(|a| (a.1 as f64).exp()).sum();
        for (k, (_, l)) in allowed.iter().enumerate() {
            let (want, got) = ((*l as f64).exp() / total, counts[k] as f64 / draws as f64);
            // 20,000 draws: the standard error of a frequency is at most 0.0036.
            assert!((want - got).abs() < 0.015, "token {k}: drawn {got:.4}, softmax {want:.4}");
        }
    }

    /// At a real vocabulary's size the nucleus, found by sorting the largest 64, 256, …
    /// logits until their mass reaches top_p, is the one a full sort finds: the largest
    /// logits in descending order, exactly as many as the float64 mass needs (give or take
    /// one only where that mass lies within 1e-5 of top_p, where float32's sums may round
    /// across it). Flat logits make the search run to the whole vocabulary; the steepest
    /// stops in its first round (17 tokens), the others in later ones.
    #[test]
    fn the_nucleus_grows_until_its_mass_reaches_top_p() {
        let n = 49152usize;
        let cases = [(0.5f32, 0.9f32, 1.0f32), (8.0, 0.9, 1.0), (8.0, 0.95, 0.7), (40.0, 0.5, 1.0), (0.01, 0.99, 1.0), (2000.0, 0.5, 1.0)];
        for (spread, top_p, temperature) in cases {
            // Distinct logits in a shuffled order (7919 is prime to 49,152).
            let logits: Vec<f32> = (0..n).map(|i| (i * 7919 % n) as f32 / n as f32 * spread).collect();
            let c = Sampler::new(params(temperature, top_p, 0, 1)).distribution(&logits).unwrap();
            let got = c.idx.expect("a nucleus lists its tokens");
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let max = logits[order[0]] as f64;
            let weight = |i: usize| ((logits[i] as f64 - max) / temperature as f64).exp();
            let total: f64 = order.iter().map(|&i| weight(i)).sum();
            let mut mass = 0.0;
            let masses: Vec<f64> = order
                .iter()
                .map(|&i| {
                    mass += weight(i) / total;
                    mass
                })
                .collect();
            let want = masses.iter().position(|&m| m >= top_p as f64).map_or(n, |i| i + 1);
            let near = |i: usize| masses.get(i).is_some_and(|m| (m - top_p as f64).abs() < 1e-5);
            let slack = if near(want - 1) || (want >= 2 && near(want - 2)) { 1 } else { 0 };
            assert!(
                got.len().abs_diff(want) <= slack,
                "spread {spread}, top_p {top_p}: kept {} of {n}, float64 {want} (slack {slack})",
                got.len()
            );
            assert!(got.iter().zip(&order).all(|(g, o)| *g as usize == *o), "spread {spread}: not the largest logits in order");
            assert_eq!(c.weights.len(), got.len());
        }
    }
}
