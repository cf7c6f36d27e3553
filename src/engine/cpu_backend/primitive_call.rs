//! Calling mlxbar's C++ MLX primitives (the `extern "C"` entry points of
//! `*/primitive.cpp`): each fills a new array handle or returns 1 with the reason in an
//! error buffer (`mlxbar::guarded` in primitive.h). One place owns the handle and the
//! buffer, so every op's wrapper is only its arguments.
use std::ffi::{c_char, c_int, CStr};

use anyhow::{bail, Result};
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

/// Runs `entry(result, stream, err, err_len)` on the current stream and owns its result.
///
/// # Safety
/// `entry` calls one primitive entry point with array handles that stay alive for the
/// call, passing the four arguments through.
pub unsafe fn new_array(entry: impl FnOnce(*mut mlx_array, mlx_stream, *mut c_char, usize) -> c_int) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    let mut err = [0 as c_char; 256];
    let mut res = mlx_sys::mlx_array_new();
    if entry(&mut res, stream.as_ptr(), err.as_mut_ptr(), err.len()) != 0 {
        mlx_sys::mlx_array_free(res);
        bail!("{}", CStr::from_ptr(err.as_ptr()).to_string_lossy());
    }
    Ok(Array::from_ptr(res))
}

/// An empty handle: the entry points read it as "no array".
pub fn none() -> mlx_array {
    // SAFETY: mlx_array_new makes an empty handle with no preconditions; it owns nothing.
    unsafe { mlx_sys::mlx_array_new() }
}
