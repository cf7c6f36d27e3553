//! What MLX's CPU backend needs from us, per platform.
//!
//! Linux: MLX calls `cblas_sgemm` for every float32 matmul, and Debian's OpenBLAS is slow
//! at decode shapes, so the executable exports its own `cblas_sgemm` ([`gemv_forward`])
//! that sends 1-row calls to gemv and 2-16-row calls to [`small_m`]. MLX's CPU kernel for
//! affine-quantized weights is naive and single-threaded, so quantized projections run
//! [`affine_qmm`] instead, an MLX primitive of our own; a decode step's attention is one
//! op of ours too ([`decode_attention`]: norms, RoPE, the cache write and attention, where
//! MLX's composed ops make about twenty a layer), as is a dense block's whole decode step
//! ([`decode_block`]: those five ops as one), and so is prefill's RoPE ([`rope`]: one
//! op where the fallback makes about 28), and a prefill chunk's attention
//! ([`prefill_attention`]: MLX's fallback materializes the scores and runs a scalar
//! `exp`). They split their work across the cores with [`pool`]. macOS runs Metal as MLX
//! ships it: nothing to do, and none of these kernels.
#[cfg(target_os = "linux")]
pub mod affine_qmm;
#[cfg(target_os = "linux")]
pub mod decode_attention;
#[cfg(target_os = "linux")]
pub mod decode_block;
#[cfg(target_os = "linux")]
pub mod gemv_forward;
#[cfg(target_os = "linux")]
pub mod huge_pages;
#[cfg(target_os = "linux")]
pub mod pool;
#[cfg(target_os = "linux")]
pub mod prefill_attention;
#[cfg(target_os = "linux")]
mod primitive_call;
#[cfg(target_os = "linux")]
pub mod rope;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub(crate) mod simd;
#[cfg(target_os = "linux")]
pub mod small_m;

use anyhow::Result;
use mlx_rs::Array;

/// Makes this platform's matmul routing active (call before MLX runs a matmul).
pub fn install() {
    #[cfg(target_os = "linux")]
    gemv_forward::install();
}

/// The CPU kernel for quantized weights of `bits` in groups of `group_size`, if this
/// platform has one (its name, for logs and `mlxbar doctor`).
pub fn quantized_kernel(bits: i32, group_size: i32) -> Option<&'static str> {
    #[cfg(target_os = "linux")]
    if affine_qmm::supports(bits, group_size) {
        return Some(affine_qmm::kernel().describe());
    }
    let _ = (bits, group_size);
    None
}

