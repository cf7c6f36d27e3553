//! A fast CPU matmul for MLX's affine-quantized weights (every mlx-community quantized
//! model, and the GGUF's Q4_0/Q4_1/Q8_0 tensors as MLX loads them): `y = x · dequant(W)ᵀ`
//! with `W` `[n, k]` packed in `uint32`, one scale and bias per group of `group_size`
//! values; 4 or 8 bits, groups of 32, 64 or 128.
//!
//! MLX's own CPU kernel for this is naive and single-threaded. Here the weights stay packed
//! and are unpacked in registers; `x` is quantized to int8 per 32 values once per call
//! ([`activations`], as llama.cpp does for its Q4/Q8 dot products; its rows split across
//! the cores), so a block's dot product is integer multiply-adds; every weight row is read
//! once for all rows of `x`, and the output columns are split across the cores
//! ([`super::pool`]). A row's result does not depend on the other rows of the call, only,
//! where AMX runs, on whether the call has 16 rows or more ([`Kernel::rows_independent`]). On
//! x86_64 the widest instruction set the CPU has is chosen at run time
//! ([`Kernel::detect`]): [`amx`]'s int8 tiles for products of 16 rows or more where the
//! CPU has AMX, [`vnni`]'s `vpdpbusd` (AVX512-VNNI or AVX-VNNI), else [`avx2`]'s
//! `maddubs`; [`scalar`] elsewhere. Where AVX512-VNNI runs without AMX, the model's weights
//! are repacked at load into [`strips`] of sixteen columns, which that kernel reads with the
//! columns in the lanes ([`Weights::strips`] says which layout a weight is in).
//!
//! [`primitive.cpp`](primitive.cpp) makes this an MLX primitive, so it runs inside MLX's
//! lazy graph on the CPU stream like any other op; [`op`] builds it from Rust. Each MLX op
//! costs microseconds of dispatch on the CPU stream, so the primitive also takes what
//! surrounds a projection in a transformer block ([`Fusion`]): an RMS norm or SwiGLU of its
//! input, and the residual added to its output; a decode step runs 4 ops a block instead of
//! 13 for these parts.
pub mod activations;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod op;
mod scalar;
pub mod strips;
#[cfg(target_arch = "x86_64")]
mod vnni;

use std::ops::Range;

use activations::{Activations, Layout};

use super::primitive_call::{self, count, elems};

/// Which kernel this machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AMX's int8 tiles for 16 rows or more (prefill), [`Kernel::Avx512Vnni`] for fewer.
    Amx,
    /// `vpdpbusd`, EVEX-encoded: 4-bit weights four blocks a 512-bit load, 32 registers
    /// (tiles of 8 rows).
    Avx512Vnni,
    /// `vpdpbusd`, VEX-encoded.
    AvxVnni,
    Avx2,
    Scalar,
}

impl Kernel {
    /// The kernels this CPU can run, fastest first (the first is [`kernel`]'s choice).
    pub fn available() -> &'static [Kernel] {
        static AVAILABLE: std::sync::OnceLock<Vec<Kernel>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(Kernel::probe)
    }

    fn probe() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                if amx::available() {
                    kernels.push(Kernel::Amx);
                }
                kernels.push(Kernel::Avx512Vnni);
            }
            if std::arch::is_x86_feature_detected!("avxvnni") {
                kernels.push(Kernel::AvxVnni);
            }
            kernels.push(Kernel::Avx2);
        }
        kernels.push(Kernel::Scalar);
        kernels
    }

    pub fn detect() -> Kernel {
        Kernel::available()[0]
    }

    pub fn describe(self) -> &'static str {
        match self {
            Kernel::Amx => {
                "AMX int8 tiles for 16+ rows (prefill), else AVX512-VNNI (int8 activations, vpdpbusd on 512-bit registers, 8-row tiles)"
            }
            Kernel::Avx512Vnni => "AVX512-VNNI (int8 activations, vpdpbusd on 512-bit registers, weights in 16-column strips, 8-row tiles)",
            Kernel::AvxVnni => "AVX-VNNI (int8 activations, vpdpbusd, 8-row tiles)",
            Kernel::Avx2 => "AVX2+FMA (int8 activations, weights unpacked in registers)",
            Kernel::Scalar => "portable scalar",
        }
    }

    /// Whether a row's result is the same bit for bit however many rows share the call
    /// (not with [`Kernel::Amx`], whose tiles and the VNNI kernel it hands few rows to sum
    /// in different orders).
    pub fn rows_independent(self) -> bool {
        self != Kernel::Amx
    }

    /// Whether a product of `rows` rows runs on AMX's tiles.
    fn tiles(self, rows: usize) -> bool {
        self == Kernel::Amx && rows >= AMX_MIN_ROWS
    }
}

