//! Decode-step attention as an MLX op on `mlx_rs` arrays (primitive.cpp). Safe wrapper
//! over the raw C entry point.
use std::ffi::{c_char, c_int, CStr};

use anyhow::{bail, Result};
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

extern "C" {
    fn mlxbar_decode_attention(
        res: *mut mlx_array,
        q: mlx_array,
        keys: mlx_array,
        values: mlx_array,
        positions: mlx_array,
        scale: f32,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// `q` `[rows, heads, 1, head_dim]` against each row's `keys`/`values`
/// (`[rows, kv_heads, capacity, head_dim]`) up to and including `positions[row]`;
/// `[1, rows, heads·head_dim]`.
pub fn decode_attention(q: &Array, keys: &Array, values: &Array, positions: &Array, scale: f32) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    let mut err = [0 as c_char; 256];
    // SAFETY: every handle is alive for the call; on success `res` is a new array that the
    // returned Array owns, on failure it is freed here.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = mlxbar_decode_attention(
            &mut res,
            q.as_ptr(),
            keys.as_ptr(),
            values.as_ptr(),
            positions.as_ptr(),
            scale,
            stream.as_ptr(),
            err.as_mut_ptr(),
            err.len(),
        );
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            bail!("{}", CStr::from_ptr(err.as_ptr()).to_string_lossy());
        }
        Ok(Array::from_ptr(res))
    }
}
