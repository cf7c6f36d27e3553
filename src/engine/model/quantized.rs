//! MLX-quantized weights and the modes MLX packs them in: `affine` (`bits`-bit integers
//! with a float scale and bias per group: mlx-community's 4- and 8-bit models) and `mxfp4`
//! (OCP microscaling FP4: E2M1 values with one power-of-two E8M0 scale per 32 and no bias,
//! the format gpt-oss's experts ship in). MLX's quantized ops take the mode as a string;
//! mlx-rs 0.33 passes only "affine", so the ops are called through mlx-c here.
use std::ffi::{c_int, CStr};

use anyhow::{bail, ensure, Result};
use mlx_rs::{Array, Dtype};
use mlx_sys::mlx_array;

use crate::engine::cpu_backend::{self, Prologue};

/// How a weight's values are packed (MLX's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    Affine,
    Mxfp4,
}

impl QuantMode {
    /// A config.json's `mode` (mlx-lm's names); the modes MLX has and mlxbar does not run
    /// yet (nvfp4, mxfp8) are refused by name.
    pub fn parse(name: &str) -> Result<QuantMode> {
        Ok(match name {
            "affine" => QuantMode::Affine,
            "mxfp4" => QuantMode::Mxfp4,
            other => bail!("unsupported quantization mode '{other}' (supported: affine, mxfp4)"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
        }
    }

    fn c_name(self) -> &'static CStr {
        match self {
            QuantMode::Affine => c"affine",
            QuantMode::Mxfp4 => c"mxfp4",
        }
    }

    /// The mode of a packed weight whose scales are `scales_dtype`, as mlx-lm infers it for
    /// a module config.json does not name: only affine keeps its scales as floats, and the
    /// one floating-point mode mlxbar runs has 4 bits in groups of 32, so its weight row
    /// has 4 `u32` words for each scale. None when the scales are floats (affine, whose
    /// group size and bits config.json gives).
    pub fn infer(scales_dtype: Dtype, weight_cols: i32, scale_cols: i32) -> Result<Option<QuantSpec>> {
        if scales_dtype != Dtype::Uint8 {
            return Ok(None);
        }
        ensure!(
            weight_cols == 4 * scale_cols,
            "uint8 scales ({scale_cols} a row) beside {weight_cols} packed words a row: not mxfp4 (4 bits, groups of 32); \
             nvfp4 and mxfp8 are not supported"
        );
        Ok(Some(QuantSpec::MXFP4))
    }
}

/// How one weight is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
}

impl QuantSpec {
    /// The one floating-point mode mlxbar runs: E2M1 values in groups of 32, an E8M0 scale each.
    pub const MXFP4: QuantSpec = QuantSpec { group_size: 32, bits: 4, mode: QuantMode::Mxfp4 };

    pub fn affine(group_size: i32, bits: i32) -> QuantSpec {
        QuantSpec { group_size, bits, mode: QuantMode::Affine }
    }

    /// The group size and bits a mode fixes (mxfp4: 32, 4) must be what the config says.
    pub fn validate(self) -> Result<QuantSpec> {
        if self.mode == QuantMode::Mxfp4 {
            ensure!((self.group_size, self.bits) == (32, 4), "mxfp4 is 4 bits in groups of 32, not {} in {}", self.bits, self.group_size);
        }
        Ok(self)
    }
}

/// A weight as MLX quantizes it: `weight` `[..., out, in·bits/32]` (`u32`), `scales` one per
/// group, `biases` beside them in affine mode only.
#[derive(Clone)]
pub struct Quantized {
    pub weight: Array,
    pub scales: Array,
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
    /// Runs mlxbar's CPU kernel (`engine::cpu_backend::affine_qmm`) instead of MLX's
    /// `quantized_matmul`: set at assembly on the CPU device, affine, scales and biases
    /// as the file holds them (float16, bfloat16 or float32).
    pub cpu_kernel: bool,
    /// Packed in strips of sixteen columns for the CPU kernel ([`Quantized::into_strips`],
    /// after loading), not MLX's rows: only the CPU kernel reads it then.
    pub strips: bool,
}

impl Quantized {
    /// A weight, checked: affine has biases, mxfp4 has none.
    pub fn new(weight: Array, scales: Array, biases: Option<Array>, spec: QuantSpec) -> Result<Quantized> {
        let spec = spec.validate()?;
        ensure!(
            biases.is_some() == (spec.mode == QuantMode::Affine),
            "{} quantization {} biases",
            spec.mode.name(),
            if biases.is_some() { "has no" } else { "needs" }
        );
        Ok(Quantized {
            weight,
            scales,
            biases,
            group_size: spec.group_size,
            bits: spec.bits,
            mode: spec.mode,
            cpu_kernel: false,
            strips: false,
        })
    }

    pub fn spec(&self) -> QuantSpec {
        QuantSpec { group_size: self.group_size, bits: self.bits, mode: self.mode }
    }