/// Rows and columns of one of AMX's tiles of int32 results (its kernel's tasks take whole
/// strips of this many columns).
pub const AMX_TILE: usize = 16;

/// Rows from which [`Kernel::Amx`] runs a product on the tiles: with fewer, unpacking the
/// weights into tile layout costs more than the rows' products save (at 16 rows a step's
/// projections took 0.7× the VNNI kernel's time, at 8 the same).
pub const AMX_MIN_ROWS: usize = AMX_TILE;

/// Whether the kernel handles these weights.
pub fn supports(bits: i32, group_size: i32) -> bool {
    matches!(bits, 4 | 8) && matches!(group_size, 32 | 64 | 128)
}

/// A weight group's scale or bias as stored. Model files hold them in float16 or bfloat16;
/// widened to float32 they would add half again to a 4-bit matrix's bytes (8 bytes per 16
/// bytes of weights at groups of 32), bytes every decode step reads.
pub trait Scale: Copy + Send + Sync + 'static {
    /// The `scale_type` code primitive.cpp passes for this type.
    const CODE: i32;
    fn to_f32(self) -> f32;
    /// As [`Scale::to_f32`], inside the x86 kernels (their entry points enable F16C).
    ///
    /// # Safety
    /// F16C is available.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn to_f32_f16c(self) -> f32 {
        self.to_f32()
    }
    /// Eight values from `p` as float32 lanes, inside the x86 kernels.
    ///
    /// # Safety
    /// AVX2 and F16C are available; `p` is valid for eight reads.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// The values of the lanes set in `mask` (of four) from `p` as float32 lanes, the rest
    /// zero and not read, inside the AVX-512 kernel.
    ///
    /// # Safety
    /// AVX512F, AVX512VL, AVX512BW and F16C are available; `p` is valid for the masked reads.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load4_masked(p: *const Self, mask: u8) -> std::arch::x86_64::__m128;
    /// The values of the lanes set in `mask` (of sixteen) from `p` as float32 lanes, the
    /// rest zero and not read, inside the AVX-512 kernel.
    ///
    /// # Safety
    /// As [`Scale::load4_masked`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16_masked(p: *const Self, mask: u16) -> std::arch::x86_64::__m512;
}

impl Scale for f32 {
    const CODE: i32 = 0;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load4_masked(p: *const f32, mask: u8) -> std::arch::x86_64::__m128 {
        std::arch::x86_64::_mm_maskz_loadu_ps(mask, p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_masked(p: *const f32, mask: u16) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_maskz_loadu_ps(mask, p)
    }
}

impl Scale for half::f16 {
    const CODE: i32 = 1;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn to_f32_f16c(self) -> f32 {
        use std::arch::x86_64::*;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(self.to_bits() as i32)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load4_masked(p: *const half::f16, mask: u8) -> std::arch::x86_64::__m128 {
        use std::arch::x86_64::*;
        _mm_cvtph_ps(_mm_maskz_loadu_epi16(mask, p as *const i16))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_masked(p: *const half::f16, mask: u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p as *const i16))
    }
}

impl Scale for half::bf16 {
    const CODE: i32 = 2;
    /// bfloat16 is float32's top half.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const half::bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)), 16))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load4_masked(p: *const half::bf16, mask: u8) -> std::arch::x86_64::__m128 {
        use std::arch::x86_64::*;
        _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_maskz_loadu_epi16(mask, p as *const i16)), 16))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16_masked(p: *const half::bf16, mask: u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p as *const i16)), 16))
    }
}

/// A quantized weight matrix as MLX holds it (`transpose = true` layout), or in [`strips`].
pub struct Weights<'a, S: Scale = f32> {
    /// `n × k·bits/32`.
    pub packed: &'a [u32],
    /// `n × k/group_size` each.
    pub scales: &'a [S],
    pub biases: &'a [S],
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    pub bits: u32,
    /// In [`strips`] of sixteen columns (repacked at load for the AVX-512 kernel), not
    /// MLX's rows.
    pub strips: bool,
}

