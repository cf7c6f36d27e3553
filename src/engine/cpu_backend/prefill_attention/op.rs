//! A prefill chunk's causal attention as an MLX op on `mlx_rs` arrays (primitive.cpp).
//! Safe wrapper over the raw C entry point.
use std::ffi::{c_char, c_int};

use anyhow::Result;
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use crate::engine::cpu_backend::primitive_call;

extern "C" {
    fn mlxbar_prefill_attention(
        res: *mut mlx_array,
        q: mlx_array,
        keys: mlx_array,
        values: mlx_array,
        scale: f32,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// See [`crate::engine::cpu_backend::prefill_attention`].
pub fn prefill_attention(q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
    // SAFETY: every handle is alive for the call.
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_prefill_attention(res, q.as_ptr(), keys.as_ptr(), values.as_ptr(), scale, stream, err, err_len)
        })
    }
}
