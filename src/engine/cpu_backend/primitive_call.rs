//! Calling mlxbar's C++ MLX primitives (the `extern "C"` entry points of
//! `*/primitive.cpp`): each fills a new array handle or returns 1 with the reason in an
//! error buffer (`mlxbar::guarded` in primitive.h). One place owns the handle and the
//! buffer, so every op's wrapper is only its arguments. The way back too: the kernels that
//! the primitives' CPU tasks call turn the buffers they are handed into slices here, checked
//! against the lengths the C++ side measured.
use std::ffi::{c_char, c_int, CStr};

use anyhow::{bail, Result};
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

/// A buffer and the number of elements it may be read (or written) for: `mlxbar::Dense`
/// in primitive.h; a null pointer for an absent input.
#[repr(C)]
pub struct Buffer<T> {
    pub ptr: *const T,
    pub len: i64,
}

impl<T> Buffer<T> {
    /// The first `need` elements ([`input`]).
    ///
    /// # Safety
    /// As [`input`]'s, for this buffer.
    pub unsafe fn input<'a>(&self, need: usize, what: &str) -> &'a [T] {
        input(self.ptr, self.len, need, what)
    }

    /// The first `need` elements, for writing ([`output`]).
    ///
    /// # Safety
    /// As [`output`]'s, for this buffer.
    pub unsafe fn output<'a>(&self, need: usize, what: &str) -> &'a mut [T] {
        output(self.ptr.cast_mut(), self.len, need, what)
    }

    /// [`Buffer::input`], None for an absent buffer (a null pointer).
    ///
    /// # Safety
    /// As [`Buffer::input`]'s.
    pub unsafe fn optional<'a>(&self, need: usize, what: &str) -> Option<&'a [T]> {
        (!self.ptr.is_null()).then(|| self.input(need, what))
    }
}

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

/// The first `need` elements of a buffer the C++ side handed over with its length (`len`,
/// measured there on the array: see `mlxbar::Dense` in primitive.h).
///
/// # Panics
/// When the buffer holds fewer than `need` elements (or is null while `need > 0`): the
/// shapes the kernel was given do not match the data, and nothing has been read yet.
///
/// # Safety
/// `ptr` is valid for reads of `len` elements of `T` for `'a` (what the C++ side states).
pub unsafe fn input<'a, T>(ptr: *const T, len: i64, need: usize, what: &str) -> &'a [T] {
    let have = usize::try_from(len).unwrap_or(0);
    assert!(need <= have && (need == 0 || !ptr.is_null()), "{what}: the kernel needs {need} elements, the buffer holds {len}");
    if need == 0 {
        return &[];
    }
    std::slice::from_raw_parts(ptr, need)
}

/// As [`input`], for the output buffer.
///
/// # Safety
/// `ptr` is valid for writes of `len` elements of `T` for `'a`, and nothing else uses them.
pub unsafe fn output<'a, T>(ptr: *mut T, len: i64, need: usize, what: &str) -> &'a mut [T] {
    let have = usize::try_from(len).unwrap_or(0);
    assert!(need <= have && (need == 0 || !ptr.is_null()), "{what}: the kernel writes {need} elements, the buffer holds {len}");
    if need == 0 {
        return &mut [];
    }
    std::slice::from_raw_parts_mut(ptr, need)
}

/// A dimension from the C++ side as a count.
///
/// # Panics
/// When it is negative.
pub fn count(v: i64) -> usize {
    usize::try_from(v).expect("a negative dimension")
}

/// The product of `dims`.
///
/// # Panics
/// On overflow (the dimensions come from another language; a wrapped product would make a
/// small slice look big enough).
pub fn elems(dims: &[usize]) -> usize {
    dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d)).expect("a buffer size overflows usize")
}
