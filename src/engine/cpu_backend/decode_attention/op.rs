//! A decode step's attention as an MLX op on `mlx_rs` arrays (primitive.cpp). Safe wrapper
//! over the raw C entry point.
use std::ffi::{c_char, c_int};

use anyhow::Result;
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use crate::engine::cpu_backend::{primitive_call, DecodeAttention};

extern "C" {
    fn mlxbar_decode_attention(
        res: *mut mlx_array,
        qkv: mlx_array,
        keys: mlx_array,
        values: mlx_array,
        positions: mlx_array,
        periods: mlx_array,
        q_norm: mlx_array,
        k_norm: mlx_array,
        heads: c_int,
        rope_dims: c_int,
        traditional: bool,
        base: f32,
        position_scale: f32,
        input_scale: f32,
        eps: f32,
        scale: f32,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// See [`crate::engine::cpu_backend::decode_attention`].
pub fn decode_attention(a: &DecodeAttention) -> Result<Array> {
    let handle = |x: Option<&Array>| x.map_or_else(primitive_call::none, Array::as_ptr);
    let r = a.rope;
    // SAFETY: every handle is alive for the call (an empty one owns nothing); the cache
    // buffers are written by the op's task only, which the op's C++ side checks they allow.
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_decode_attention(
                res,
                a.qkv.as_ptr(),
                a.keys.as_ptr(),
                a.values.as_ptr(),
                a.positions.as_ptr(),
                handle(a.periods),
                handle(a.q_norm),
                handle(a.k_norm),
                a.heads,
                r.dims,
                r.traditional,
                r.base,
                r.position_scale,
                r.input_scale,
                a.eps,
                a.scale,
                stream,
                err,
                err_len,
            )
        })
    }
}
