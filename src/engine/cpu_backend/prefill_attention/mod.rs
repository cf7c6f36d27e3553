//! A prefill chunk's attention on the CPU, as one MLX op (primitive.cpp): each new
//! position's query against the sequence's keys up to and including its own position
//! (causal, the cached prefix visible), softmax, then the values. MLX's CPU fallback for
//! `scaled_dot_product_attention` composes it from a score matrix materialized whole, a
//! `where` for the mask and a softmax whose `exp` runs one value at a time through libm
//! (the wheel is built for baseline x86-64): at a thousand prompt tokens that was over half
//! of prefill's time, more than every projection together (`perf`, 2-vCPU Xeon).
//!
//! Here a task takes four queries of one head: their scores against each key (one load of
//! the key for all four), the softmax with a vectorized `exp`, then the values weighted,
//! never more than four rows of scores at a time. Tasks are split across the cores
//! ([`super::pool`]). Float32; grouped query heads read their KV head. AVX2 + FMA on x86_64, chosen at
//! run time; a portable form elsewhere (and as the reference the SIMD one is tested
//! against).
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod op;

use super::primitive_call::{self, count, elems};

/// Queries of one head per task (their scores share each key's load).
pub const QUERIES: usize = 4;

/// The chunk's shapes.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub heads: usize,
    pub kv_heads: usize,
    /// New positions (queries).
    pub len: usize,
    /// Keys and values: the cached prefix and the new positions (`keys - len` cached).
    pub keys: usize,
    pub head_dim: usize,
}

/// `out[h, i]` = softmax(q[h, i] · kᵀ · scale) · v over keys `0..=keys - len + i` of head
/// `h`'s KV head. `q` and `out` are `[heads, len, head_dim]`, `k` and `v` `[kv_heads, keys,
/// head_dim]`.
///
/// # Panics
/// On inconsistent shapes (checked first).
pub fn attend(s: Shape, q: &[f32], k: &[f32], v: &[f32], scale: f32, out: &mut [f32]) {
    attend_with(simd(), s, q, k, v, scale, out)
}

/// Whether the SIMD form runs here.
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`attend`], the SIMD form or the portable one.
///
/// # Panics
/// As [`attend`], and when `simd` is asked for where it does not run.
pub fn attend_with(simd: bool, s: Shape, q: &[f32], k: &[f32], v: &[f32], scale: f32, out: &mut [f32]) {
    let hd = s.head_dim;
    assert!(s.kv_heads > 0 && s.heads.is_multiple_of(s.kv_heads) && hd > 0 && s.len <= s.keys);
    assert!(q.len() == s.heads * s.len * hd && out.len() == q.len());
    assert!(k.len() == s.kv_heads * s.keys * hd && v.len() == k.len());
    assert!(!simd || self::simd(), "the SIMD form needs AVX2 and FMA");
    let group = s.heads / s.kv_heads;
    let cached = s.keys - s.len;
    super::pool::for_each_row_chunk_mut(out, s.len * hd, QUERIES * hd, |h, b, o| {
        let kv = h / group;
        let (k, v) = (&k[kv * s.keys * hd..][..s.keys * hd], &v[kv * s.keys * hd..][..s.keys * hd]);
        let first = b * QUERIES;
        let n = o.len() / hd;
        // Row r sees keys 0..cached + first + r + 1.
        let seen: [usize; QUERIES] = std::array::from_fn(|r| cached + first + r.min(n - 1) + 1);
        let q = &q[(h * s.len + first) * hd..][..n * hd];
        queries(simd, q, n, k, v, &seen, hd, scale, o);
    });
}

/// Up to [`QUERIES`] queries against keys and values: row `r` of `q` (`n` rows of `hd`)
/// attends over the first `seen[r]` rows of `k` and `v`; the results go to `o` (`n` rows).
/// Shared with [`super::decode_attention`], whose queries are a KV head's group.
///
/// # Panics
/// When `simd` is asked for where it does not run, or on shapes that do not fit.
#[allow(clippy::too_many_arguments)]
pub(super) fn queries(
    simd: bool,
    q: &[f32],
    n: usize,
    k: &[f32],
    v: &[f32],
    seen: &[usize; QUERIES],
    hd: usize,
    scale: f32,
    o: &mut [f32],
) {
    assert!((1..=QUERIES).contains(&n) && q.len() == n * hd && o.len() == n * hd);
    assert!(seen[..n].iter().all(|&t| t >= 1 && t * hd <= k.len() && t <= seen[n - 1]) && v.len() == k.len());
    assert!(!simd || self::simd(), "the SIMD form needs AVX2 and FMA");
    let mut p = vec![0f32; QUERIES * seen[n - 1]];
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected (asserted above); the slices have the shapes the
        // block reads (checked above).
        true => unsafe {
            match n {
                1 => avx2::block::<1>(q, k, v, seen, hd, scale, &mut p, o),
                2 => avx2::block::<2>(q, k, v, seen, hd, scale, &mut p, o),
                3 => avx2::block::<3>(q, k, v, seen, hd, scale, &mut p, o),
                _ => avx2::block::<QUERIES>(q, k, v, seen, hd, scale, &mut p, o),
            }
        },
        _ => portable_block(q, n, k, v, seen, hd, scale, &mut p, o),
    }
}

