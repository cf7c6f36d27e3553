//! A decode step's whole block as an MLX op on `mlx_rs` arrays (primitive.cpp). Safe
//! wrapper over the raw C entry point.
use std::ffi::{c_char, c_int};

use anyhow::Result;
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use crate::engine::cpu_backend::decode_attention::op::step_params;
use crate::engine::cpu_backend::decode_attention::StepParams;
use crate::engine::cpu_backend::{primitive_call, DecodeBlock};

extern "C" {
    fn mlxbar_decode_block(
        res: *mut mlx_array,
        h: mlx_array,
        keys: mlx_array,
        values: mlx_array,
        positions: mlx_array,
        attn_norm: mlx_array,
        mlp_norm: mlx_array,
        weights: *const mlx_array,
        bits: *const c_int,
        group_sizes: *const c_int,
        strips: *const c_int,
        periods: mlx_array,
        q_norm: mlx_array,
        k_norm: mlx_array,
        step: *const StepParams,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// See [`crate::engine::cpu_backend::decode_block`].
pub fn decode_block(b: &DecodeBlock) -> Result<Array> {
    let handle = |x: Option<&Array>| x.map_or_else(primitive_call::none, Array::as_ptr);
    let projections = [&b.qkv, &b.o, &b.gate_up, &b.down];
    let weights: Vec<mlx_array> = projections.iter().flat_map(|p| [p.weight.as_ptr(), p.scales.as_ptr(), p.biases.as_ptr()]).collect();
    let bits = projections.map(|p| p.bits);
    let group_sizes = projections.map(|p| p.group_size);
    let strips = projections.map(|p| c_int::from(p.strips));
    let a = &b.attention;
    // SAFETY: every handle is alive for the call (an empty one owns nothing), the three
    // arrays hold twelve handles and four of each format field; the cache buffers are written by the
    // op's task only, which the op's C++ side checks they allow.
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_decode_block(
                res,
                b.h.as_ptr(),
                a.keys.as_ptr(),
                a.values.as_ptr(),
                a.positions.as_ptr(),
                b.attn_norm.as_ptr(),
                b.mlp_norm.as_ptr(),
                weights.as_ptr(),
                bits.as_ptr(),
                group_sizes.as_ptr(),
                strips.as_ptr(),
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
