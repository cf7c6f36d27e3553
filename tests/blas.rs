//! Linux: MLX's matmuls reach Debian's OpenBLAS (not the wheel's reference BLAS, ~18x
//! slower), and single-row matmuls forwarded to gemv, and few-row ones computed by our
//! small-m kernel, compute what sgemm does.
#![cfg(target_os = "linux")]

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{ops, random, Array, Device};

#[test]
fn sgemm_comes_from_openblas() {
    let provider = mlxbar::doctor::blas_provider().expect("cblas_sgemm is resolvable");
    // The executable's own forwarder wins lookup; the sgemm behind it must be OpenBLAS's.
    // SAFETY: a NUL-terminated symbol name.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"cblas_sgemm".as_ptr()) };
    // SAFETY: Dl_info is a plain C struct; all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is live; dladdr fills it.
    assert!(unsafe { libc::dladdr(next, &mut info) } != 0);
    // SAFETY: dladdr succeeded, so dli_fname is the linker's NUL-terminated library path.
    let next_lib = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    assert!(next_lib.contains("openblas"), "sgemm behind the forwarder: {next_lib} (provider {provider})");
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    ops::abs(a.subtract(b).unwrap()).unwrap().max(None).unwrap().item_exact::<f32>()
}

#[test]
fn single_row_matmuls_match_batched_ones() {
    Device::set_default(&Device::cpu());
    mlxbar::engine::cpu_backend::install();
    let r = |s: &[i32]| random::normal::<f32>(s, None, None, None).unwrap();
    let (k, n) = (576, 960);
    let w = r(&[k, n]);
    let wt = r(&[n, k]);
    let x2 = r(&[2, k]);
    let x1 = x2.take_axis(Array::from_int(0), 0).unwrap().reshape(&[1, k]).unwrap();
    let row0 = |a: Array| a.take_axis(Array::from_int(0), 0).unwrap().reshape(&[1, n]).unwrap();
    // m == 1: x @ W and x @ W^T (gemv) against the same row of a 2-row sgemm
    assert!(max_diff(&ops::matmul(&x1, &w).unwrap(), &row0(ops::matmul(&x2, &w).unwrap())) < 1e-3);
    assert!(max_diff(&ops::matmul(&x1, wt.t()).unwrap(), &row0(ops::matmul(&x2, wt.t()).unwrap())) < 1e-3);
    // n == 1: W^T @ x^T
    let col = ops::matmul(&wt, x1.t()).unwrap().reshape(&[1, n]).unwrap();
    assert!(max_diff(&col, &ops::matmul(&x1, wt.t()).unwrap()) < 1e-3);
}

#[test]
fn few_row_matmuls_from_the_small_m_kernel_match_openblas() {
    Device::set_default(&Device::cpu());
    mlxbar::engine::cpu_backend::install();
    let r = |s: &[i32]| random::normal::<f32>(s, None, None, None).unwrap();
    let (k, n) = (1536, 576 + 2 * 192);
    let w = r(&[n, k]); // [out, in], as the model holds weights
    let x = r(&[20, k]);
    // 20 rows go to OpenBLAS's sgemm; their first m rows through the small-m kernel.
    let blas = ops::matmul(&x, w.t()).unwrap();
    for m in [2, 3, 8, 16] {
        let few = ops::matmul(x.index(..m), w.t()).unwrap();
        assert!(max_diff(&few, &blas.index(..m)) < 1e-3, "{m} rows");
    }
}
