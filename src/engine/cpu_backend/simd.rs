//! Small x86 SIMD helpers the CPU kernels share: a horizontal sum, a vectorized `exp`
//! (attention's softmax, SwiGLU's sigmoid, the sampler's weights, logprobs' normalizer),
//! and the fused prologues' row arithmetic: SwiGLU's `silu(gate) · up` and RMS norm's sum
//! of squares. Each caller checks [`available`] first and keeps a portable form.
use std::arch::x86_64::*;

/// Whether this CPU runs the helpers here (AVX2 and FMA; std caches the detection).
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// The sum of a vector's eight lanes.
///
/// # Safety
/// AVX is available (the callers' `#[target_feature]` entry points enable AVX2).
#[inline(always)]
pub unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `e^x` per lane, Cephes' `expf`: `x = n·ln 2 + f` with |f| <= ln 2 / 2, a degree-5
/// polynomial for `e^f`, `2^n` built in the exponent bits. Within 2 ulp of libm's over
/// [-87.3, 88.3]; below, it gives `e^-87.3` (~1e-38, where float32's normal range ends);
/// above, `+inf` once `n` reaches 128 (the input is held at 88.7 so that `n` goes no
/// further: `2^n`'s exponent bits would wrap). NaN in, NaN out.
///
/// # Safety
/// AVX2 and FMA are available (the callers' `#[target_feature]` entry points enable them).
#[inline(always)]
pub unsafe fn exp(x: __m256) -> __m256 {
    // max/min return their second operand when either is NaN: the input is kept as the
    // second so a NaN reaches the result.
    let x = _mm256_min_ps(_mm256_set1_ps(88.7), _mm256_max_ps(_mm256_set1_ps(-87.3), x));
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), f);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.0));
    // A NaN's n converts to i32::MIN; its exponent bits are then garbage, but y is NaN.
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
}

/// `out = silu(gate) · up = gate / (1 + e^-gate) · up`, eight values at a time (a last
/// partial eight through a zero-padded copy, so every value takes the same arithmetic
/// wherever it sits in the row).
///
/// # Safety
/// AVX2 and FMA are available.
///
/// # Panics
/// If the three slices differ in length.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == out.len() && up.len() == out.len());
    let body = out.len() - out.len() % 8;
    for c in (0..body).step_by(8) {
        let v = silu_mul8(_mm256_loadu_ps(gate.as_ptr().add(c)), _mm256_loadu_ps(up.as_ptr().add(c)));
        _mm256_storeu_ps(out.as_mut_ptr().add(c), v);
    }
    if body < out.len() {
        let (mut g, mut u, mut o) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        let tail = out.len() - body;
        g[..tail].copy_from_slice(&gate[body..]);
        u[..tail].copy_from_slice(&up[body..]);
        _mm256_storeu_ps(o.as_mut_ptr(), silu_mul8(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())));
        out[body..].copy_from_slice(&o[..tail]);
    }
}

/// `Σ x²` (RMS norm's), in eight lanes of four chains each (a row's values are independent
/// multiply-adds, where one chain of dependent adds waits on each), the lanes summed at the
/// end, a last partial eight in order.
///
/// # Safety
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn sum_of_squares(x: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut chunks = x.chunks_exact(32);
    for c in &mut chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            let v = _mm256_loadu_ps(c.as_ptr().add(8 * i));
            *a = _mm256_fmadd_ps(v, v, *a);
        }
    }
    let mut rest = chunks.remainder().chunks_exact(8);
    for c in &mut rest {
        let v = _mm256_loadu_ps(c.as_ptr());
        acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    rest.remainder().iter().fold(hsum(sum), |s, v| s + v * v)
}

/// `out[i] = e^((logits[i] - max) / temperature)` eight values at a time (a last partial
/// eight through a padded copy), and their sum: the sampler's softmax weights. A weight
/// whose exponent is below `exp`'s range (a grammar's `-inf`, or beyond e^-87.3 of the
/// largest) is exactly 0, as libm's would be for `-inf`: `exp` alone would give it
/// e^-87.3, and a draw could then land on a forbidden token. NaN weighs 0 too.
///
/// # Safety
/// AVX2 and FMA are available.
///
/// # Panics
/// If `out` and `logits` differ in length.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_weights(logits: &[f32], max: f32, temperature: f32, out: &mut [f32]) -> f32 {
    assert_eq!(logits.len(), out.len());
    let (m, t) = (_mm256_set1_ps(max), _mm256_set1_ps(temperature));
    let mut total = _mm256_setzero_ps();
    let body = out.len() - out.len() % 8;
    for c in (0..body).step_by(8) {
        let e = weight8(_mm256_loadu_ps(logits.as_ptr().add(c)), m, t);
        _mm256_storeu_ps(out.as_mut_ptr().add(c), e);
        total = _mm256_add_ps(total, e);
    }
    let mut total = hsum(total);
    if body < out.len() {
        let tail = out.len() - body;
        let o = tail_weights(&logits[body..], m, t);
        out[body..].copy_from_slice(&o[..tail]);
        total += o[..tail].iter().sum::<f32>();
    }
    total
}

