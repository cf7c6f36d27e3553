//! Intel AMX's int8 tiles for products of many rows (a prefill chunk, a wide batch): one
//! `tdpbsud` multiplies 16 rows of int8 activations by 16 columns of unsigned weights over
//! a block of 32 values, 8,192 multiply-adds where AVX512-VNNI's `vpdpbusd` does 64. The
//! tiles hold a block's exact integer dot products; each block's float work (conversion,
//! the activation scale times the weight group's scale) then runs once per row and 16
//! columns on 512-bit registers, with the columns in the lanes.
//!
//! The weights stay packed in memory: a task unpacks its columns into tile layout
//! (`B[r][4c + t]` = column `c`'s value `4r + t` of the block), 16 columns a strip, once
//! per call; then each 16-row tile of `x`, read in order ([`super::activations::Layout`]),
//! meets every strip in turn. Fewer rows than [`super::AMX_MIN_ROWS`] go to the
//! AVX512-VNNI kernel: unpacking costs more than a few rows' products save.
//!
//! A row's result depends on that row alone within this kernel, but it is not the VNNI
//! kernel's bit for bit (another summation order), so on AMX machines a row computed in a
//! prefill and the same row decoded alone may differ in their last bits.
//!
//! Linux hands AMX's 8 KB of tile state to a process only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), made once in [`available`].
use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;

use super::activations::{Activations, Layout, BLOCK};
use super::{Out, Scale, Weights};

/// Rows and columns of a tile of results.
const TILE: usize = super::AMX_TILE;
/// Bytes of one block's weight tile: 8 rows of 16 columns × 4 values.
const B_TILE: usize = BLOCK * TILE;

/// Whether this CPU has AMX's int8 tiles and Linux granted the process their state (the
/// caller, `Kernel::probe`, asks only where the AVX-512 sets [`columns`] uses are present).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8 (std's detection of these
        // is not stable yet).
        // SAFETY: CPUID exists on every x86_64 CPU. (The intrinsic is a safe fn in current
        // Rust but unsafe in 1.89, the oldest Cargo.toml allows.)
        #[allow(unused_unsafe)]
        let edx = unsafe { __cpuid_count(7, 0) }.edx;
        if !(edx & (1 << 24) != 0 && edx & (1 << 25) != 0) {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with these arguments only changes which XSAVE features
            // the process may use; it reads and writes no memory of ours.
            let granted = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0;
            if !granted {
                tracing::info!("AMX present but not granted by the kernel; the AVX512-VNNI kernel runs instead");
            }
            granted
        }
        #[cfg(not(target_os = "linux"))]
        false
    })
}

/// `ldtilecfg`'s 64-byte operand (palette 1): tile 0 the results (16 × 16 int32), tile 1
/// 16 rows of a block of `x` (32 bytes each), tile 2 a block's weights (8 × 64 bytes).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn new() -> TileConfig {
        let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        (c.colsb[0], c.rows[0]) = (64, TILE as u8);
        (c.colsb[1], c.rows[1]) = (BLOCK as u16, TILE as u8);
        (c.colsb[2], c.rows[2]) = (64, (BLOCK / 4) as u8);
        c
    }
}

/// This thread's tiles, configured as [`TileConfig::new`] says until dropped.
struct TileState;

impl TileState {
    /// # Safety
    /// AMX is granted to the process ([`available`]).
    unsafe fn configure() -> TileState {
        let config = TileConfig::new();
        // SAFETY: the operand is a valid palette-1 configuration, 64 bytes; AMX is granted.
        asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
        TileState
    }
}