/// One task's queries (`n` rows of `q`, the rows' key counts in `seen`): scores into `p`
/// (`QUERIES × seen[n - 1]`, row-major), softmax, the weighted values into `o`.
#[allow(clippy::too_many_arguments)]
fn portable_block(q: &[f32], n: usize, k: &[f32], v: &[f32], seen: &[usize; QUERIES], hd: usize, scale: f32, p: &mut [f32], o: &mut [f32]) {
    let width = seen[n - 1];
    for r in 0..n {
        let row = &mut p[r * width..][..seen[r]];
        for (t, s) in row.iter_mut().enumerate() {
            *s = q[r * hd..][..hd].iter().zip(&k[t * hd..][..hd]).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut total = 0f32;
        for s in row.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        let out = &mut o[r * hd..][..hd];
        out.fill(0.0);
        for (t, &w) in row.iter().enumerate() {
            for (acc, x) in out.iter_mut().zip(&v[t * hd..][..hd]) {
                *acc += w * x;
            }
        }
        out.iter_mut().for_each(|x| *x /= total);
    }
}

/// The op's shapes and constant as primitive.cpp passes them (`Params` there).
#[repr(C)]
pub struct Params {
    pub heads: i64,
    pub kv_heads: i64,
    pub len: i64,
    pub keys: i64,
    pub head_dim: i64,
    pub scale: f32,
}

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays, each
/// pointer with the number of elements its buffer holds.
///
/// # Safety
/// Each pointer is valid for reads (`out`: writes) of the stated number of elements, for
/// the call, and nothing else writes them meanwhile. Shapes are not trusted: every slice is
/// checked against its buffer's length first ([`primitive_call::input`]).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxbar_prefill_attention_run(
    p: &Params,
    q: *const f32,
    q_len: i64,
    k: *const f32,
    k_len: i64,
    v: *const f32,
    v_len: i64,
    out: *mut f32,
    out_len: i64,
) {
    let run = || {
        let s = Shape {
            heads: count(p.heads),
            kv_heads: count(p.kv_heads),
            len: count(p.len),
            keys: count(p.keys),
            head_dim: count(p.head_dim),
        };
        let n = elems(&[s.heads, s.len, s.head_dim]);
        let nk = elems(&[s.kv_heads, s.keys, s.head_dim]);
        attend(
            s,
            primitive_call::input(q, q_len, n, "q"),
            primitive_call::input(k, k_len, nk, "keys"),
            primitive_call::input(v, v_len, nk, "values"),
            p.scale,
            primitive_call::output(out, out_len, n, "out"),
        );
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the prefill attention kernel panicked");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD form computes what the portable one does (float summation order and the
    /// `exp` polynomial's last bits apart), on chunks with and without a cached prefix,
    /// row counts that leave every remainder of a four-query block, and grouped heads.
    #[test]
    fn simd_equals_portable() {
        if !simd() {
            return;
        }
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) % 2001) as f32 / 1000.0 - 1.0
        };
        for (heads, kv_heads, len, cached, hd) in
            [(9, 3, 1, 0, 64), (9, 3, 7, 0, 64), (4, 4, 13, 5, 32), (2, 1, 6, 40, 72), (3, 1, 33, 2, 64)]
        {
            let s = Shape { heads, kv_heads, len, keys: len + cached, head_dim: hd };
            let q: Vec<f32> = (0..heads * len * hd).map(|_| next()).collect();
            let k: Vec<f32> = (0..kv_heads * s.keys * hd).map(|_| 2.0 * next()).collect();
            let v: Vec<f32> = (0..kv_heads * s.keys * hd).map(|_| next()).collect();
            let (mut fast, mut plain) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            attend_with(true, s, &q, &k, &v, 0.125, &mut fast);
            attend_with(false, s, &q, &k, &v, 0.125, &mut plain);
            for (i, (a, b)) in fast.iter().zip(&plain).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{s:?} [{i}]: {a} vs {b}");
            }
        }
    }
}