/// `Σ e^((logits[i] - max) / temperature)` as [`softmax_weights`] weighs each value
/// (masked and NaN logits weigh 0), summed in float64 lanes: logprobs' normalizer, over
/// tens of thousands of mostly tiny terms.
///
/// # Safety
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_sum(logits: &[f32], max: f32, temperature: f32) -> f64 {
    let (m, t) = (_mm256_set1_ps(max), _mm256_set1_ps(temperature));
    let (mut low, mut high) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let body = logits.len() - logits.len() % 8;
    for c in (0..body).step_by(8) {
        let e = weight8(_mm256_loadu_ps(logits.as_ptr().add(c)), m, t);
        low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    let mut lanes = [0f64; 4];
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(low, high));
    let mut total = lanes.iter().sum::<f64>();
    if body < logits.len() {
        total += tail_weights(&logits[body..], m, t).iter().map(|&w| w as f64).sum::<f64>();
    }
    total
}

/// [`weight8`] of a last partial eight (`tail`, fewer than eight logits), padded with
/// `-inf`, which weighs exactly 0.
#[inline(always)]
unsafe fn tail_weights(tail: &[f32], max: __m256, temperature: __m256) -> [f32; 8] {
    let mut l = [f32::NEG_INFINITY; 8];
    l[..tail.len()].copy_from_slice(tail);
    let mut o = [0f32; 8];
    _mm256_storeu_ps(o.as_mut_ptr(), weight8(_mm256_loadu_ps(l.as_ptr()), max, temperature));
    o
}

/// Eight lanes of [`softmax_weights`]: 0 where the exponent is below -87.3 or NaN.
#[inline(always)]
unsafe fn weight8(l: __m256, max: __m256, temperature: __m256) -> __m256 {
    let x = _mm256_div_ps(_mm256_sub_ps(l, max), temperature);
    let in_range = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-87.3));
    _mm256_and_ps(exp(x), in_range)
}

