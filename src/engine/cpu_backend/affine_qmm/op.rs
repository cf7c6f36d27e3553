//! The kernel as an MLX op on `mlx_rs` arrays: one lazy graph node (primitive.cpp) that
//! evaluates on the current CPU stream. Safe wrapper over the raw C entry point.
use std::ffi::{c_char, c_int};

use anyhow::{bail, Result};
use mlx_rs::Array;
use mlx_sys::{mlx_array, mlx_stream};

use crate::engine::cpu_backend::{primitive_call, Prologue};

extern "C" {
    fn mlxbar_affine_qmm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        scales: mlx_array,
        biases: mlx_array,
        group_size: c_int,
        bits: c_int,
        strips: c_int,
        prologue: c_int,
        norm: mlx_array,
        eps: f32,
        residual: mlx_array,
        stream: mlx_stream,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// `prologue(x) · dequant(w)ᵀ (+ residual)` for MLX affine-quantized `w`
/// (`[n, k·bits/32]` uint32, `scales`/`biases` `[n, k/group_size]` of one type, float32,
/// float16 or bfloat16, evaluated; in [`super::strips`] where `strips`);
/// `x` float32 `[..., k]` (`[..., 2k]` for SwiGLU), `residual` the output's shape.
#[allow(clippy::too_many_arguments)]
pub fn affine_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    strips: bool,
    prologue: Prologue,
    residual: Option<&Array>,
) -> Result<Array> {
    if !super::supports(bits, group_size) {
        bail!("affine_qmm: {bits}-bit weights in groups of {group_size} are not supported");
    }
    let (code, norm, eps) = match prologue {
        Prologue::None => (super::PROLOGUE_NONE, None, 0.0),
        Prologue::RmsNorm(weight, eps) => (super::PROLOGUE_RMS_NORM, Some(weight), eps),
        Prologue::SwiGlu => (super::PROLOGUE_SWIGLU, None, 0.0),
    };
    let opt = |a: Option<&Array>| a.map_or_else(primitive_call::none, |a| a.as_ptr());
    // SAFETY: every handle is alive for the call (an empty one stands for no array).
    unsafe {
        primitive_call::new_array(|res, stream, err, err_len| {
            mlxbar_affine_qmm(
                res,
                x.as_ptr(),
                w.as_ptr(),
                scales.as_ptr(),
                biases.as_ptr(),
                group_size,
                bits,
                strips.into(),
                code,
                opt(norm),
                eps,
                opt(residual),
                stream,
                err,
                err_len,
            )
        })
    }
}
