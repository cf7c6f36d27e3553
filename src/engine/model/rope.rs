//! Rotary position embedding frequencies for the scaled variants.
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
