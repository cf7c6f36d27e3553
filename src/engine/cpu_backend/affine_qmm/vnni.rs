//! VNNI's `vpdpbusd` for [`super::avx2`]'s 256-bit kernel: four unsigned-byte × int8
//! products summed into each int32 lane in one instruction, where AVX2 takes three
//! (`maddubs`, an add, `madd`). Unsigned 8-bit weights meet `x` as they are (no shift to
//! signed, no offset term), and 4-bit nibbles go straight in.
//!
//! Two encodings of the same instruction: AVX-VNNI (VEX, Alder Lake, Sapphire Rapids, Zen 5)
//! and AVX512-VNNI with AVX512VL (EVEX, Cascade Lake, Ice Lake, Zen 4), which also gives 32
//! vector registers, room for a tile of eight rows without spilling.
use std::arch::x86_64::*;
use std::ops::Range;

use super::activations::Activations;
use super::avx2::{columns_with, Dot};
use super::{Out, Scale, Weights};

/// `vpdpbusd` in its VEX encoding (AVX-VNNI).
struct AvxVnni;

impl Dot for AvxVnni {
    const TILE: usize = 8;
    const SHIFTED_BYTES: bool = false;
    type Bytes = __m256i;

    #[inline(always)]
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xe), hi, xo)
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn bytes(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x)
    }
}

/// `vpdpbusd` in its EVEX encoding (AVX512-VNNI + AVX512VL), on 256-bit registers.
struct Avx512Vnni;

impl Dot for Avx512Vnni {
    const TILE: usize = 8;
    const SHIFTED_BYTES: bool = false;
    type Bytes = __m256i;

    #[inline(always)]
    unsafe fn nibbles(lo: __m256i, xe: __m256i, hi: __m256i, xo: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xe), hi, xo)
    }

    #[inline(always)]
    unsafe fn prepare_bytes(w: __m256i) -> __m256i {
        w
    }

    #[inline(always)]
    unsafe fn bytes(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    }
}

/// Output columns `columns` of every row with AVX-VNNI.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI are available; `w` and `a` describe the same `k`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn columns_avx_vnni<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    columns_with::<AvxVnni, S>(w, a, out, columns)
}

/// Output columns `columns` of every row with AVX512-VNNI on 256-bit registers.
///
/// # Safety
/// AVX2, FMA, F16C, AVX512F, AVX512VL and AVX512-VNNI are available; `w` and `a` describe the
/// same `k`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub unsafe fn columns_avx512_vnni<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    columns_with::<Avx512Vnni, S>(w, a, out, columns)
}