impl<S: Scale> Weights<'_, S> {
    /// Row `j` dequantized into `out` (`k` values): `scale · q + bias` per group in
    /// float32, as MLX's `dequantize` computes it (the same bits).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let (k, gs) = (self.k, self.group_size);
        let (groups, words) = (k / gs, k * self.bits as usize / 32);
        // In strips, the row's words gathered first (`bits` words a block).
        let gathered: Vec<u32>;
        let row = if self.strips {
            let (blocks, per_block) = (k / 32, self.bits as usize);
            gathered = (0..words).map(|i| self.packed[strips::word_at(j, i / per_block, i % per_block, blocks, per_block)]).collect();
            &gathered[..]
        } else {
            &self.packed[j * words..][..words]
        };
        let group = |g: usize| if self.strips { strips::group_at(j, g, groups) } else { j * groups + g };
        for (g, values) in out[..k].chunks_exact_mut(gs).enumerate() {
            let (scale, bias) = (self.scales[group(g)].to_f32(), self.biases[group(g)].to_f32());
            for (i, v) in values.iter_mut().enumerate() {
                *v = scale * scalar::value(row, g * gs + i, self.bits) as f32 + bias;
            }
        }
    }
}

/// A weight whose scales' type is known at run time only (what the primitives hand over:
/// `scale_type` is its [`Scale::CODE`]).
pub enum AnyWeights<'a> {
    F32(Weights<'a, f32>),
    F16(Weights<'a, half::f16>),
    Bf16(Weights<'a, half::bf16>),
}

impl<'a> AnyWeights<'a> {
    /// The weight `[n, k]` from a primitive's buffers, each with the number of elements it
    /// holds (checked here against the shapes: see [`primitive_call::input`]).
    ///
    /// # Panics
    /// On an unknown scale type, an unsupported format, or a buffer shorter than the shapes.
    ///
    /// # Safety
    /// Each buffer is valid for reads of its stated length for `'a`, `scales` and `biases`
    /// of values of the type `scale_type` names.
    pub unsafe fn from_raw(
        (packed, packed_len): (*const u32, i64),
        scales: (*const std::ffi::c_void, i64),
        biases: (*const std::ffi::c_void, i64),
        scale_type: i32,
        strips: bool,
        (n, k, group_size, bits): (usize, usize, usize, usize),
    ) -> AnyWeights<'a> {
        assert!(supports(bits as i32, group_size as i32) && k.is_multiple_of(group_size), "{bits} bits, groups of {group_size}, k {k}");
        assert!(!strips || n.is_multiple_of(strips::STRIP), "strips of 16 columns, not {n}");
        let groups = elems(&[n, k / group_size]);
        let packed = primitive_call::input(packed, packed_len, elems(&[n, k, bits]) / 32, "w");
        /// # Safety
        /// As the caller's, for `S`.
        unsafe fn typed<'a, S: Scale>(
            packed: &'a [u32],
            (s, sl): (*const std::ffi::c_void, i64),
            (b, bl): (*const std::ffi::c_void, i64),
            groups: usize,
            strips: bool,
            (n, k, group_size, bits): (usize, usize, usize, usize),
        ) -> Weights<'a, S> {
            let scales = primitive_call::input(s as *const S, sl, groups, "scales");
            let biases = primitive_call::input(b as *const S, bl, groups, "biases");
            Weights { packed, scales, biases, n, k, group_size, bits: bits as u32, strips }
        }
        let shape = (n, k, group_size, bits);
        match scale_type {
            <f32 as Scale>::CODE => AnyWeights::F32(typed(packed, scales, biases, groups, strips, shape)),
            <half::f16 as Scale>::CODE => AnyWeights::F16(typed(packed, scales, biases, groups, strips, shape)),
            <half::bf16 as Scale>::CODE => AnyWeights::Bf16(typed(packed, scales, biases, groups, strips, shape)),
            other => panic!("unknown scale type {other}"),
        }
    }

    /// [`matmul`] with this weight.
    pub fn matmul(&self, kernel: Kernel, x: &[f32], rows: usize, fusion: Fusion, out: &mut [f32]) {
        match self {
            AnyWeights::F32(w) => matmul(kernel, x, rows, w, fusion, out),
            AnyWeights::F16(w) => matmul(kernel, x, rows, w, fusion, out),
            AnyWeights::Bf16(w) => matmul(kernel, x, rows, w, fusion, out),
        }
    }

    /// Output columns (`n`).
    pub fn n(&self) -> usize {
        match self {
            AnyWeights::F32(w) => w.n,
            AnyWeights::F16(w) => w.n,
            AnyWeights::Bf16(w) => w.n,
        }
    }
}

