//! Small x86 SIMD helpers the CPU kernels share.
use std::arch::x86_64::*;

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