/// Rows `ids` of a packed affine-quantized table (`packed` `[vocab, k·bits/32]`, `scales`
/// and `biases` `[vocab, k/group_size]` as stored) dequantized on the host, `[ids, k]`
/// float32, the values MLX's `dequantize` gives: for a step's embedding, where MLX's gather
/// and unpacking are ~40 ops, each a dispatch that costs more than this arithmetic. None
/// where [`quantized_kernel`] does not hold such a table (another platform, bits or group
/// size, a scale type other than float32, float16 and bfloat16, a layout not
/// row-contiguous); an error for an id outside the table. `strips`: the table is in
/// `affine_qmm::strips` (repacked at load for the kernel).
pub fn dequantize_rows(
    packed: &Array,
    scales: &Array,
    biases: &Array,
    (group_size, bits, strips): (i32, i32, bool),
    ids: &[u32],
) -> Result<Option<Array>> {
    #[cfg(target_os = "linux")]
    {
        fn rows<S: affine_qmm::Scale + mlx_rs::ArrayElement>(
            packed: &[u32],
            scales: &Array,
            biases: &Array,
            shape: [usize; 4],
            strips: bool,
            ids: &[u32],
        ) -> Result<Option<Array>> {
            let [n, k, group_size, bits] = shape;
            let (Ok(scales), Ok(biases)) = (scales.try_as_slice::<S>(), biases.try_as_slice::<S>()) else { return Ok(None) };
            anyhow::ensure!(k % group_size == 0, "{k} values a row, groups of {group_size}");
            anyhow::ensure!(
                packed.len() == n * k * bits / 32 && scales.len() == n * k / group_size && biases.len() == scales.len(),
                "a quantized table's parts disagree"
            );
            anyhow::ensure!(!strips || n.is_multiple_of(affine_qmm::strips::STRIP), "strips of 16 columns, not {n}");
            let w = affine_qmm::Weights { packed, scales, biases, n, k, group_size, bits: bits as u32, strips };
            let mut out = vec![0f32; ids.len() * k];
            for (&id, row) in ids.iter().zip(out.chunks_exact_mut(k)) {
                anyhow::ensure!((id as usize) < n, "token id {id} outside the vocabulary of {n}");
                w.dequantize_row(id as usize, row);
            }
            Ok(Some(Array::from_slice(&out, &[ids.len() as i32, k as i32])))
        }
        if !affine_qmm::supports(bits, group_size) || packed.ndim() != 2 {
            return Ok(None);
        }
        let Ok(words) = packed.try_as_slice::<u32>() else { return Ok(None) };
        let (n, k) = (packed.shape()[0] as usize, packed.shape()[1] as usize * 32 / bits as usize);
        let shape = [n, k, group_size as usize, bits as usize];
        match scales.dtype() {
            mlx_rs::Dtype::Float32 => rows::<f32>(words, scales, biases, shape, strips, ids),
            mlx_rs::Dtype::Float16 => rows::<half::f16>(words, scales, biases, shape, strips, ids),
            mlx_rs::Dtype::Bfloat16 => rows::<half::bf16>(words, scales, biases, shape, strips, ids),
            _ => Ok(None),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (packed, scales, biases, group_size, bits, strips, ids);
        Ok(None)
    }
}

/// A quantized weight's packed values, scales and biases (evaluated) as new arrays in strips of
/// sixteen columns, the layout the AVX512-VNNI kernel reads fastest (`affine_qmm::strips`;
/// same shapes and bytes, another order); None where that kernel does not run them (another
/// CPU or platform, columns not a multiple of 16, a scale type it does not take).
pub fn repack_in_strips(
    weight: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Option<(Array, Array, Array)>> {
    #[cfg(target_os = "linux")]
    {
        fn typed<S: affine_qmm::Scale + mlx_rs::ArrayElement>(
            words: &[u32],
            scales: &Array,
            biases: &Array,
            [n, k, group_size, bits]: [usize; 4],
        ) -> Result<Option<(Array, Array, Array)>> {
            let (Ok(s), Ok(b)) = (scales.try_as_slice::<S>(), biases.try_as_slice::<S>()) else { return Ok(None) };
            anyhow::ensure!(
                k.is_multiple_of(group_size) && words.len() == n * k * bits / 32 && s.len() == n * k / group_size && b.len() == s.len(),
                "a quantized weight's parts disagree"
            );
            let (w, s, b) = affine_qmm::strips::repack(words, s, b, (n, k, group_size, bits));
            // Through float32 and back: exact for every scale type (mlx-rs does not export
            // the bound that would build them from any element type generically).
            let floats = |v: &[S], like: &Array| -> Result<Array> {
                let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
                Ok(Array::from_slice(&wide, like.shape()).as_dtype(like.dtype())?)
            };
            let out = (Array::from_slice(&w, &[n as i32, (k * bits / 32) as i32]), floats(&s, scales)?, floats(&b, biases)?);
            mlx_rs::transforms::eval([&out.0, &out.1, &out.2])?;
            Ok(Some(out))
        }
        if weight.ndim() != 2 || !affine_qmm::strips::applies(bits, group_size, weight.shape()[0].into()) {
            return Ok(None);
        }
        let Ok(words) = weight.try_as_slice::<u32>() else { return Ok(None) };
        let shape = [weight.shape()[0] as usize, weight.shape()[1] as usize * 32 / bits as usize, group_size as usize, bits as usize];
        match scales.dtype() {
            mlx_rs::Dtype::Float32 => typed::<f32>(words, scales, biases, shape),
            mlx_rs::Dtype::Float16 => typed::<half::f16>(words, scales, biases, shape),
            mlx_rs::Dtype::Bfloat16 => typed::<half::bf16>(words, scales, biases, shape),
            _ => Ok(None),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (weight, scales, biases, group_size, bits);
        Ok(None)
    }
}

/// Moves the backing of `arrays`' buffers (a loaded model's weights, evaluated) onto huge
/// pages where the kernel allows ([`huge_pages`]): what a decode step streams then costs a
/// TLB miss per 2 MiB instead of per 4 KiB. Bytes moved, their total and the time it took;
/// None off Linux.
pub fn weights_on_huge_pages(arrays: &[&Array]) -> Option<(usize, usize, std::time::Duration)> {
    #[cfg(target_os = "linux")]
    {
        let p = huge_pages::place(arrays);
        Some((p.huge, p.total, p.took))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = arrays;
        None
    }
}

/// Whether [`quantized_kernel`] beats float32 weights with BLAS on this machine: the SIMD
/// kernel reads a quarter to an eighth of the bytes at the same arithmetic, the portable
/// one does not, so that one is measured against float32 once.
pub fn quantized_is_faster() -> bool {
    #[cfg(target_os = "linux")]
    {
        affine_qmm::faster_than_float32()
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Whether [`quantized_kernel`] gives a row the same result bit for bit whatever rows share
/// its call (not where AMX takes the wide products: see `affine_qmm::Kernel::rows_independent`).
pub fn quantized_rows_independent() -> bool {
    #[cfg(target_os = "linux")]
    {
        affine_qmm::kernel().rows_independent()
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// What the CPU kernel applies to its input before the product.
#[derive(Clone, Copy)]
pub enum Prologue<'a> {
    None,
    /// MLX's `fast::rms_norm(x, weight, eps)`.
    RmsNorm(&'a Array, f32),
    /// `x` is `[..., 2k]` = `[gate | up]`; the product takes `silu(gate) · up`.
    SwiGlu,
}

/// `prologue(x) · dequant(w)ᵀ (+ residual)` with the CPU kernel, as one MLX op; only
/// where [`quantized_kernel`] said so.
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul(
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
    #[cfg(target_os = "linux")]
    {
        affine_qmm::op::affine_qmm(x, w, scales, biases, group_size, bits, strips, prologue, residual)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (x, w, scales, biases, group_size, bits, strips, prologue, residual);
        anyhow::bail!("no CPU quantized kernel on this platform")
    }
}

/// Whether [`decode_attention`] runs here.
pub fn has_decode_attention() -> bool {
    cfg!(target_os = "linux")
}

/// One decode step's attention for a batch of rows ([`decode_attention`]).
pub struct DecodeAttention<'a> {
    /// The new tokens' q|k|v `[1, rows, (heads + 2·kv_heads)·head_dim]`: each row's q,
    /// then k, then v, as the fused projection gives them (before norms and RoPE; one op
    /// fewer a layer than splitting them first).
    pub qkv: &'a Array,
    pub step: AttentionStep<'a>,
}

/// What a decode step's attention needs besides q|k|v: the cache, the positions, the
/// norms and RoPE of q and k.
pub struct AttentionStep<'a> {
    /// The layer's cache buffers `[rows, kv_heads, capacity, head_dim]`, evaluated and
    /// dense: each row's k and v are written at its position, in place.
    pub keys: &'a Array,
    pub values: &'a Array,
    /// Each row's position (int32 `[rows]`).
    pub positions: &'a Array,
    pub heads: i32,
    /// Per-head RMS norms of q and k (`[head_dim]`), with their epsilon.
    pub q_norm: Option<&'a Array>,
    pub k_norm: Option<&'a Array>,
    pub eps: f32,
    pub rope: RopeParams,
    /// Per-pair periods replacing RoPE's base.
    pub periods: Option<&'a Array>,
    pub scale: f32,
}

/// A projection's arrays as MLX's affine quantization holds them (or in strips), for
/// [`decode_block`].
pub struct QuantizedArrays<'a> {
    pub weight: &'a Array,
    pub scales: &'a Array,
    pub biases: &'a Array,
    pub group_size: i32,
    pub bits: i32,
    /// In strips of 16 columns ([`repack_in_strips`]).
    pub strips: bool,
}

/// One decode step's whole dense block for a batch of rows ([`decode_block`]).
pub struct DecodeBlock<'a> {
    /// The block's input `[1, rows, hidden]`.
    pub h: &'a Array,
    /// The RMS norms before the attention and the MLP (`[hidden]`; epsilon the attention's).
    pub attn_norm: &'a Array,
    pub mlp_norm: &'a Array,
    /// q|k|v fused, o, gate|up fused (`[gate | up]`), down; each one [`quantized_kernel`]
    /// runs.
    pub qkv: QuantizedArrays<'a>,
    pub o: QuantizedArrays<'a>,
    pub gate_up: QuantizedArrays<'a>,
    pub down: QuantizedArrays<'a>,
    pub attention: AttentionStep<'a>,
}

/// `h' + down(silu(gate) · up)` of `rms_norm(h')`, `h' = h + o(attention)` of
/// `rms_norm(h)`'s q|k|v: a dense block's decode step as one op (`[1, rows, hidden]`), the
/// same work and bits as its five ops apart ([`decode_attention`] and four
/// [`quantized_matmul`]s). Only where [`has_decode_attention`].
pub fn decode_block(b: &DecodeBlock) -> Result<Array> {
    #[cfg(target_os = "linux")]
    {
        decode_block::op::decode_block(b)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        anyhow::bail!("no CPU decode block on this platform")
    }
}

/// Norms, RoPE, the cache write and attention of one decode step as one op: `[1, rows,
/// heads·head_dim]`, each row's query over its cache up to and including its position.
/// Only where [`has_decode_attention`].
pub fn decode_attention(a: &DecodeAttention) -> Result<Array> {
    #[cfg(target_os = "linux")]
    {
        decode_attention::op::decode_attention(a)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = a;
        anyhow::bail!("no CPU decode attention on this platform")
    }
}

/// A prefill chunk's causal attention (`[1, heads, len, head_dim]`): each query against the
/// keys and values `[1, kv_heads, keys, head_dim]` up to its own position (the last `len`
/// keys are the chunk's), what `fast::scaled_dot_product_attention` with the causal mask
/// gives, as one op. Only where [`has_decode_attention`].
pub fn prefill_attention(q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
    #[cfg(target_os = "linux")]
    {
        prefill_attention::op::prefill_attention(q, keys, values, scale)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (q, keys, values, scale);
        anyhow::bail!("no CPU prefill attention on this platform")
    }
}

/// Whether [`rope`] runs here.
pub fn has_rope() -> bool {
    cfg!(target_os = "linux")
}

/// RoPE parameters ([`rope`]); what `fast::rope` takes, plus LongRoPE's input scale.
#[derive(Clone, Copy)]
pub struct RopeParams {
    /// Leading dimensions of each head vector that rotate (even).
    pub dims: i32,
    pub traditional: bool,
    /// The base, used when no per-pair periods are given.
    pub base: f32,
    pub position_scale: f32,
    /// The rotated part is multiplied by it (1 when there is none).
    pub input_scale: f32,
}

/// `x` `[batch, heads, len, head_dim]` (float32) rotated as `fast::rope` rotates it, row b's
/// positions starting at `offsets[b]` (int32 `[batch]`, or `[1]` for every row); per-pair
/// `periods` `[dims/2]` replace the base when given. Only where [`has_rope`].
pub fn rope(x: &Array, offsets: &Array, periods: Option<&Array>, p: RopeParams) -> Result<Array> {
    #[cfg(target_os = "linux")]
    {
        rope::op::rope(x, offsets, periods, p)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (x, offsets, periods, p);
        anyhow::bail!("no CPU RoPE on this platform")
    }
}
