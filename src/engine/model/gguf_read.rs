//! mlxbar's own reader of GGUF tensors, for the files MLX's reader cannot take: those holding
//! MXFP4 (GGML type 39, gpt-oss's experts as llama.cpp converts them). MLX's bundled gguflib
//! has no entry for that type and silently returns no tensor from the first one on, and
//! llama.cpp's converter writes the experts first, so such a file is read here whole: each
//! tensor with one positional read of its byte range, turned into what MLX's reader makes of
//! the same type (float arrays; Q4_0/Q4_1/Q8_0 as affine-quantized triplets, group 32, float16
//! scales and biases) or, for MXFP4, MLX's own `mxfp4` mode, bit for bit. A model whose
//! experts stream from the file is read here too, all but the experts, which the expert
//! cache reads one at a time through [`convert`] (MLX's reader reads every tensor).
//!
//! GGML's 4-bit blocks hold element `j` in the low nibble of byte `j` and element `j + 16` in
//! its high nibble; MLX packs element `i` of a group at bits `4·(i mod 8)` of its `u32` words,
//! so byte `k` holds elements `2k` (low) and `2k + 1` (high): [`mlx_nibbles`] reorders one.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use half::f16;
use mlx_rs::{Array, Dtype};

use super::linear::Quantized;
use super::quantized::QuantSpec;
use super::validate::{GgufSummary, GgufTensorInfo};

/// One tensor as read: a plain array, or a quantized weight.
pub enum Tensor {
    Plain(Array),
    Quantized(Quantized),
}

/// Whether this reader reads tensors of GGML type `name`.
pub fn reads(name: &str) -> bool {
    matches!(name, "F32" | "F16" | "BF16" | "Q4_0" | "Q4_1" | "Q8_0" | "MXFP4")
}

/// Whether this file needs this reader (MLX's would drop its tensors).
pub fn needed(h: &GgufSummary) -> bool {
    h.tensor_infos.iter().any(|t| t.ggml_type.name == "MXFP4")
}

/// The tensors of the checked file `path` (its header `h`) whose names `keep` picks, by GGUF
/// name.
pub fn read_where(path: &Path, h: &GgufSummary, keep: &dyn Fn(&str) -> bool) -> Result<Vec<(String, Tensor)>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    h.tensor_infos
        .iter()
        .filter(|info| keep(&info.name))
        .map(|info| {
            let mut bytes = vec![0u8; info.bytes as usize];
            file.read_exact_at(&mut bytes, h.data_start + info.offset)
                .with_context(|| format!("reading tensor {} of {}", info.name, path.display()))?;
            let tensor = convert(info, &bytes).with_context(|| format!("GGUF tensor {}", info.name))?;
            Ok((info.name.clone(), tensor))
        })
        .collect()
}

/// One tensor's bytes as MLX holds it; shapes are GGML's dims reversed (rows last).
pub fn convert(info: &GgufTensorInfo, bytes: &[u8]) -> Result<Tensor> {
    let shape: Vec<i32> = info.dims.iter().rev().map(|&d| d as i32).collect();
    let plain = |values: Array| -> Result<Tensor> { Ok(Tensor::Plain(values.reshape(&shape)?)) };
    match info.ggml_type.name {
        "F32" => {
            let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            plain(Array::from_slice(&values, &[values.len() as i32]))
        }
        "F16" | "BF16" => {
            let bits: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes(b.try_into().unwrap())).collect();
            let dtype = if info.ggml_type.name == "F16" { Dtype::Float16 } else { Dtype::Bfloat16 };
            plain(Array::from_slice(&bits, &[bits.len() as i32]).view_dtype(dtype)?)
        }
        "Q4_0" | "Q4_1" | "Q8_0" | "MXFP4" => quantized(info, bytes, &shape).map(Tensor::Quantized),
        other => bail!(
            "is {other}, which mlxbar reads only through MLX's GGUF reader, and that reader cannot read a file holding \
             MXFP4 nor leave the experts of a streamed model unread: use a file whose tensors are F32, F16, BF16, Q8_0, \
             Q4_0, Q4_1 or MXFP4"
        ),
    }
}