    /// The CPU kernel's product, with what it fuses around it.
    pub(super) fn cpu_matmul(&self, x: &Array, prologue: Prologue, residual: Option<&Array>) -> Result<Array> {
        let Some(biases) = &self.biases else { bail!("the CPU kernel runs affine weights only") };
        cpu_backend::quantized_matmul(x, &self.weight, &self.scales, biases, self.group_size, self.bits, self.strips, prologue, residual)
    }

    /// The weight repacked in strips of sixteen columns where the CPU kernel reads those
    /// ([`cpu_backend::repack_in_strips`]: AVX512-VNNI without AMX, 4 or 8 bits), itself
    /// otherwise. Afterwards only the CPU kernel and the host embedding lookup read it
    /// (MLX's own ops on it are refused).
    pub fn into_strips(self) -> Result<Quantized> {
        let Some(biases) = self.biases.as_ref().filter(|_| self.cpu_kernel && !self.strips) else { return Ok(self) };
        match cpu_backend::repack_in_strips(&self.weight, &self.scales, biases, self.group_size, self.bits)? {
            Some((weight, scales, biases)) => Ok(Quantized { weight, scales, biases: Some(biases), strips: true, ..self }),
            None => Ok(self),
        }
    }

    /// Refuses a weight in strips, which only the CPU kernel reads.
    fn in_rows(&self, what: &str) -> Result<()> {
        ensure!(!self.strips, "{what}: the weight is packed in strips for the CPU kernel");
        Ok(())
    }

    /// `x @ dequantize(self).T` (MLX's `quantized_matmul`).
    pub fn matmul(&self, x: &Array) -> Result<Array> {
        self.in_rows("quantized_matmul")?;
        // SAFETY: every handle is alive for the call (borrowed from self and x; the empty
        // handle for absent biases is freed by `Handles`).
        unsafe {
            let none = Handles::none();
            call("quantized_matmul", |res, s| {
                mlx_sys::mlx_quantized_matmul(
                    res,
                    x.as_ptr(),
                    self.weight.as_ptr(),
                    self.scales.as_ptr(),
                    self.biases.as_ref().map_or(none.0, |b| b.as_ptr()),
                    true,
                    int(self.group_size),
                    int(self.bits),
                    self.mode.c_name().as_ptr(),
                    s,
                )
            })
        }
    }

    /// `x` through the stacked matrix each of `indices` names (MLX's `gather_qmm`, the
    /// weight transposed, `sorted` when `indices` ascend).
    pub fn gather(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        self.in_rows("gather_qmm")?;
        // SAFETY: as in `matmul`; `indices` is alive for the call.
        unsafe {
            let none = Handles::none();
            call("gather_qmm", |res, s| {
                mlx_sys::mlx_gather_qmm(
                    res,
                    x.as_ptr(),
                    self.weight.as_ptr(),
                    self.scales.as_ptr(),
                    self.biases.as_ref().map_or(none.0, |b| b.as_ptr()),
                    none.0,
                    indices.as_ptr(),
                    true,
                    int(self.group_size),
                    int(self.bits),
                    self.mode.c_name().as_ptr(),
                    sorted,
                    s,
                )
            })
        }
    }

    /// The float matrix, as `dtype`.
    pub fn dequantize(&self, dtype: Dtype) -> Result<Array> {
        self.in_rows("dequantize")?;
        // SAFETY: as in `matmul`.
        unsafe {
            let none = Handles::none();
            call("dequantize", |res, s| {
                mlx_sys::mlx_dequantize(
                    res,
                    self.weight.as_ptr(),
                    self.scales.as_ptr(),
                    self.biases.as_ref().map_or(none.0, |b| b.as_ptr()),
                    int(self.group_size),
                    int(self.bits),
                    self.mode.c_name().as_ptr(),
                    none.0,
                    mlx_sys::mlx_optional_dtype { value: dtype.into(), has_value: true },
                    s,
                )
            })
        }
    }

    /// The same weight with `f` applied to each array (scales and biases by `floats`, which
    /// an mxfp4 weight's `u8` scales skip).
    pub fn map(self, packed: impl Fn(Array) -> Result<Array>, floats: impl Fn(Array) -> Result<Array>) -> Result<Quantized> {
        self.in_rows("a transform of its arrays")?;
        let affine = self.mode == QuantMode::Affine;
        Ok(Quantized {
            weight: packed(self.weight)?,
            scales: if affine { floats(self.scales)? } else { packed(self.scales)? },
            biases: self.biases.map(floats).transpose()?,
            ..self
        })
    }

    /// Every part with `f` applied (row selections and reorders).
    pub fn map_all(self, f: impl Fn(Array) -> Result<Array>) -> Result<Quantized> {
        self.map(&f, &f)
    }

    pub fn nbytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    pub fn arrays(&self) -> Vec<&Array> {
        [Some(&self.weight), Some(&self.scales), self.biases.as_ref()].into_iter().flatten().collect()
    }
}