impl Drop for TileState {
    fn drop(&mut self) {
        // SAFETY: gives back this thread's tile state (configured in `configure`); no tile
        // is read after it.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// 16 × 16 int32, a tile's results as `tilestored` writes them.
#[repr(C, align(64))]
struct Results([i32; TILE * TILE]);

/// Output columns `columns` of every row (at least [`super::AMX_MIN_ROWS`]) on the tiles.
///
/// # Safety
/// [`available`] returned true and AVX2, FMA, F16C, AVX512F, AVX512VL and AVX512BW are
/// available (`Kernel::Amx` is listed only beside `Kernel::Avx512Vnni`); `a` holds `x` for
/// `w`'s `k` in [`Layout::Tiles`] (asserted); only this task writes `columns` of `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
pub unsafe fn columns<S: Scale>(w: &Weights<S>, a: &Activations, out: Out, columns: Range<usize>) {
    let (k, gs) = (w.k, w.group_size);
    let (blocks, groups) = (k / BLOCK, k / gs);
    assert_eq!(a.layout, Layout::Tiles, "activations for another kernel");
    let mut results = Results([0; TILE * TILE]);
    // Every strip of the task's columns unpacked first (columns × k bytes: tens of KB for
    // a layer's projection, a few MB for a large vocabulary's head), so that each 16-row
    // tile of x (k bytes a row, in L1) meets all of them in turn.
    let strips = columns.len().div_ceil(TILE);
    let mut b_tiles = vec![0u8; strips * blocks * B_TILE];
    let mut w_scale = vec![0f32; strips * blocks * TILE];
    let mut w_bias = vec![0f32; strips * groups * TILE];
    for s in 0..strips {
        let j0 = columns.start + s * TILE;
        let width = (columns.end - j0).min(TILE);
        unpack_strip(
            w,
            j0,
            width,
            &mut b_tiles[s * blocks * B_TILE..][..blocks * B_TILE],
            &mut w_scale[s * blocks * TILE..][..blocks * TILE],
            &mut w_bias[s * groups * TILE..][..groups * TILE],
        );
    }
    // The tiles are configured for the products only, and given back however this ends.
    let _tiles = TileState::configure();
    for m0 in (0..a.rows).step_by(TILE) {
        // The tile's 16 rows: the last tile's past `a.rows` are zero (Layout::Tiles pads).
        let (q, scale, sums) =
            (&a.q[m0 * k..][..TILE * k], &a.scale[m0 * blocks..][..TILE * blocks], &a.group_sum[m0 * groups..][..TILE * groups]);
        for s in 0..strips {
            let j0 = columns.start + s * TILE;
            let width = (columns.end - j0).min(TILE);
            let (b_tiles, w_scale, w_bias) = (&b_tiles[s * blocks * B_TILE..], &w_scale[s * blocks * TILE..], &w_bias[s * groups * TILE..]);
            let mut acc = [_mm512_setzero_ps(); TILE];
            for b in 0..blocks {
                // SAFETY: the tiles are configured (`_tiles`); tile 1 reads 16 rows of 32
                // bytes, `k` apart, from block b of the tile's first row: inside `q` (its
                // 16 rows of k); tile 2 reads block b's 512 bytes (8 rows of 64) of the
                // strip's `b_tiles`; tile 0 is stored to `results` (16 rows of 64 bytes).
                asm!(
                    "tilezero tmm0",
                    "tileloadd tmm1, [{x} + {k}*1]",
                    "tileloadd tmm2, [{w} + {row}*1]",
                    "tdpbsud tmm0, tmm1, tmm2",
                    "tilestored [{r} + {row}*1], tmm0",
                    x = in(reg) q.as_ptr().add(b * BLOCK),
                    k = in(reg) k,
                    w = in(reg) b_tiles.as_ptr().add(b * B_TILE),
                    row = in(reg) 64usize,
                    r = in(reg) results.0.as_mut_ptr(),
                    options(nostack),
                );
                let ws = _mm512_loadu_ps(w_scale.as_ptr().add(b * TILE));
                for (y, acc) in acc.iter_mut().enumerate() {
                    let d = _mm512_cvtepi32_ps(_mm512_load_si512(results.0.as_ptr().add(y * TILE) as *const __m512i));
                    *acc = _mm512_fmadd_ps(d, _mm512_mul_ps(ws, _mm512_set1_ps(*scale.get_unchecked(y * blocks + b))), *acc);
                }
            }
            // The groups' biases against the rounded x's sums.
            for g in 0..groups {
                let bias = _mm512_loadu_ps(w_bias.as_ptr().add(g * TILE));
                for (y, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(bias, _mm512_set1_ps(*sums.get_unchecked(y * groups + g)), *acc);
                }
            }
            let mut lanes = [0f32; TILE];
            for (y, acc) in acc.iter().enumerate().take((a.rows - m0).min(TILE)) {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
                for (c, v) in lanes[..width].iter().enumerate() {
                    // SAFETY: (m0 + y, j0 + c) is inside `out`; this task owns `columns`.
                    out.write(m0 + y, j0 + c, *v);
                }
            }
        }
    }
}

/// Columns `j0..j0 + width` of `w` in tile layout, block by block, with each block's group
/// scale and each group's bias per column, into zeroed buffers (columns past `width` stay
/// zero).
#[inline(always)]
unsafe fn unpack_strip<S: Scale>(w: &Weights<S>, j0: usize, width: usize, b_tiles: &mut [u8], w_scale: &mut [f32], w_bias: &mut [f32]) {
    let (k, gs) = (w.k, w.group_size);
    let (blocks, groups) = (k / BLOCK, k / gs);
    let group_shift = (gs / BLOCK).trailing_zeros();
    let bytes = w.packed.as_ptr() as *const u8;
    let low = _mm_set1_epi8(0x0F);
    for c in 0..width {
        let j = j0 + c;
        for b in 0..blocks {
            // The block's 32 values in order.
            let mut v = [0u8; BLOCK];
            if w.bits == 4 {
                let p = _mm_loadu_si128(bytes.add(j * k / 2 + b * 16) as *const __m128i);
                let (lo, hi) = (_mm_and_si128(p, low), _mm_and_si128(_mm_srli_epi16(p, 4), low));
                _mm_storeu_si128(v.as_mut_ptr() as *mut __m128i, _mm_unpacklo_epi8(lo, hi));
                _mm_storeu_si128(v.as_mut_ptr().add(16) as *mut __m128i, _mm_unpackhi_epi8(lo, hi));
            } else {
                v.copy_from_slice(std::slice::from_raw_parts(bytes.add(j * k + b * BLOCK), BLOCK));
            }
            let tile = &mut b_tiles[b * B_TILE..][..B_TILE];
            for r in 0..BLOCK / 4 {
                tile[r * 64 + c * 4..][..4].copy_from_slice(&v[r * 4..][..4]);
            }
            w_scale[b * TILE + c] = w.scales.get_unchecked(j * groups + (b >> group_shift)).to_f32_f16c();
        }
        for g in 0..groups {
            w_bias[g * TILE + c] = w.biases.get_unchecked(j * groups + g).to_f32_f16c();
        }
    }
}
