//! RoPE as an MLX op on `mlx_rs` arrays (primitive.cpp). Safe wrapper over the raw C entry
//! point.
use std::ffi::{c_char, c_int};

use anyhow::Result;
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use crate::engine::cpu_backend::primitive_call;
use crate::engine::cpu_backend::RopeParams;

extern "C" {
    fn mlxbar_rope(
        res: *mut mlx_array,
        x: mlx_array,
        offsets: mlx_array,
        periods: mlx_array,
        dims: c_int,
        traditional: bool,
        base: f32,
        position_scale: f32,
        input_scale: f32,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// `x` `[batch, heads, len, head_dim]` (float32) rotated, row b's positions starting at
/// `offsets[b]` (int32 `[batch]`, or `[1]` for all rows); per-pair `periods` `[dims/2]`
/// replace the base when given.
pub fn rope(x: &Array, offsets: &Array, periods: Option<&Array>, p: RopeParams) -> Result<Array> {
    // SAFETY: every handle is alive for the call (an empty one owns nothing).
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_rope(
                res,
                x.as_ptr(),
                offsets.as_ptr(),
                periods.map_or_else(primitive_call::none, |f| f.as_ptr()),
                p.dims,
                p.traditional,
                p.base,
                p.position_scale,
                p.input_scale,
                stream,
                err,
                err_len,
            )
        })
    }
}