/// What the product does to its input first and its output last.
#[derive(Clone, Copy, Default)]
pub struct Fusion<'a> {
    pub prologue: Prologue<'a>,
    /// `rows × n`, added to the product.
    pub residual: Option<&'a [f32]>,
}

/// The input's transformation before the product.
#[derive(Clone, Copy, Default)]
pub enum Prologue<'a> {
    #[default]
    None,
    /// `x · rsqrt(mean(x²) + eps) · weight` per row (`weight` has `k` values).
    RmsNorm { weight: &'a [f32], eps: f32 },
    /// `x` is `rows × 2k`, `[gate | up]`: the product takes `silu(gate) · up`.
    SwiGlu,
}

impl Prologue<'_> {
    /// Columns of `x` per row for a product over `k`.
    pub fn input_columns(&self, k: usize) -> usize {
        match self {
            Prologue::SwiGlu => 2 * k,
            _ => k,
        }
    }

    /// One row of `x` (`input_columns(k)` values) transformed into `buf` (`k` values), or
    /// the row itself when it is used as it is.
    fn row<'a>(&self, x: &'a [f32], buf: &'a mut [f32]) -> &'a [f32] {
        match *self {
            Prologue::None => x,
            Prologue::RmsNorm { weight, eps } => {
                rms_norm(x, weight, eps, buf);
                buf
            }
            Prologue::SwiGlu => {
                let (gate, up) = x.split_at(buf.len());
                silu_mul(gate, up, buf);
                buf
            }
        }
    }
}

/// `out = silu(gate) · up`: eight values at a time where the CPU has AVX2 and FMA
/// ([`simd::silu_mul`](super::simd::silu_mul); libm's scalar `exp` was a fifth of an
/// 8-row down projection's time), else one at a time.
fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: AVX2 and FMA detected just now; silu_mul checks the lengths.
        return unsafe { super::simd::silu_mul(gate, up, out) };
    }
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `out = x · rsqrt(mean(x²) + eps) · weight`, MLX's `fast::rms_norm` on one row.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean = sum_of_squares(x) / x.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

/// `Σ x²`: in eight lanes where the CPU has AVX2 and FMA
/// ([`simd::sum_of_squares`](super::simd::sum_of_squares): in order, a row's 576 values
/// are a chain of 576 dependent adds), else in order.
fn sum_of_squares(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: AVX2 and FMA detected just now.
        return unsafe { super::simd::sum_of_squares(x) };
    }
    x.iter().map(|v| v * v).sum()
}

/// The output matrix (`rows × n`, row-major) plus the residual it adds; tasks write
/// disjoint columns.
#[derive(Clone, Copy)]
pub struct Out {
    ptr: *mut f32,
    residual: *const f32,
    n: usize,
}
// SAFETY: tasks only write through `write`, each to its own columns.
unsafe impl Send for Out {}
// SAFETY: as for Send.
unsafe impl Sync for Out {}

impl Out {
    /// # Safety
    /// `(row, col)` is inside the matrix and no other task writes it.
    #[inline]
    pub unsafe fn write(&self, row: usize, col: usize, v: f32) {
        let at = row * self.n + col;
        let r = if self.residual.is_null() { 0.0 } else { *self.residual.add(at) };
        *self.ptr.add(at) = v + r;
    }
}

/// Output columns per task at least (fewer tasks than this cost more than they save).
const MIN_COLUMNS_PER_TASK: usize = 16;