/// A block-quantized tensor (32 elements a block) as MLX's quantized triplet.
fn quantized(info: &GgufTensorInfo, bytes: &[u8], shape: &[i32]) -> Result<Quantized> {
    let name = info.ggml_type.name;
    let block = info.ggml_type.bytes as usize;
    ensure!(bytes.len().is_multiple_of(block) && info.dims.first().is_some_and(|d| d % 32 == 0), "rows are not whole {name} blocks");
    let blocks = bytes.len() / block;
    let bits = if name == "Q8_0" { 8 } else { 4 };
    let mut packed = Vec::with_capacity(blocks * 4 * bits);
    let (mut scales, mut biases, mut exponents) = (Vec::new(), Vec::new(), Vec::new());
    for b in bytes.chunks_exact(block) {
        let half_at = |i: usize| f16::from_le_bytes([b[i], b[i + 1]]);
        match name {
            // d (f16), then 32 signed bytes: d·q = d·(q + 128) − 128·d.
            "Q8_0" => {
                let d = half_at(0);
                packed.extend(b[2..34].iter().map(|&q| (q as i8 as i16 + 128) as u8));
                scales.push(d);
                biases.push(f16::from_f32(-128.0 * d.to_f32()));
            }
            // d (f16), then 16 bytes of unsigned nibbles: d·q − 8·d.
            "Q4_0" => {
                let d = half_at(0);
                packed.extend(mlx_nibbles(b[2..18].try_into().unwrap()));
                scales.push(d);
                biases.push(f16::from_f32(-8.0 * d.to_f32()));
            }
            // d and m (f16), then the nibbles: d·q + m.
            "Q4_1" => {
                packed.extend(mlx_nibbles(b[4..20].try_into().unwrap()));
                scales.push(half_at(0));
                biases.push(half_at(2));
            }
            // An E8M0 exponent byte (MLX's mxfp4 scale as is), then E2M1 nibbles.
            _ => {
                exponents.push(b[0]);
                packed.extend(mlx_nibbles(b[1..17].try_into().unwrap()));
            }
        }
    }
    let rows = &shape[..shape.len() - 1];
    let with_last = |last: i32| [rows, &[last]].concat();
    let in_features = *shape.last().unwrap();
    let weight = Array::from_slice(&packed, &[packed.len() as i32])
        .view_dtype(Dtype::Uint32)?
        .reshape(&with_last(in_features * bits as i32 / 32))?;
    let group_shape = with_last(in_features / 32);
    let f16s = |v: &[f16]| -> Result<Array> {
        let raw: Vec<u16> = v.iter().map(|h| h.to_bits()).collect();
        Ok(Array::from_slice(&raw, &[raw.len() as i32]).view_dtype(Dtype::Float16)?.reshape(&group_shape)?)
    };
    if name == "MXFP4" {
        let scales = Array::from_slice(&exponents, &[exponents.len() as i32]).reshape(&group_shape)?;
        return Quantized::new(weight, scales, None, QuantSpec::MXFP4);
    }
    Quantized::new(weight, f16s(&scales)?, Some(f16s(&biases)?), QuantSpec::affine(32, bits as i32))
}

