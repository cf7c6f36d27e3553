//! Rotary position embedding frequencies for the scaled variants: Llama 3's, GGUF's factors,
//! YaRN's.
use super::config::Llama3RopeScaling;

/// MLX's `fast::rope` takes per-pair periods ("freqs"): `base^(2i/dims)`, scaled per
/// Llama 3's rule (long wavelengths stretched by `factor`, a smooth blend in between).
pub fn llama3_periods(dims: i32, base: f32, s: &Llama3RopeScaling) -> Vec<f32> {
    let low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    (0..dims / 2)
        .map(|i| {
            let period = base.powf(2.0 * i as f32 / dims as f32);
            let wavelen = 2.0 * std::f32::consts::PI * period;
            if wavelen > low_freq_wavelen {
                period * s.factor
            } else if wavelen < high_freq_wavelen {
                period
            } else {
                let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                period / ((1.0 - smooth) / s.factor + smooth)
            }
        })
        .collect()
}

/// GGUF stores Llama 3 scaling as `rope_freqs.weight`, a factor that divides each pair's
/// frequency (llama.cpp: theta = pos * base^(-2i/d) / factor[i]).
pub fn gguf_periods(dims: i32, base: f32, factors: &[f32]) -> Vec<f32> {
    (0..dims / 2).map(|i| base.powf(2.0 * i as f32 / dims as f32) * factors.get(i as usize).copied().unwrap_or(1.0)).collect()
}

/// YaRN as mlx-lm's `YarnRoPE` computes it: per-pair periods blending interpolation
/// (`factor` × the period) for long wavelengths with extrapolation for short ones over the
/// correction range `beta_fast`..`beta_slow`, and the attention factor q and k are scaled by.
pub fn yarn(dims: i32, base: f32, s: &YarnScaling) -> (Vec<f32>, f32) {
    let d = dims as f64;
    let correction_dim = |rotations: f64| {
        d * (s.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (base as f64).ln())
    };
    let low = correction_dim(s.beta_fast).floor().max(0.0);
    let mut high = correction_dim(s.beta_slow).ceil().min(d - 1.0);
    if low == high {
        high += 0.001;
    }
    let periods = (0..dims / 2)
        .map(|i| {
            let extra = (base as f64).powf(2.0 * i as f64 / d) as f32;
            let inter = s.factor as f32 * extra;
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0) as f32;
            let mask = 1.0 - ramp;
            inter * extra / (inter * mask + extra * (1.0 - mask))
        })
        .collect();
    let m = |mscale: f64| if s.factor <= 1.0 { 1.0 } else { 0.1 * mscale * s.factor.ln() + 1.0 };
    (periods, (m(s.mscale) / m(s.mscale_all_dim)) as f32)
}

/// `rope_scaling` of type `yarn`, with mlx-lm's defaults.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct YarnScaling {
    pub factor: f64,
    #[serde(default = "four_k")]
    pub original_max_position_embeddings: f64,
    #[serde(default = "thirty_two")]
    pub beta_fast: f64,
    #[serde(default = "one")]
    pub beta_slow: f64,
    #[serde(default = "one")]
    pub mscale: f64,
    #[serde(default)]
    pub mscale_all_dim: f64,
}
fn four_k() -> f64 {
    4096.0
}
fn thirty_two() -> f64 {
    32.0
}
fn one() -> f64 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_stretches_only_long_wavelengths() {
        let s = Llama3RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 };
        let p = llama3_periods(128, 500000.0, &s);
        assert_eq!(p.len(), 64);
        assert_eq!(p[0], 1.0); // highest frequency untouched
        let unscaled = 500000f32.powf(126.0 / 128.0);
        assert!((p[63] / unscaled - 8.0).abs() < 1e-4, "lowest frequency scaled by factor");
        assert!(p.windows(2).all(|w| w[1] >= w[0]), "periods stay monotonic through the blend");
    }

    #[test]
    fn gguf_factors_multiply_periods() {
        let p = gguf_periods(4, 10000.0, &[1.0, 2.0]);
        assert_eq!(p, vec![1.0, 100.0 * 2.0]);
    }
}