/// `out[rows × n] = prologue(x) · dequant(w)ᵀ + residual`.
///
/// # Panics
/// On inconsistent shapes (checked before anything is read), or a kernel this CPU cannot
/// run.
pub fn matmul<S: Scale>(kernel: Kernel, x: &[f32], rows: usize, w: &Weights<S>, fusion: Fusion, out: &mut [f32]) {
    assert!(Kernel::available().contains(&kernel), "{kernel:?} needs instructions this CPU lacks");
    assert!(supports(w.bits as i32, w.group_size as i32), "{} bits, groups of {}", w.bits, w.group_size);
    let (k, n) = (w.k, w.n);
    assert!(k % w.group_size == 0 && x.len() == rows * fusion.prologue.input_columns(k) && out.len() == rows * n);
    assert!(w.packed.len() == n * k * w.bits as usize / 32);
    assert!(w.scales.len() == n * k / w.group_size && w.biases.len() == w.scales.len());
    if let Prologue::RmsNorm { weight, .. } = fusion.prologue {
        assert!(weight.len() == k);
    }
    assert!(fusion.residual.is_none_or(|r| r.len() == rows * n));
    assert!(!w.strips || kernel == Kernel::Avx512Vnni, "weights in strips run on the AVX512-VNNI kernel only, not {kernel:?}");
    let tiles = kernel.tiles(rows);
    let layout = if tiles { Layout::Tiles } else { Layout::for_bits(w.bits) };
    let a = Activations::new(x, rows, k, w.group_size, layout, fusion.prologue);
    let o = Out { ptr: out.as_mut_ptr(), residual: fusion.residual.map_or(std::ptr::null(), |r| r.as_ptr()), n };
    let tasks = (super::pool::threads() * 4).min(n.div_ceil(MIN_COLUMNS_PER_TASK)).max(1);
    // AMX's tasks take whole strips of columns, and so do weights in strips.
    let per_task = if tiles {
        n.div_ceil(tasks).next_multiple_of(AMX_TILE)
    } else if w.strips {
        n.div_ceil(tasks).next_multiple_of(strips::STRIP)
    } else {
        n.div_ceil(tasks)
    };
    let body = |t: usize| {
        let columns: Range<usize> = t * per_task..((t + 1) * per_task).min(n);
        if columns.is_empty() {
            return;
        }
        // Each SIMD arm: `kernel` is one `Kernel::available` lists (asserted above), which
        // checked its instruction sets; the shapes were checked above.
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AMX granted and AVX512-VNNI's instruction sets detected (Kernel::Amx
            // is listed only then); `a` is in Layout::Tiles (above; asserted there too);
            // shapes checked; tasks own their columns.
            Kernel::Amx if tiles => unsafe { amx::columns(w, &a, o, columns) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as the next arm's; `w` is in strips and `columns` whole strips (the
            // tasks' split above).
            Kernel::Avx512Vnni if w.strips => unsafe { strips::columns(w, &a, o, columns) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX512-VNNI, AVX512VL, AVX512BW, AVX2, FMA and F16C detected (Amx is
            // listed only with them); `a` in Layout::for_bits (above); shapes checked.
            Kernel::Amx | Kernel::Avx512Vnni => unsafe { vnni::columns_avx512_vnni(w, &a, o, columns) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-VNNI, AVX2, FMA and F16C detected; shapes checked.
            Kernel::AvxVnni => unsafe { vnni::columns_avx_vnni(w, &a, o, columns) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2, FMA and F16C detected; shapes checked.
            Kernel::Avx2 => unsafe { avx2::columns_avx2(w, &a, o, columns) },
            _ => scalar::columns(w, &a, o, columns),
        }
    };
    super::pool::for_each(tasks, body);
}

/// Prologue codes shared with primitive.cpp.
pub const PROLOGUE_NONE: i32 = 0;
pub const PROLOGUE_RMS_NORM: i32 = 1;
pub const PROLOGUE_SWIGLU: i32 = 2;

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays, each
/// pointer with the number of elements its buffer holds; `scales` and `biases` hold the
/// [`Scale`] type whose code is `scale_type`; `norm` (k values) is read for
/// [`PROLOGUE_RMS_NORM`]; `residual` may be null.
///
/// # Safety
/// Each pointer is valid for reads (`out`: writes) of the stated number of elements, for
/// the call, and nothing else writes them meanwhile. Shapes are not trusted: every slice is
/// checked against its buffer's length first ([`primitive_call::input`]).
#[no_mangle]
pub unsafe extern "C" fn mlxbar_affine_qmm_run(
    x: *const f32,
    x_len: i64,
    rows: i64,
    k: i64,
    packed: *const u32,
    packed_len: i64,
    scales: *const std::ffi::c_void,
    scales_len: i64,
    biases: *const std::ffi::c_void,
    biases_len: i64,
    scale_type: i32,
    n: i64,
    group_size: i32,
    bits: i32,
    strips: i32,
    prologue: i32,
    norm: *const f32,
    norm_len: i64,
    eps: f32,
    residual: *const f32,
    residual_len: i64,
    out: *mut f32,
    out_len: i64,
) {
    let run = || {
        let (rows, k, n) = (count(rows), count(k), count(n));
        let (gs, b) = (count(group_size.into()), count(bits.into()));
        assert!(supports(bits, group_size), "{bits} bits, groups of {group_size}");
        let prologue = match prologue {
            PROLOGUE_RMS_NORM => Prologue::RmsNorm { weight: primitive_call::input(norm, norm_len, k, "norm"), eps },
            PROLOGUE_SWIGLU => Prologue::SwiGlu,
            _ => Prologue::None,
        };
        let residual = (!residual.is_null()).then(|| primitive_call::input(residual, residual_len, elems(&[rows, n]), "residual"));
        let fusion = Fusion { prologue, residual };
        let x = primitive_call::input(x, x_len, elems(&[rows, prologue.input_columns(k)]), "x");
        let out = primitive_call::output(out, out_len, elems(&[rows, n]), "out");
        let raw = ((packed, packed_len), (scales, scales_len), (biases, biases_len));
        let w = AnyWeights::from_raw(raw.0, raw.1, raw.2, scale_type, strips != 0, (n, k, gs, b));
        w.matmul(kernel(), x, rows, fusion, out);
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the quantized matmul kernel panicked");
        std::process::abort();
    }
}

/// The kernel this process uses (detected once).
pub fn kernel() -> Kernel {
    static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(Kernel::detect)
}

/// See [`super::quantized_is_faster`]: measured once per process for the portable kernel,
/// a decode-shaped product (`1 × 576` by `1536 × 576`, 4-bit) against float32 gemv.
pub fn faster_than_float32() -> bool {
    static FASTER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FASTER.get_or_init(|| {
        if kernel() != Kernel::Scalar {
            return true;
        }
        let (n, k, gs) = (1536usize, 576usize, 64usize);
        let packed: Vec<u32> = (0..n * k / 8).map(|i| (i as u32).wrapping_mul(2654435761)).collect();
        let scales = vec![0.01f32; n * k / gs];
        let w = Weights { packed: &packed, scales: &scales, biases: &scales, n, k, group_size: gs, bits: 4, strips: false };
        let dense = vec![0.01f32; n * k];
        let x = vec![0.5f32; k];
        let mut out = vec![0f32; n];
        let time = |f: &mut dyn FnMut()| {
            f();
            let t = std::time::Instant::now();
            for _ in 0..5 {
                f();
            }
            t.elapsed()
        };
        let quantized = time(&mut || matmul(kernel(), &x, 1, &w, Fusion::default(), &mut out));
        // SAFETY: `dense` is n × k, `x` has k elements and `out` n.
        let float32 = time(&mut || unsafe {
            super::gemv_forward::cblas_sgemv(101, 111, n as _, k as _, 1.0, dense.as_ptr(), k as _, x.as_ptr(), 1, 0.0, out.as_mut_ptr(), 1)
        });
        tracing::info!("portable quantized kernel {quantized:?} vs float32 gemv {float32:?} (5 decode-shaped products)");
        quantized < float32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each SIMD kernel this CPU runs against the scalar one on `w`, and each row of its
    /// answer against that row's product apart from the others ([`rows_elsewhere`]), bit
    /// for bit (a batched decode step gives each sequence what it would get alone).
    fn kernels_agree<S: Scale>(x: &[f32], rows: usize, w: &Weights<S>, what: &str) {
        let mut plain = vec![0f32; rows * w.n];
        matmul(Kernel::Scalar, x, rows, w, Fusion::default(), &mut plain);
        for &kernel in Kernel::available().iter().filter(|k| **k != Kernel::Scalar) {
            let mut simd = vec![0f32; rows * w.n];
            matmul(kernel, x, rows, w, Fusion::default(), &mut simd);
            for (i, (s, p)) in simd.iter().zip(&plain).enumerate() {
                assert!((s - p).abs() <= 1e-4 * p.abs().max(1.0), "{kernel:?} {what} [{i}]: {s} vs {p}");
            }
            let elsewhere = rows_elsewhere(kernel, x, rows, w, Fusion::default());
            let differ = elsewhere.iter().zip(&simd).position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(differ.is_none(), "{kernel:?} {what}: a row alone (or in another tile) differs from batched at {differ:?}");
        }
        // The same weights in strips, where the CPU has the kernel that reads them.
        if !Kernel::available().contains(&Kernel::Avx512Vnni) || !w.n.is_multiple_of(strips::STRIP) {
            return;
        }
        let (packed, scales, biases) = strips::repack(w.packed, w.scales, w.biases, (w.n, w.k, w.group_size, w.bits as usize));
        let ws = Weights { packed: &packed, scales: &scales, biases: &biases, strips: true, ..*w };
        let mut simd = vec![0f32; rows * w.n];
        matmul(Kernel::Avx512Vnni, x, rows, &ws, Fusion::default(), &mut simd);
        for (i, (s, p)) in simd.iter().zip(&plain).enumerate() {
            assert!((s - p).abs() <= 1e-4 * p.abs().max(1.0), "strips {what} [{i}]: {s} vs {p}");
        }
        let elsewhere = rows_elsewhere(Kernel::Avx512Vnni, x, rows, &ws, Fusion::default());
        let differ = elsewhere.iter().zip(&simd).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(differ.is_none(), "strips {what}: a row alone differs from batched at {differ:?}");
    }

    /// Each row of `x`'s product computed apart from the call's other rows: alone, or where
    /// the call runs on AMX's tiles (whose rows alone would take the VNNI kernel,
    /// [`Kernel::rows_independent`]), in a call of as many rows rotated by five: each row at
    /// another place in its tile (some in another tile) and in another task of the rows' split.
    fn rows_elsewhere<S: Scale>(kernel: Kernel, x: &[f32], rows: usize, w: &Weights<S>, fusion: Fusion) -> Vec<f32> {
        let (n, columns) = (w.n, fusion.prologue.input_columns(w.k));
        let mut out = vec![0f32; rows * n];
        if !kernel.tiles(rows) {
            for (row, o) in x.chunks_exact(columns).zip(out.chunks_exact_mut(n)) {
                matmul(kernel, row, 1, w, fusion, o);
            }
            return out;
        }
        let shift = 5 % rows;
        let rotated: Vec<f32> = x[shift * columns..].iter().chain(&x[..shift * columns]).copied().collect();
        let mut product = vec![0f32; rows * n];
        matmul(kernel, &rotated, rows, w, fusion, &mut product);
        // Row r of `rotated` is row (r + shift) % rows of x.
        for (r, o) in product.chunks_exact(n).enumerate() {
            out[(r + shift) % rows * n..][..n].copy_from_slice(o);
        }
        out
    }

    /// A fused prologue, applied by the pool's tasks to their own rows, gives each row what
    /// that row transformed beforehand and multiplied apart from the others
    /// ([`rows_elsewhere`]) gives, bit for bit, on rows enough for several tasks: the split,
    /// not the prologue's arithmetic, is under test here (that is held to MLX's own ops in
    /// tests/quantized_kernel.rs).
    #[test]
    fn fused_prologues_equal_their_transformed_input() {
        // Enough rows for several tasks, and for AMX's tiles where the CPU has them.
        let (rows, k, n, gs) = (21usize, 256usize, 37usize, 32usize);
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let packed: Vec<u32> = (0..n * k / 8).map(|_| next()).collect();
        let scales: Vec<f32> = (0..n * k / gs).map(|_| (next() % 1000) as f32 / 1e4).collect();
        let biases: Vec<f32> = (0..n * k / gs).map(|_| (next() % 1000) as f32 / 1e4 - 0.05).collect();
        let x: Vec<f32> = (0..rows * 2 * k).map(|_| (next() % 2001) as f32 / 500.0 - 2.0).collect();
        let norm: Vec<f32> = (0..k).map(|_| (next() % 1000) as f32 / 500.0).collect();
        let w = Weights { packed: &packed, scales: &scales, biases: &biases, n, k, group_size: gs, bits: 4, strips: false };
        let cases = [("SwiGLU", &x[..], Prologue::SwiGlu), ("RMS norm", &x[..rows * k], Prologue::RmsNorm { weight: &norm, eps: 1e-5 })];
        // Each row transformed before the product.
        let transformed = |input: &[f32], prologue: Prologue| -> Vec<f32> {
            let mut buf = vec![0f32; k];
            input.chunks_exact(prologue.input_columns(k)).flat_map(|row| prologue.row(row, &mut buf).to_vec()).collect()
        };
        for &kernel in Kernel::available() {
            for (what, input, prologue) in cases {
                let mut fused = vec![0f32; rows * n];
                matmul(kernel, input, rows, &w, Fusion { prologue, residual: None }, &mut fused);
                // Row by row (or rotated), so that no split of rows into tasks is shared with
                // the fused call.
                let plain = rows_elsewhere(kernel, &transformed(input, prologue), rows, &w, Fusion::default());
                let differ = fused.iter().zip(&plain).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(differ.is_none(), "{kernel:?} {what}: differs at {differ:?}");
            }
        }
    }

    /// Every kernel this CPU runs computes what the scalar one does (same integer sums;
    /// float summation order only), and the same for a row in any tile, on every supported
    /// format, float32, float16 and bfloat16 scales, and row counts that leave the tiles of
    /// 4 and 8 every remainder, and AMX's tiles of 16 several; with 16 rows or more, enough
    /// columns for tasks of several 16-column strips and a part strip.
    #[test]
    fn every_kernel_equals_scalar() {
        eprintln!("kernels checked against scalar: {:?}", Kernel::available());
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for bits in [4u32, 8] {
            for gs in [32usize, 64, 128] {
                // 4-bit blocks go by quads, then a last pair, then an odd last block: 96 =
                // three blocks (a pair and a block), 160 a quad and a block, 192 a quad and
                // a pair, 352 and 576 = 11 and 18 groups of 32: quads, a pair and a block,
                // and the bias sums' eight-group body and their tail.
                let shapes = [
                    (1usize, 256usize),
                    (2, 256),
                    (3, 96),
                    (4, 256),
                    (5, 256),
                    (8, 128),
                    (9, 96),
                    (1, 96),
                    (17, 128),
                    (3, 352),
                    (9, 576),
                    (2, 160),
                    (6, 192),
                    (1, 384),
                    (11, 448),
                    (7, 256),
                    (15, 192),
                    // AMX's tiles: one whole, one and one row, two and a part, three and
                    // fifteen rows; several groups of 128.
                    (16, 96),
                    (33, 576),
                    (17, 256),
                    (63, 384),
                ];
                for (rows, k) in shapes {
                    if k % gs != 0 {
                        continue;
                    }
                    // With 16 rows or more, 197 columns: tasks of two strips, and a last
                    // strip of five columns; every shape also 48 or 208 columns, for the
                    // weights in strips.
                    for n in if rows >= AMX_MIN_ROWS { [197, 208] } else { [37, 48] } {
                        let packed: Vec<u32> = (0..n * k * bits as usize / 32).map(|_| next()).collect();
                        let scales: Vec<f32> = (0..n * k / gs).map(|_| (next() % 1000) as f32 / 1e4).collect();
                        let biases: Vec<f32> = (0..n * k / gs).map(|_| (next() % 1000) as f32 / 1e4 - 0.05).collect();
                        let x: Vec<f32> = (0..rows * k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
                        let what = format!("bits {bits} gs {gs} rows {rows} columns {n}");
                        let w = Weights { packed: &packed, scales: &scales, biases: &biases, n, k, group_size: gs, bits, strips: false };
                        kernels_agree(&x, rows, &w, &format!("float32 scales, {what}"));
                        let half = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>();
                        let (scales, biases) = (half(&scales), half(&biases));
                        let w = Weights { packed: &packed, scales: &scales, biases: &biases, n, k, group_size: gs, bits, strips: false };
                        kernels_agree(&x, rows, &w, &format!("float16 scales, {what}"));
                        let brain = |v: &[half::f16]| v.iter().map(|x| half::bf16::from_f32(x.to_f32())).collect::<Vec<_>>();
                        let (scales, biases) = (brain(&scales), brain(&biases));
                        let w = Weights { packed: &packed, scales: &scales, biases: &biases, n, k, group_size: gs, bits, strips: false };
                        kernels_agree(&x, rows, &w, &format!("bfloat16 scales, {what}"));
                    }
                }
            }
        }
    }
}