/// A GGML 4-bit block's 16 bytes (element j low in byte j, j+16 high) in MLX's order (byte k:
/// elements 2k low, 2k+1 high).
fn mlx_nibbles(qs: &[u8; 16]) -> [u8; 16] {
    let element = |j: usize| if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 };
    std::array::from_fn(|k| element(2 * k) | (element(2 * k + 1) << 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::validate::ggml_type;

    fn info(name: &'static str, id: u32, dims: Vec<u64>, bytes: usize) -> GgufTensorInfo {
        GgufTensorInfo { name: name.into(), dims, ggml_type: ggml_type(id).unwrap(), offset: 0, bytes: bytes as u64 }
    }

    fn floats(a: &Array) -> Vec<f32> {
        let a = a.as_dtype(Dtype::Float32).unwrap();
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn reorders_ggml_nibbles_into_mlx_order() {
        // Element j carries the value j mod 16: GGML puts 0..15 low and 16..31 (again 0..15) high.
        let qs: [u8; 16] = std::array::from_fn(|j| j as u8 | ((j as u8) << 4));
        let mlx = mlx_nibbles(&qs);
        for (k, byte) in mlx.iter().enumerate() {
            assert_eq!((byte & 0x0F, byte >> 4), (((2 * k) % 16) as u8, ((2 * k + 1) % 16) as u8), "byte {k}");
        }
    }

    /// The GGML dequantization formulas (ggml-quants.c's `dequantize_row_*`, and the
    /// `kvalues_mxfp4` table with its halved E8M0 scale), applied to a block by hand, against
    /// MLX's dequantization of what this file makes of it.
    #[test]
    fn every_block_type_dequantizes_as_ggml_does() {
        let qs: [u8; 16] = std::array::from_fn(|j| (j as u8 * 7) ^ 0x5A);
        let nibble = |j: usize| if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 } as i32;
        let d = f16::from_f32(0.375);
        let m = f16::from_f32(-1.25);
        let kvalues = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
        let signed: [i8; 32] = std::array::from_fn(|j| (j as i8).wrapping_mul(9).wrapping_sub(100));
        let cases: Vec<(&'static str, u32, Vec<u8>, Vec<f32>)> = vec![
            ("Q4_0", 2, [&d.to_le_bytes()[..], &qs].concat(), (0..32).map(|j| (nibble(j) - 8) as f32 * 0.375).collect()),
            ("Q4_1", 3, [&d.to_le_bytes()[..], &m.to_le_bytes(), &qs].concat(), (0..32).map(|j| nibble(j) as f32 * 0.375 - 1.25).collect()),
            ("Q8_0", 8, [&d.to_le_bytes()[..], &signed.map(|q| q as u8)].concat(), signed.iter().map(|&q| q as f32 * 0.375).collect()),
            // Exponent 125: ggml's half scale 2^(125-128) times the doubled table value.
            ("MXFP4", 39, [&[125u8][..], &qs].concat(), (0..32).map(|j| kvalues[nibble(j) as usize] as f32 / 8.0).collect()),
        ];
        for (name, id, block, want) in cases {
            // Two rows of one block each.
            let bytes = [block.clone(), block].concat();
            let Tensor::Quantized(q) = convert(&info(name, id, vec![32, 2], bytes.len()), &bytes).unwrap() else {
                panic!("{name}: not quantized")
            };
            let got = floats(&q.dequantize(Dtype::Float32).unwrap());
            assert_eq!(got, [want.clone(), want].concat(), "{name}");
        }
    }

    #[test]
    fn floats_keep_their_type_and_reverse_ggml_dims() {
        let values = [1.5f32, -2.0, 0.25, 8.0, 3.0, -0.5];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let Tensor::Plain(a) = convert(&info("F32", 0, vec![3, 2], 24), &f32_bytes).unwrap() else { panic!() };
        assert_eq!((a.shape(), floats(&a)), (&[2, 3][..], values.to_vec()));
        let f16_bytes: Vec<u8> = values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let Tensor::Plain(a) = convert(&info("F16", 1, vec![3, 2], 12), &f16_bytes).unwrap() else { panic!() };
        assert_eq!((a.dtype(), floats(&a)), (Dtype::Float16, values.to_vec()));
        let bf16_bytes: Vec<u8> = values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        let Tensor::Plain(a) = convert(&info("BF16", 30, vec![3, 2], 12), &bf16_bytes).unwrap() else { panic!() };
        assert_eq!((a.dtype(), floats(&a)), (Dtype::Bfloat16, values.to_vec()));
        let err = format!("{:#}", convert(&info("Q4_K", 12, vec![256], 144), &[0; 144]).err().unwrap());
        assert!(err.contains("Q4_K") && err.contains("MXFP4"), "{err}");
    }
}
