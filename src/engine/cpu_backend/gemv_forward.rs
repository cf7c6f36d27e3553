//! Linux: decode-sized matmuls without OpenBLAS's packing.
//!
//! MLX's CPU backend runs every matmul as `cblas_sgemm`. Debian 12's OpenBLAS (0.3.21)
//! packs the weight matrix into a scratch buffer on every sgemm call, even when the other
//! side is a handful of rows, as it is when decoding: that copy is most of a decode step's
//! memory traffic. Single-row calls go to gemv (as OpenBLAS >= 0.3.27 does itself with
//! GEMM_GEMV_FORWARD); calls with 2-16 rows (a batched decode step) go to [`small_m`], which streams each weight row once for all rows. The
//! executable exports `cblas_sgemm` (see build.rs), so the dynamic linker binds libmlx.so's
//! calls here; other shapes go on to OpenBLAS's own sgemm.
use std::ffi::c_int;
use std::sync::OnceLock;

use super::small_m;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

type Sgemm =
    unsafe extern "C" fn(c_int, c_int, c_int, c_int, c_int, c_int, f32, *const f32, c_int, *const f32, c_int, f32, *mut f32, c_int);

extern "C" {
    pub fn cblas_sgemv(
        order: c_int,
        trans: c_int,
        m: c_int,
        n: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        x: *const f32,
        incx: c_int,
        beta: f32,
        y: *mut f32,
        incy: c_int,
    );
}

/// The next `cblas_sgemm` in symbol lookup order (OpenBLAS's).
fn next_sgemm() -> Sgemm {
    static NEXT: OnceLock<usize> = OnceLock::new();
    // SAFETY: dlsym with a NUL-terminated name has no other preconditions.
    let addr = *NEXT.get_or_init(|| unsafe { libc::dlsym(libc::RTLD_NEXT, c"cblas_sgemm".as_ptr()) as usize });
    assert!(addr != 0, "no BLAS provides cblas_sgemm");
    // SAFETY: a non-null `cblas_sgemm` symbol is a function with the CBLAS signature.
    unsafe { std::mem::transmute::<usize, Sgemm>(addr) }
}

/// # Safety
/// The CBLAS contract: pointers and leading dimensions describe valid matrices.
#[no_mangle]
pub unsafe extern "C" fn cblas_sgemm(
    order: c_int,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
) {
    if order == ROW_MAJOR && k > 0 {
        if m == 1 {
            // c[1,n] = a[1,k] . op(B)[k,n]: gemv over B.
            let incx = if trans_a == NO_TRANS { 1 } else { lda };
            let (t, rows, cols) = if trans_b == NO_TRANS { (TRANS, k, n) } else { (NO_TRANS, n, k) };
            // SAFETY: the same matrices the caller vouched for, as one gemv over B.
            return cblas_sgemv(ROW_MAJOR, t, rows, cols, alpha, b, ldb, a, incx, beta, c, 1);
        }
        if (2..=small_m::MAX_ROWS as c_int).contains(&m)
            && trans_a == NO_TRANS
            && trans_b == TRANS
            && alpha == 1.0
            && beta == 0.0
            && small_m::available()
        {
            // c[m,n] = a[m,k] . b[n,k]^T with b the weights ([out, in]), read once.
            // SAFETY: the caller's matrices, and AVX2+FMA were just checked.
            return small_m::matmul_bt(a, lda as usize, b, ldb as usize, c, ldc as usize, m as usize, n as usize, k as usize);
        }
        if n == 1 {
            // c[m,1] = op(A)[m,k] . b[k,1]: gemv over A.
            let incx = if trans_b == NO_TRANS { ldb } else { 1 };
            let (t, rows, cols) = if trans_a == NO_TRANS { (NO_TRANS, m, k) } else { (TRANS, k, m) };
            // SAFETY: the same matrices the caller vouched for, as one gemv over A.
            return cblas_sgemv(ROW_MAJOR, t, rows, cols, alpha, a, lda, b, incx, beta, c, ldc);
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to the BLAS's own sgemm.
    next_sgemm()(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// Keeps the symbol in the link (an rlib's unused items can be dropped).
pub fn install() {
    std::hint::black_box(cblas_sgemm as *const () as usize);
}