/// Eight lanes of [`silu_mul`] (a helper, not a closure: closures inside `#[target_feature]`
/// functions are not inlined, and lose the features).
#[inline(always)]
unsafe fn silu_mul8(g: __m256, u: __m256) -> __m256 {
    let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp` against float64's over the range it claims, and at its edges.
    #[test]
    fn exp_is_within_two_ulp() {
        if !available() {
            return;
        }
        let mut xs: Vec<f32> = (0..200_000).map(|i| -87.3 + 175.6 * i as f32 / 200_000.0).collect();
        // The edges, eight of them (whole registers: none is dropped).
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.3, -87.3, 1.0, -1.0]);
        assert_eq!(xs.len() % 8, 0);
        for chunk in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA detected above.
            unsafe {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn run(x: &[f32], out: &mut [f32; 8]) {
                    _mm256_storeu_ps(out.as_mut_ptr(), exp(_mm256_loadu_ps(x.as_ptr())));
                }
                run(chunk, &mut got);
            }
            for (x, g) in chunk.iter().zip(got) {
                if *x > 88.3 {
                    continue;
                }
                let want = (*x as f64).exp() as f32;
                let ulps = (g.to_bits() as i64 - want.to_bits() as i64).abs();
                assert!(ulps <= 2, "exp({x}) = {g}, want {want}: {ulps} ulp");
            }
        }
    }

    /// Past its range `exp` saturates as it says: `+inf` high, `e^-87.3` low, NaN kept.
    #[test]
    fn exp_saturates() {
        if !available() {
            return;
        }
        let x = [88.5, 100.0, 1e30, f32::INFINITY, -100.0, f32::NEG_INFINITY, f32::NAN, 0.0];
        let mut got = [0f32; 8];
        // SAFETY: AVX2 and FMA detected above.
        unsafe {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run(x: &[f32; 8], out: &mut [f32; 8]) {
                _mm256_storeu_ps(out.as_mut_ptr(), exp(_mm256_loadu_ps(x.as_ptr())));
            }
            run(&x, &mut got);
        }
        assert!(got[..4].iter().all(|g| *g == f32::INFINITY), "{got:?}");
        let low = (-87.3f32 as f64).exp() as f32;
        assert!(got[4..6].iter().all(|g| (g - low).abs() <= 2e-6 * low), "{got:?}");
        assert!(got[6].is_nan() && got[7] == 1.0, "{got:?}");
    }

    /// The sum of squares against float64's, at lengths that leave each kind of remainder.
    #[test]
    fn sum_of_squares_matches_float64() {
        if !available() {
            return;
        }
        for len in [0, 1, 7, 8, 31, 32, 33, 576, 1536, 1543] {
            let x: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let want: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
            // SAFETY: AVX2 and FMA detected above.
            let got = unsafe { sum_of_squares(&x) } as f64;
            assert!((got - want).abs() <= 1e-6 * want, "{len} values: {got} vs {want}");
        }
    }

    /// The sampler's weights against float64's, at a length with a padded tail; a grammar's
    /// `-inf`, a logit far below the largest, and NaN weigh exactly 0.
    #[test]
    fn softmax_weights_match_float64_and_masked_tokens_weigh_nothing() {
        if !available() {
            return;
        }
        let mut logits: Vec<f32> = (0..1003).map(|i| ((i * 37 % 101) as f32 - 50.0) / 5.0).collect();
        logits[3] = f32::NEG_INFINITY;
        logits[1001] = f32::NEG_INFINITY;
        logits[500] = -1000.0;
        logits[7] = f32::NAN;
        let (max, t) = (10.0f32, 0.7f32);
        let mut out = vec![1f32; logits.len()];
        // SAFETY: AVX2 and FMA detected above.
        let total = unsafe { softmax_weights(&logits, max, t, &mut out) };
        for i in [3, 1001, 500, 7] {
            assert_eq!(out[i].to_bits(), 0, "token {i} ({}) weighs {}", logits[i], out[i]);
        }
        let mut want_total = 0f64;
        for (i, (l, o)) in logits.iter().zip(&out).enumerate() {
            let x = (*l as f64 - max as f64) / t as f64;
            let want = if l.is_nan() { 0.0 } else { x.exp() };
            want_total += want;
            // exp's 2 ulp, and the float32 argument's rounding, which e^x turns into a
            // relative error of |x| ulp.
            let ulps = 4.0 + if x.is_finite() { x.abs() } else { 0.0 };
            assert!((*o as f64 - want).abs() <= ulps * f32::EPSILON as f64 * want + 1e-37, "token {i}: {o} vs {want}");
        }
        assert!((total as f64 - want_total).abs() <= 1e-5 * want_total, "{total} vs {want_total}");
    }

    /// SwiGLU's rows against float64's `g / (1 + e^-g) · u`, a ragged length (the padded
    /// tail) included, and the values where the vectorized `exp` clamps: large gates of
    /// either sign, infinities and NaN.
    #[test]
    fn silu_mul_matches_float64() {
        if !available() {
            return;
        }
        let mut gate: Vec<f32> = (0..4003).map(|i| -30.0 + 60.0 * i as f32 / 4003.0).collect();
        gate.extend([100.0, -100.0, 88.5, -88.5, 1e30, -1e30, 0.0, -0.0, f32::INFINITY, f32::NAN]);
        let up: Vec<f32> = (0..gate.len()).map(|i| 0.5 + (i % 13) as f32 * 0.25 * if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let mut out = vec![0f32; gate.len()];
        // SAFETY: AVX2 and FMA detected above.
        unsafe { silu_mul(&gate, &up, &mut out) };
        for ((g, u), o) in gate.iter().zip(&up).zip(&out) {
            let (g64, u64) = (*g as f64, *u as f64);
            let want = (g64 / (1.0 + (-g64).exp()) * u64) as f32;
            if !want.is_finite() {
                assert!(o.to_bits() == want.to_bits() || o.is_nan() && want.is_nan(), "silu({g}) · {u} = {o}, want {want}");
                continue;
            }
            // Three roundings (exp within 2 ulp, the add, the divide) and the multiply.
            let tolerance = 8.0 * f32::EPSILON * want.abs() + 1e-35;
            assert!((o - want).abs() <= tolerance, "silu({g}) · {u} = {o}, want {want}");
        }
    }
}