fn int(v: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int { value: v, has_value: true }
}

/// An empty array handle (mlx-c's "no array"), freed on drop.
struct Handles(mlx_array);

impl Handles {
    fn none() -> Handles {
        // SAFETY: mlx_array_new has no preconditions; the handle owns nothing.
        Handles(unsafe { mlx_sys::mlx_array_new() })
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: the handle came from mlx_array_new and is freed once, here.
        unsafe {
            mlx_sys::mlx_array_free(self.0);
        }
    }
}

/// Runs one mlx-c op on the current stream and owns its result.
///
/// # Safety
/// `op` passes the result pointer and stream to one mlx-c op whose array arguments stay
/// alive for the call.
unsafe fn call(what: &str, op: impl FnOnce(*mut mlx_array, mlx_sys::mlx_stream) -> c_int) -> Result<Array> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    let mut res = mlx_sys::mlx_array_new();
    if op(&mut res, stream.as_ptr()) != 0 {
        mlx_sys::mlx_array_free(res);
        bail!("MLX {what} failed (shapes or quantization do not match)");
    }
    Ok(Array::from_ptr(res))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_mxfp4_from_byte_scales_and_refuses_other_fp_modes() {
        assert_eq!(QuantMode::infer(Dtype::Float16, 360, 90).unwrap(), None);
        let mx = QuantMode::infer(Dtype::Uint8, 360, 90).unwrap().unwrap();
        assert_eq!((mx.group_size, mx.bits, mx.mode), (32, 4, QuantMode::Mxfp4));
        // nvfp4 (groups of 16): 2 words a scale.
        let err = format!("{:#}", QuantMode::infer(Dtype::Uint8, 360, 180).unwrap_err());
        assert!(err.contains("not mxfp4"), "{err}");
        assert!(QuantMode::parse("nvfp4").unwrap_err().to_string().contains("nvfp4"));
        assert!(QuantSpec { group_size: 64, bits: 4, mode: QuantMode::Mxfp4 }.validate().is_err());
    }

    /// MLX's own mxfp4 ops through this file's calls: the product and the gathered product
    /// equal matmuls on the dequantized matrix (same values, so the sums agree to rounding).
    #[test]
    fn mxfp4_ops_agree_with_the_dequantized_matrix() {
        let w = mlx_rs::random::normal::<f32>(&[2, 16, 64], None, None, None).unwrap();
        let q = quantize_mxfp4(&w);
        let dense = q.dequantize(Dtype::Float32).unwrap();
        assert_eq!(dense.shape(), &[2, 16, 64]);
        // E2M1 keeps at most 8 magnitudes per power of two: the values move, not by much.
        let err = dense.subtract(&w).unwrap().abs().unwrap().max(None).unwrap().item_exact::<f32>();
        assert!(err > 0.0 && err < 1.5, "{err}");
        let x = mlx_rs::random::normal::<f32>(&[3, 1, 64], None, None, None).unwrap();
        let idx = Array::from_slice(&[0u32, 1, 1], &[3, 1]);
        let got = q.gather(&x.reshape(&[3, 1, 1, 64]).unwrap(), &idx, false).unwrap().reshape(&[3, 16]).unwrap();
        let want = mlx_rs::ops::stack(
            &(0..3)
                .map(|i| {
                    let e = [0, 1, 1][i];
                    let row = x.take_axis(Array::from_int(i as i32), 0).unwrap();
                    mlx_rs::ops::matmul(&row, dense.take_axis(Array::from_int(e), 0).unwrap().t()).unwrap().reshape(&[16]).unwrap()
                })
                .collect::<Vec<_>>(),
            0,
        )
        .unwrap();
        let diff = got.subtract(&want).unwrap().abs().unwrap().max(None).unwrap().item_exact::<f32>();
        assert!(diff < 1e-4, "{diff}");
    }

    /// `w` mxfp4-quantized by MLX (`quantize` with the mode, through mlx-c).
    fn quantize_mxfp4(w: &Array) -> Quantized {
        // SAFETY: `w` is alive for the call; the vector result is owned and freed here.
        unsafe {
            let mut res = mlx_sys::mlx_vector_array_new();
            let none = Handles::none();
            let stream = mlx_rs::Stream::thread_local_or_default();
            let rc = mlx_sys::mlx_quantize(&mut res, w.as_ptr(), int(32), int(4), c"mxfp4".as_ptr(), none.0, stream.as_ptr());
            assert_eq!(rc, 0);
            let get = |i| {
                let mut a = mlx_sys::mlx_array_new();
                assert_eq!(mlx_sys::mlx_vector_array_get(&mut a, res, i), 0);
                Array::from_ptr(a)
            };
            let (weight, scales) = (get(0), get(1));
            mlx_sys::mlx_vector_array_free(res);
            assert_eq!(scales.dtype(), Dtype::Uint8);
            Quantized::new(weight, scales, None, QuantSpec::MXFP4).unwrap()
        }
    }
}
