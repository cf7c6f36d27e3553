//! A decode step's attention as an MLX op on `mlx_rs` arrays (primitive.cpp). Safe wrapper
//! over the raw C entry point.
use std::ffi::{c_char, c_int};

use anyhow::Result;
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use super::StepParams;
use crate::engine::cpu_backend::{primitive_call, AttentionStep, DecodeAttention};

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
        step: *const StepParams,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// See [`crate::engine::cpu_backend::decode_attention`].
pub fn decode_attention(a: &DecodeAttention) -> Result<Array> {
    let handle = |x: Option<&Array>| x.map_or_else(primitive_call::none, Array::as_ptr);
    let (qkv, a) = (a.qkv, &a.step);
    // SAFETY: every handle is alive for the call (an empty one owns nothing); the cache
    // buffers are written by the op's task only, which the op's C++ side checks they allow.
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_decode_attention(
                res,
                qkv.as_ptr(),
                a.keys.as_ptr(),
                a.values.as_ptr(),
                a.positions.as_ptr(),
                handle(a.periods),
                handle(a.q_norm),
                handle(a.k_norm),
                &step_params(a),
                stream,
                err,
                err_len,
            )
        })
    }
}

/// `a`'s constants as the primitives take them (the shapes left 0: the C++ side reads them
/// from the cache's).
pub(in crate::engine::cpu_backend) fn step_params(a: &AttentionStep) -> StepParams {
    let r = a.rope;
    StepParams {
        rows: 0,
        heads: a.heads.into(),
        kv_heads: 0,
        capacity: 0,
        head_dim: 0,
        rope_dims: r.dims.into(),
        traditional: r.traditional,
        base: r.base,
        position_scale: r.position_scale,
        input_scale: r.input_scale,
        eps: a.eps,
        scale: a.scale,
    }
}
